"""Synthetic text with repeated spans: the data on which `qkv train lm` grows induction heads.

The vocabulary is 256 made-up two-syllable words (`baka bala … goja`) plus `<bos>` (every
sequence starts with it) and `<unk>`. A sequence is random words in which, now and then, a
span of earlier words is copied again:

```text
<bos> bika doma feta bona gisa  dela ...  fora  doma feta bona gisa dela  bapa ...
               └──── span ────┘           └─── its copy ──┘
```

Outside copies, a word is drawn uniformly (unpredictable: ln 256 ≈ 5.55 nats) or, optionally
(`rule_prob`), given by a fixed rule from the word two back. The first word of a copy is
unpredictable (which earlier span is copied, and when, is random); every later word of a copy is
predictable *only* by looking back: find the previous occurrence of the current word and copy
the word after it. That is what an induction head does (Olsson et al., 2022), with a
previous-token head in an earlier layer. `LMBatch` marks those predictable positions, so
the loss on them can be watched falling at the phase change.

A batch is a pure function of (seed, step) — `--resume` replays exactly the batches an
uninterrupted run sees — and the validation batches of a seed never meet a training step's.

Examples:
    >>> b = get_batch(DataConfig(seq_len=12), batch_size=2, seed=0, step=0)
    >>> b.ids.shape, b.ids[0, 0].item() == BOS_ID          # (b, 1 + seq_len)
    (torch.Size([2, 13]), True)
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from qkv.training.copies import copy_sequence

BOS, UNK = "<bos>", "<unk>"
SPECIALS = (BOS, UNK)
BOS_ID, UNK_ID = 0, 1
# Two syllables each (16 × 16): distinct, pronounceable, one token each. 256 of them, so that a
# random word seldom occurs twice in a sequence by chance and "its earlier occurrence" (what an
# induction head looks for) is usually unique.
_FIRST = tuple(c + v for c in "bdfg" for v in "aeio")  # ba be bi bo da … go
_SECOND = tuple(c + "a" for c in "klmnprstvzbdfghj")  # ka la ma … ja
WORDS = tuple(a + b for a in _FIRST for b in _SECOND)  # baka bala … goja
VOCAB_SIZE = len(SPECIALS) + len(WORDS)  # 258
# The skip-bigram rule: a fixed permutation of the words (see DataConfig.rule_prob).
RULE = tuple(random.Random("qkv.lm rule").sample(range(len(WORDS)), len(WORDS)))


@dataclass(frozen=True)
class DataConfig:
    """How sequences are drawn (the defaults are the shipped model's data)."""

    seq_len: int = 64  # words after <bos>
    # After each random word, the chance that a copied span starts. At 1.0 (the shipped model)
    # a random word is followed at once by a copy when the sequence has enough words to copy:
    # most words are copies, and induction is what predicts them.
    copy_prob: float = 1.0
    # The chance that a new word is RULE[the word two back] instead of a uniform draw. It
    # rewards attending to the previous token on its own. Off by default: measured, it made
    # *every* head of the last layer a previous-token head within 300 steps, and those heads
    # did not become induction heads (2 and 3 layers, 900–1,700 steps).
    rule_prob: float = 0.0
    min_span: int = 4  # words per copied span, drawn uniformly from [min_span, max_span]
    max_span: int = 16


@dataclass(frozen=True)
class LMBatch:
    """Sequences for next-token prediction.

    Attributes:
        ids: (b, 1 + seq_len) word ids, `<bos>` first.
        predictable: (b, 1 + seq_len) True where the word is the second or later word of a
            copied span — predictable by induction from what came before.
    """

    ids: torch.Tensor
    predictable: torch.Tensor

    @property
    def num_tokens(self) -> int:
        return int(self.ids[:, 1:].numel())


def sample_sequence(rng: random.Random, cfg: DataConfig) -> tuple[list[int], list[bool]]:
    """One sequence (without `<bos>`): word ids and which are predictable by induction."""
    first = len(SPECIALS)

    def draw(ids: list[int]) -> int:  # a uniform word, or the rule's word of the one two back
        if len(ids) >= 2 and rng.random() < cfg.rule_prob:
            return first + RULE[ids[-2] - first]
        return first + rng.randrange(len(WORDS))

    return copy_sequence(rng, cfg.seq_len, draw, copy_prob=cfg.copy_prob, min_span=cfg.min_span,
                         max_span=cfg.max_span)


def _batch(rng: random.Random, cfg: DataConfig, batch_size: int) -> LMBatch:
    rows = [sample_sequence(rng, cfg) for _ in range(batch_size)]
    ids = torch.tensor([[BOS_ID] + r for r, _ in rows], dtype=torch.long)  # (b, 1 + seq_len)
    pred = torch.tensor([[False] + p for _, p in rows], dtype=torch.bool)
    return LMBatch(ids, pred)


def get_batch(cfg: DataConfig, *, batch_size: int, seed: int, step: int) -> LMBatch:
    """Training batch `step` of run `seed`: a pure function of (seed, step)."""
    return _batch(random.Random(f"train/{seed}/{step}"), cfg, batch_size)


def valid_batch(cfg: DataConfig, *, batch_size: int, seed: int) -> LMBatch:
    """The validation batch of run `seed` (its own random stream, not a training step's)."""
    return _batch(random.Random(f"valid/{seed}"), cfg, batch_size)


def text_of(ids: list[int] | torch.Tensor) -> str:
    """The words of `ids` (specials shown as `<bos>`), space-separated."""
    names = SPECIALS + WORDS
    return " ".join(names[int(i)] for i in ids)


def build_tokenizer():
    """The word-level `tokenizers.Tokenizer` of this vocabulary; it puts `<bos>` first.

    Saved as `tokenizer.json` beside the model, so `qkv.load` reads it like any other.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from tokenizers import decoders

    vocab = {token: i for i, token in enumerate(SPECIALS + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(list(SPECIALS))
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, BOS_ID)])
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    return tok
