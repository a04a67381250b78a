"""The corpus as tensors, and batches whose order is a pure function of (seed, step).

A batch never depends on what ran before it, only on the seed and the step number: resuming a
killed run at step k draws exactly the batches the uninterrupted run would have drawn.

```text
epoch e = ⌊step · B / N⌋ → permutation π_e = randperm(N, seed=(seed, e))
batch(step) = pairs π_e[i·B : (i+1)·B],  i = step mod (N // B)
```
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from qkv.translate.grammar import Pair, Splits, make_splits
from qkv.translate.vocab import BOS_ID, EOS_ID, PAD_ID, Vocab


@functools.lru_cache(maxsize=4)
def load_splits(seed: int = 0) -> Splits:
    """`grammar.make_splits(seed)` with the default sizes, computed once per process.

    Safe to cache: `Splits` is frozen and holds tuples of frozen
    pairs, so no caller can change what the next one gets.
    """
    return make_splits(seed=seed)


@dataclass(frozen=True)
class Batch:
    """One padded batch. src (b, s): English ids + [EOS]; tgt (b, t+1): [BOS] + French + [EOS].

    The decoder reads `tgt_in` = tgt[:, :-1] and learns to predict `tgt_out` = tgt[:, 1:].
    """

    src: torch.Tensor
    tgt: torch.Tensor

    @property
    def tgt_in(self) -> torch.Tensor:
        return self.tgt[:, :-1]  # (b, t)

    @property
    def tgt_out(self) -> torch.Tensor:
        return self.tgt[:, 1:]  # (b, t)

    @property
    def num_tokens(self) -> int:
        """Real (non-pad) tokens on both sides: what tokens/s counts."""
        return int((self.src != PAD_ID).sum() + (self.tgt_out != PAD_ID).sum())


def pad(rows: list[list[int]]) -> torch.Tensor:
    """Right-pad id lists with [PAD] into a (n, max_len) LongTensor."""
    width = max(len(r) for r in rows)
    out = np.full((len(rows), width), PAD_ID, dtype=np.int64)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return torch.from_numpy(out)


@dataclass(frozen=True)
class EncodedCorpus:
    """Every pair of a split, encoded once: src (N, S) and tgt (N, T) padded id tensors."""

    src: torch.Tensor
    tgt: torch.Tensor
    pairs: tuple[Pair, ...]

    def __len__(self) -> int:
        return len(self.pairs)

    def batch(self, index: torch.Tensor) -> Batch:
        """Rows `index`, trimmed to the longest sentence among them."""
        src, tgt = self.src[index], self.tgt[index]
        s = int((src != PAD_ID).sum(1).max())
        t = int((tgt != PAD_ID).sum(1).max())
        return Batch(src[:, :s], tgt[:, :t])


def encode_pairs(pairs: Sequence[Pair], vocab: Vocab) -> EncodedCorpus:
    """Tokenise every pair with `vocab` (ids end with [EOS]; French starts with [BOS])."""
    en = vocab.en.encode_batch([p.en for p in pairs], add_special_tokens=False)
    fr = vocab.fr.encode_batch([p.fr for p in pairs], add_special_tokens=False)
    src = pad([e.ids + [EOS_ID] for e in en])
    tgt = pad([[BOS_ID] + f.ids + [EOS_ID] for f in fr])
    return EncodedCorpus(src, tgt, tuple(pairs))


def batch_indices(n: int, batch_size: int, seed: int, step: int) -> torch.Tensor:
    """The corpus rows of batch `step`: a pure function of (n, batch_size, seed, step).

    Examples:
        >>> a = batch_indices(100, 8, seed=0, step=37)
        >>> bool((a == batch_indices(100, 8, seed=0, step=37)).all()), a.shape
        (True, torch.Size([8]))
    """
    if not 0 < batch_size <= n:
        raise ValueError(f"batch_size ({batch_size}) must be in 1..{n} (the corpus size)")
    per_epoch = n // batch_size  # the last partial batch of each epoch is dropped
    epoch, i = divmod(step, per_epoch)
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=g)[i * batch_size : (i + 1) * batch_size]


def get_batch(corpus: EncodedCorpus, batch_size: int, seed: int, step: int) -> Batch:
    """Training batch `step` of `corpus` (see `batch_indices`)."""
    return corpus.batch(batch_indices(len(corpus), batch_size, seed, step))


def iter_batches(corpus: EncodedCorpus, batch_size: int):
    """The corpus in order, in batches (evaluation)."""
    for start in range(0, len(corpus), batch_size):
        yield corpus.batch(torch.arange(start, min(start + batch_size, len(corpus))))
