"""The reader's tokenizer and batches: byte-level BPE trained on the corpus, random windows of the
token stream, and short copying sequences.

* `train_tokenizer` — a byte-level BPE (GPT-2's scheme: every byte is a token, so no text
  is unknown) learned from the training pages only, `<bos>` put first by its post-processor.
* `TokenStream` — the training pages' token ids end to end (a page closes with `\\n\\n`),
  and the held-out pages, each its own id list.
* `get_batch` — `batch_size` windows: `seq_len` English tokens at a random offset, or
  (`copy_prob`) as many tokens in *copying sequences* of `copy_len`: random tokens in which spans of
  earlier ones are written again (`qkv.training.copies.copy_sequence`, `qkv train lm`'s rule). Every
  token of a copy but its first is predictable only by looking back — find the current token's
  earlier occurrence and read what followed it, what induction heads do (Olsson et al. 2022).
  English repeats itself too (names, identifiers), but too seldom for induction heads to form within
  a CPU budget; its bigrams are what makes a previous-token head useful first. The first
  `copy_steps` draw their tokens from few ids (`copy_vocab`: each is seen often, so the
  heads form sooner), later copies from the whole vocabulary:

  ```text
  <bos> 17 203  88 140  56 │ 88 140  56 │ 9 │ 203  88 │ 31 …
               └─ span ─┘   └─ copy ─┘       └copy┘
  ```

A batch is a pure function of (seed, step), like `qkv train lm`'s.

Examples:
    >>> import tokenizers
    >>> tok = train_tokenizer(["the cat sat on the mat. " * 20], vocab_size=300)
    >>> stream = TokenStream.of(tok, ["the cat sat on the mat. " * 40], ["a mat."])
    >>> b = get_batch(stream, BatchConfig(16, 0.5, 2, 4, copy_len=8), batch_size=4, seed=0, step=0)
    >>> b.ids.shape[1], b.copies.shape[1], b.num_tokens    # (b, 1 + seq_len), (c, 1 + copy_len)
    (17, 9, 64)
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from qkv.errors import QkvError
from qkv.training.copies import copy_sequence

BOS = "<bos>"
BOS_ID = 0
PAGE_END = "\n\n"
MIN_VOCAB = 258  # <bos>, the 256 bytes and at least one merge


def train_tokenizer(pages: list[str], *, vocab_size: int):
    """A byte-level BPE `tokenizers.Tokenizer` with `vocab_size` tokens learned from `pages`.

    `<bos>` is id 0 and put before every encoded text; the 256 byte tokens are always in the
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

    Attributes:
        train: (n,) int64, every training page's ids (each page closed by `\\n\\n`), end to end.
        heldout: one (n_i,) int64 tensor per held-out page (its ids, no `<bos>`).
        vocab_size: the tokenizer's.
    """

    train: torch.Tensor
    heldout: list[torch.Tensor]
    vocab_size: int

    @classmethod
    def of(cls, tokenizer, train_pages: list[str], heldout_pages: list[str]) -> "TokenStream":
        """Encode the pages (`tokenizer`: a `tokenizers.Tokenizer`, its `<bos>` left out)."""
        enc = tokenizer.encode_batch([p + PAGE_END for p in train_pages], add_special_tokens=False)
        train = torch.tensor([i for e in enc for i in e.ids], dtype=torch.long)
        held = [torch.tensor(e.ids, dtype=torch.long) for e in
                tokenizer.encode_batch(heldout_pages, add_special_tokens=False)]
        return cls(train, [h for h in held if len(h)], tokenizer.get_vocab_size())


@dataclass(frozen=True)
class BatchConfig:
    """How training windows are drawn (`qkv.reader.train.ReaderTrainConfig.batches` holds
    the shipped reader's values)."""

    seq_len: int  # tokens after <bos>
    copy_prob: float  # the share of windows given to copying sequences instead of English
    min_span: int  # tokens per copied span, drawn uniformly from [min_span, max_span]
    max_span: int
    copy_len: int = 64  # tokens per copying sequence (after <bos>); seq_len // copy_len a window
    copy_vocab: int | None = None  # early copies' new tokens: ids 1 … copy_vocab − 1 (None: all)
    copy_steps: int = 0  # steps 0 … copy_steps − 1 draw copies from copy_vocab, later ones from all

    @property
    def copies_per_window(self) -> int:
        return max(self.seq_len // self.copy_len, 1)


@dataclass(frozen=True)
class ReaderBatch:
    """A step's text: English windows of the token stream and short copying sequences.

    Attributes:
        ids: (b, 1 + seq_len) English token ids, `<bos>` first (b may be 0).
        copies: (c, 1 + copy_len) copying sequences' ids, `<bos>` first (c may be 0).
        copied: (c, 1 + copy_len) True on the tokens that continue a copy (those only looking
            back predicts: `qkv.training.copies.copy_sequence`).
    """

    ids: torch.Tensor
    copies: torch.Tensor
    copied: torch.Tensor

    @property
    def num_tokens(self) -> int:
        return int(self.ids[:, 1:].numel() + self.copies[:, 1:].numel())


def copying_sequence(rng: random.Random, cfg: BatchConfig, high: int) -> tuple[list[int], list[bool]]:
    """One copying sequence of `cfg.copy_len` ids (without `<bos>`): random tokens of ids
    1 … `high` − 1 in which spans of earlier ones are written again, and which tokens continue a
    copy."""
    return copy_sequence(rng, cfg.copy_len, lambda ids: rng.randrange(BOS_ID + 1, high),  # never <bos>
                         copy_prob=1.0, min_span=cfg.min_span, max_span=cfg.max_span)


def get_batch(stream: TokenStream, cfg: BatchConfig, *, batch_size: int, seed: int, step: int) -> ReaderBatch:
    """Training batch `step` of run `seed`: a pure function of (stream, seed, step). Each of
    `batch_size` windows is English (`seq_len` tokens at a random offset) or, with chance
    `copy_prob`, `seq_len // copy_len` copying sequences — as many tokens, in short
    sequences (of ids below `copy_vocab` during the first `copy_steps`)."""
    n = cfg.seq_len
    if len(stream.train) < n:
        raise QkvError(f"the training text has {len(stream.train)} tokens, fewer than --seq-len {n}")
    rng = random.Random(f"reader/train/{seed}/{step}")
    early = step < cfg.copy_steps  # induction heads form on few token ids, then learn all of them
    high = min(cfg.copy_vocab or stream.vocab_size, stream.vocab_size) if early else stream.vocab_size
    english, copies = [], []
    for _ in range(batch_size):
        if rng.random() < cfg.copy_prob:
            copies += [copying_sequence(rng, cfg, high) for _ in range(cfg.copies_per_window)]
        else:
            start = rng.randrange(len(stream.train) - n + 1)
            english.append([BOS_ID] + stream.train[start:start + n].tolist())
    ids = torch.tensor(english, dtype=torch.long).reshape(len(english), 1 + n)  # (b, 1 + seq_len)
    seqs = torch.tensor([[BOS_ID] + r for r, _ in copies], dtype=torch.long)
    seqs = seqs.reshape(len(copies), 1 + cfg.copy_len)  # (c, 1 + copy_len)
    copied = torch.tensor([[False] + c for _, c in copies], dtype=torch.bool).reshape(seqs.shape)
    return ReaderBatch(ids, seqs, copied)


def heldout_windows(stream: TokenStream, *, seq_len: int, count: int) -> torch.Tensor:
    """(count', 1 + seq_len) `<bos>` + consecutive held-out windows (pages end to end), at
    most `count` of them, spread evenly: the validation batch watched during training."""
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
