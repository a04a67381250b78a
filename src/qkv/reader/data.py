"""The reader's tokenizer and batches: byte-level BPE trained on the corpus, random windows of the
token stream, some of them one segment repeated.

* :func:`train_tokenizer` — a byte-level BPE (GPT-2's scheme: every byte is a token, so no text
  is unknown) learned from the training pages only, ``<bos>`` put first by its post-processor.
* :class:`TokenStream` — the training pages' token ids end to end (a page closes with ``\\n\\n``),
  and the held-out pages, each its own id list.
* :func:`get_batch` — ``batch_size`` windows of ``seq_len`` tokens at random offsets, ``<bos>``
  first. Some windows are instead one *segment* of ``min_span … max_span`` tokens written again
  and again — English from the stream (``repeat_prob``) or tokens drawn at random from the
  vocabulary (``random_prob``, TransformerLens's repeated random tokens). After its first
  occurrence every token of a segment (but the first of each repeat) is predictable only by
  looking back: find the current token's earlier occurrence and read what followed it — what
  induction heads do (Olsson et al. 2022). English repeats itself too (names, identifiers), but
  too seldom for induction heads to form within the short CPU budget, and a repeated English
  segment is partly predictable without looking back; random tokens are not::

      <bos> the with statement ensures that │the with statement ensures that │the with …
            └──────── a segment ──────────┘ └──── its repeat ─────────────┘

A batch is a pure function of (seed, step), like ``qkv train lm``'s.

Example:
    >>> import tokenizers
    >>> tok = train_tokenizer(["the cat sat on the mat. " * 20], vocab_size=300)
    >>> stream = TokenStream.of(tok, ["the cat sat on the mat. " * 40], ["a mat."])
    >>> b = get_batch(stream, BatchConfig(16, 0.5, 0.25, 2, 4), batch_size=2, seed=0, step=0)
    >>> b.ids.shape, int(b.ids[0, 0]) == BOS_ID                    # (b, 1 + seq_len)
    (torch.Size([2, 17]), True)
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

import torch

from qkv.errors import QkvError

BOS = "<bos>"
BOS_ID = 0
PAGE_END = "\n\n"
MIN_VOCAB = 258  # <bos>, the 256 bytes and at least one merge


def train_tokenizer(pages: list[str], *, vocab_size: int):
    """A byte-level BPE ``tokenizers.Tokenizer`` with ``vocab_size`` tokens learned from ``pages``.

    ``<bos>`` is id 0 and put before every encoded text; the 256 byte tokens are always in the
    vocabulary, so any text encodes (no unknown token).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    if vocab_size < MIN_VOCAB:
        raise QkvError(f"--vocab-size must be at least 258 (<bos>, the 256 bytes and one merge), "
                       f"got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[BOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(pages, trainer)
    if tok.token_to_id(BOS) != BOS_ID:
        raise AssertionError("the trainer put <bos> elsewhere than id 0")
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A",
                                                       special_tokens=[(BOS, BOS_ID)])
    return tok


@dataclass(frozen=True)
class TokenStream:
    """The corpus as token ids.

    Fields:
        train: (n,) int64, every training page's ids (each page closed by ``\\n\\n``), end to end.
        heldout: one (n_i,) int64 tensor per held-out page (its ids, no ``<bos>``).
        vocab_size: the tokenizer's.
    """

    train: torch.Tensor
    heldout: list[torch.Tensor]
    vocab_size: int

    @classmethod
    def of(cls, tokenizer, train_pages: list[str], heldout_pages: list[str]) -> "TokenStream":
        """Encode the pages (``tokenizer``: a ``tokenizers.Tokenizer``, its ``<bos>`` left out)."""
        enc = tokenizer.encode_batch([p + PAGE_END for p in train_pages], add_special_tokens=False)
        train = torch.tensor([i for e in enc for i in e.ids], dtype=torch.long)
        held = [torch.tensor(e.ids, dtype=torch.long) for e in
                tokenizer.encode_batch(heldout_pages, add_special_tokens=False)]
        return cls(train, [h for h in held if len(h)], tokenizer.get_vocab_size())


@dataclass(frozen=True)
class BatchConfig:
    """How training windows are drawn (:attr:`qkv.reader.train.ReaderTrainConfig.batches` holds
    the shipped reader's values)."""

    seq_len: int  # tokens after <bos>
    repeat_prob: float  # the share of windows that are one English segment repeated
    random_prob: float  # … that are one segment of random tokens repeated
    min_span: int  # tokens per repeated segment, drawn uniformly from [min_span, max_span]
    max_span: int
    random_vocab: int | None = None  # random tokens are ids 1 … random_vocab − 1 (None: all)
    copy_steps: int = 0  # steps 0 … copy_steps − 1: every window is random tokens repeated


@dataclass(frozen=True)
class ReaderBatch:
    """Windows of the token stream.

    Fields:
        ids: (b, 1 + seq_len) token ids, ``<bos>`` first.
        copied: (b, 1 + seq_len) True on the tokens of a repeat but its first (those only
            looking back predicts).
    """

    ids: torch.Tensor
    copied: torch.Tensor

    @property
    def num_tokens(self) -> int:
        return int(self.ids[:, 1:].numel())


def sample_window(rng: random.Random, stream: torch.Tensor, cfg: BatchConfig,
                  vocab_size: int) -> tuple[list[int], list[bool]]:
    """One window of ``cfg.seq_len`` ids (without ``<bos>``) and which are predictable repeats."""
    n, u = cfg.seq_len, rng.random()
    if u >= cfg.random_prob + cfg.repeat_prob:
        start = rng.randrange(len(stream) - n + 1)
        return stream[start:start + n].tolist(), [False] * n
    span = rng.randint(cfg.min_span, cfg.max_span)
    if u < cfg.random_prob:
        high = min(cfg.random_vocab or vocab_size, vocab_size)
        segment = [rng.randrange(BOS_ID + 1, high) for _ in range(span)]  # never <bos>
    else:
        start = rng.randrange(len(stream) - span + 1)
        segment = stream[start:start + span].tolist()
    ids = (segment * (n // span + 1))[:n]
    return ids, [i > span for i in range(n)]  # position span starts a repeat: not predictable


def get_batch(stream: TokenStream, cfg: BatchConfig, *, batch_size: int, seed: int, step: int) -> ReaderBatch:
    """Training batch ``step`` of run ``seed``: a pure function of (stream, seed, step)."""
    if len(stream.train) < cfg.seq_len:
        raise QkvError(f"the training text has {len(stream.train)} tokens, fewer than --seq-len "
                       f"{cfg.seq_len}")
    rng = random.Random(f"reader/train/{seed}/{step}")
    if step < cfg.copy_steps:  # the copying phase: induction heads first, English after
        cfg = replace(cfg, repeat_prob=0.0, random_prob=1.0)
    rows = [sample_window(rng, stream.train, cfg, stream.vocab_size) for _ in range(batch_size)]
    ids = torch.tensor([[BOS_ID] + r for r, _ in rows], dtype=torch.long)  # (b, 1 + seq_len)
    copied = torch.tensor([[False] + c for _, c in rows], dtype=torch.bool)
    return ReaderBatch(ids, copied)


def heldout_windows(stream: TokenStream, *, seq_len: int, count: int) -> torch.Tensor:
    """(count', 1 + seq_len) ``<bos>`` + consecutive held-out windows (pages end to end), at
    most ``count`` of them, spread evenly: the validation batch watched during training."""
    text = torch.cat(stream.heldout)
    starts = range(0, len(text) - seq_len + 1, seq_len)
    if not starts:
        raise QkvError(f"the held-out text has {len(text)} tokens, fewer than --seq-len {seq_len}")
    picked = [starts[round(i * (len(starts) - 1) / max(count - 1, 1))] for i in range(min(count, len(starts)))]
    rows = [torch.cat([torch.tensor([BOS_ID]), text[s:s + seq_len]]) for s in picked]
    return torch.stack(rows)  # (count', 1 + seq_len)


def unigram_loss(stream: TokenStream) -> float:
    """Nats per token of a unigram model of the training ids (add-one smoothing over the
    vocabulary) on the held-out pages' ids — the baseline the reader must beat."""
    counts = torch.bincount(stream.train, minlength=stream.vocab_size).double() + 1.0
    logp = counts.log() - counts.sum().log()  # (V,)
    held = torch.cat(stream.heldout)
    return float(-logp[held].mean())
