"""How good a translation model is: exact match, BLEU, and how well each head aligns.

Alignment accuracy of a cross-attention head (layer l, head h): over the French tokens of a set
of pairs, the fraction whose most-attended English token is in the grammar's gold set for that
token (`Pair.alignment`). The attention read is the one of the decoder position that *produces*
the French token (its input is the previous token), in a teacher-forced pass over the gold
French. The English [EOS] counts as a position: attending most to it is a miss.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from qkv.errors import QkvError
from qkv.translate.model import TranslationModel
from qkv.translate.data import encode_pairs, iter_batches
from qkv.translate.grammar import Pair
from qkv.translate.vocab import Vocab


def exact_match(hypotheses: list[str], references: list[str]) -> float:
    """The fraction of hypotheses equal to their reference, character for character.

    Examples:
        >>> exact_match(["le chat", "la pomme"], ["le chat", "une pomme"])
        0.5
    """
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    if not references:
        return float("nan")
    return sum(h == r for h, r in zip(hypotheses, references)) / len(references)


def bleu(hypotheses: list[str], references: list[str]) -> float:
    """Corpus BLEU (sacrebleu, default 13a tokenisation), 0–100.

    Examples:
        >>> round(bleu(["le chat mange la pomme"], ["le chat mange la pomme"]), 1)
        100.0
    """
    try:
        import sacrebleu
    except ImportError:  # a test extra today; see the report to the lead
        raise QkvError("BLEU needs the sacrebleu package: pip install sacrebleu") from None
    if not references:
        return float("nan")
    return float(sacrebleu.corpus_bleu(hypotheses, [references]).score)


@dataclass(frozen=True)
class AlignmentScores:
    """Per-head alignment accuracy.

    Attributes:
        accuracy: (layers, heads) fraction of French tokens whose argmax English token is gold.
        tokens: how many French tokens were scored.
    """

    accuracy: torch.Tensor
    tokens: int

    def best(self) -> tuple[int, int, float]:
        """(layer, head, accuracy) of the best-aligned head."""
        flat = int(self.accuracy.argmax())
        layer, head = divmod(flat, self.accuracy.shape[1])
        return layer, head, float(self.accuracy[layer, head])


def gold_matrix(pair: Pair, s: int) -> torch.Tensor:
    """(t, s) bool: [j, i] is True when English token i is in French token j's gold set."""
    gold = torch.zeros(len(pair.fr_tokens), s, dtype=torch.bool)
    for j, i in pair.links:
        gold[j, i] = True
    return gold


@torch.no_grad()
def head_alignment(model: TranslationModel, vocab: Vocab, pairs: Sequence[Pair],
                   batch_size: int = 250, progress: Callable[[str, int, int], None] | None = None
                   ) -> AlignmentScores:
    """Alignment accuracy of every decoder cross-attention head on `pairs` (teacher-forced);
    `progress("aligning", done, len(pairs))` told after each batch."""
    corpus = encode_pairs(pairs, vocab)
    L, H = model.config.decoder_layers, model.config.num_heads
    hits = torch.zeros(L, H)
    total, start = 0, 0
    for batch in iter_batches(corpus, batch_size):
        _, trace = model.trace(batch.src, batch.tgt_in)  # only the decoder's attention is read
        traces = trace.decoder
        weights = torch.stack([t.cross_attn.attention.weights for t in traces])  # (L, b, H, t, s)
        top = weights.argmax(-1)  # (L, b, H, t)
        for row, pair in enumerate(pairs[start : start + batch.src.shape[0]]):
            n = len(pair.fr_tokens)  # decoder positions 0..n-1 produce the n French tokens
            gold = gold_matrix(pair, batch.src.shape[1])  # (n, s)
            picked = top[:, row, :, :n]  # (L, H, n)
            hits += gold[torch.arange(n), picked].sum(-1)
            total += n
        start += batch.src.shape[0]
        if progress is not None:
            progress("aligning", start, len(pairs))
    return AlignmentScores(hits / max(total, 1), total)
