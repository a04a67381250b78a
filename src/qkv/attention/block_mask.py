"""Block masks: which tiles of the (t × s) score matrix are full, partial or empty.

FlexAttention's interface (`torch.nn.attention.flex_attention`): a *mask_mod*
`mask_mod(b, h, q_idx, kv_idx) -> bool tensor` says whether query `q_idx` may use key
`kv_idx` (True = takes part, as everywhere in qkv).
[`create_block_mask`][qkv.attention.block_mask.create_block_mask] cuts the score matrix into
`block_size × block_size` tiles and records, for each, whether every entry takes part (**full**:
computed unmasked), some do (**partial**: computed, then masked) or none does (**empty**: skipped):

```text
sliding_window(2, 0), t = s = 8, block_size = 2        block kinds
    k0 k1 k2 k3 k4 k5 k6 k7                                kb0 kb1 kb2 kb3
q0   1  .  .  .  .  .  .  .                           qb0   ◩   ·   ·   ·
q1   1  1  .  .  .  .  .  .                           qb1   ◩   ◩   ·   ·
q2   1  1  1  .  .  .  .  .                           qb2   ·   ◩   ◩   ·
q3   .  1  1  1  .  .  .  .                           qb3   ·   ·   ◩   ◩
...                                                   ■ full  ◩ partial  · empty
```

The built-in masks ([`qkv.masks`][qkv.masks]: `causal`, `sliding_window`, `document`,
`prefix_lm`, `and_masks`, `or_masks`) classify their blocks *analytically*, from block
bounds alone, without evaluating a single (q, k) pair: O(number of blocks) work. A custom
`mask_mod` is evaluated one block row at a time — (B, H, block_size, s) booleans, never
(t × s) — and the booleans of its partial blocks are kept for the attention to use.

A block mask is built for one (B, H, t, s): used with other lengths, batch or heads it raises
`ValueError` (a silent wrong result is worse than an error).

Examples:
    >>> import qkv
    >>> bm = qkv.create_block_mask(qkv.masks.causal(), None, None, 8, 8, block_size=4)
    >>> print(bm.to_string())
    ◩ ·
    ■ ◩
    >>> bm.kinds[0, 0].tolist()
    [[1, 0], [2, 1]]
"""

from __future__ import annotations

import bisect
import inspect
import math
import os
import weakref
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

import torch

EMPTY, PARTIAL, FULL = 0, 1, 2
"""Block kinds, ordered so that AND of two masks is the `min` of their kinds and OR the `max`."""

ALIGNMENTS = ("top_left", "bottom_right")
"""Where the diagonal lies when t ≠ s: `p_i = i` (top-left, torch's `is_causal`) or
`p_i = i + s − t` (bottom-right, what a KV cache needs). Written here once; the mask algebra,
the argument checks and the built-ins read it."""


# -- mask mods ------------------------------------------------------------------------------------
class MaskMod:
    """A mask_mod that also knows its block kinds without evaluating (q, k) pairs.

    `mod(b, h, q_idx, kv_idx)` evaluates it on broadcasting index tensors (or Python ints, as
    FlexAttention passes them) and returns a bool tensor. `kinds` classifies blocks from
    their bounds. `bind` fixes what depends on the lengths (a bottom-right alignment).
    """

    batch: int | None = None   # B, when the mask differs per batch row (document ids per row)
    shift_invariant = False    # depends only on kv_idx − q_idx (the same tile all along a band)

    def __call__(self, b, h, q_idx, kv_idx) -> torch.Tensor:
        raise NotImplementedError

    def kinds(self, q_lo: torch.Tensor, q_hi: torch.Tensor, k_lo: torch.Tensor,
              k_hi: torch.Tensor) -> torch.Tensor:
        """(B', 1, nq, nk) int8 block kinds for query blocks [q_lo, q_hi) and key blocks [k_lo,
        k_hi) (global indices, `q_lo`/`q_hi` (nq,), `k_lo`/`k_hi` (nk,))."""
        raise NotImplementedError

    def bind(self, t: int, s: int) -> "MaskMod":
        """This mask for a (t × s) score matrix (resolves alignments); default: itself."""
        return self

    def __and__(self, other):
        return and_masks(self, other)

    def __or__(self, other):
        return or_masks(self, other)


def _index(x, device=None) -> torch.Tensor:
    return x if isinstance(x, torch.Tensor) else torch.tensor(x, device=device)


@dataclass(frozen=True, eq=False)
class Band(MaskMod):
    """Keys `p_i − left ≤ j ≤ p_i + right` with `p_i = i + offset` (None = unbounded side).

    `causal()` is `Band(None, 0)`; `sliding_window(left, right)` is `Band(left, right)`.
    `offset` is `s − t` for a bottom-right alignment, fixed by `bind`.
    """

    left: int | None
    right: int | None
    alignment: str = "top_left"
    offset: int | None = None
    shift_invariant = True

    def _offset(self) -> int:
        if self.offset is not None:
            return self.offset
        if self.alignment == "bottom_right":
            raise ValueError("a bottom-right aligned mask needs the lengths: use it through "
                             "create_block_mask (or call .bind(t, s) first)")
        return 0

    def bind(self, t: int, s: int) -> "Band":
        offset = s - t if self.alignment == "bottom_right" else 0
        return Band(self.left, self.right, self.alignment, offset)

    def __call__(self, b, h, q_idx, kv_idx):
        q_idx, kv_idx = _index(q_idx), _index(kv_idx)
        diff = kv_idx - (q_idx + self._offset())  # how far right of the diagonal
        keep = torch.ones_like(diff, dtype=torch.bool)
        if self.left is not None:
            keep = keep & (diff >= -self.left)
        if self.right is not None:
            keep = keep & (diff <= self.right)
        return keep

    def kinds(self, q_lo, q_hi, k_lo, k_hi):
        off = self._offset()
        dmin = k_lo[None, :] - (q_hi[:, None] - 1) - off  # (nq, nk) smallest kv − p in the block
        dmax = (k_hi[None, :] - 1) - q_lo[:, None] - off  # (nq, nk) largest
        full = torch.ones_like(dmin, dtype=torch.bool)
        empty = torch.zeros_like(full)
        if self.left is not None:
            full &= dmin >= -self.left
            empty |= dmax < -self.left
        if self.right is not None:
            full &= dmax <= self.right
            empty |= dmin > self.right
        return _kinds(full, empty)[None, None]  # (1, 1, nq, nk)


@dataclass(frozen=True, eq=False)
class KeysBelow(MaskMod):
    """Keys `kv_idx < n` take part (the prefix of [`prefix_lm`][qkv.attention.block_mask.prefix_lm])."""

    n: int

    def __call__(self, b, h, q_idx, kv_idx):
        return (_index(kv_idx) < self.n) & torch.ones_like(_index(q_idx), dtype=torch.bool)

    def kinds(self, q_lo, q_hi, k_lo, k_hi):
        full = (k_hi <= self.n)[None, :].expand(len(q_lo), -1)
        empty = (k_lo >= self.n)[None, :].expand(len(q_lo), -1)
        return _kinds(full, empty)[None, None]


def _check_lengths(what: str, have_q: int | None, have_k: int | None, t: int, s: int,
                   extent: tuple[int, int] | None) -> None:
    """A mask_mod's own lengths (document ids, a key padding row) against the (t × s) scores it
    is bound to: equal for a whole mask; inside the bound `extent` for a chunk of one (`t`,
    `s` then count the chunk's offset: `q_offset + Lq`). ValueError naming both lengths —
    a shorter row would raise an IndexError later, a longer one silently mean other tokens."""
    if extent is not None:
        if t > extent[0] or s > extent[1]:
            raise ValueError(f"the {what} were bound to {extent[0]} × {extent[1]} scores, but this "
                             f"mask reaches query {t - 1} and key {s - 1} (offset + length)")
        return
    for side, have, want in (("queries", have_q, t), ("keys", have_k, s)):
        if have is not None and have != want:
            raise ValueError(
                f"the {what} have length {have} but the mask has {want} {side} (Lq + q_offset = "
                f"{t}, Lk + k_offset = {s}); give one per token (for a chunk of a longer sequence, "
                f"bind the whole first: mask_mod.bind(length, length))")


def _block_min_max(ids: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor):
    """(..., n) ids → per block [lo, hi) their min and max, (..., nblocks) each, in O(n)."""
    n, size = ids.shape[-1], int((hi - lo).max())
    count = len(lo)
    start = int(lo[0])
    need = start + count * size
    pad = need - n
    x = ids[..., start:]
    if pad > 0:  # repeat the last id: it changes neither min nor max of the last block
        x = torch.cat([x, x[..., -1:].expand(*x.shape[:-1], pad)], dim=-1)
    x = x[..., : count * size].reshape(*x.shape[:-1], count, size)  # (..., nblocks, size)
    return x.amin(-1), x.amax(-1)


@dataclass(frozen=True, eq=False)
class Document(MaskMod):
    """Packed sequences: query i uses key j only when `ids[i] == ids[j]`.

    `ids` is (N,) or (B, N) integer — a document number per token, one row per batch row —
    and `kv_ids` the keys' when they differ from the queries'. Blocks are classified from each
    block's smallest and largest id: exact for sorted ids (packing), and never wrong otherwise
    (a block is called full only when all its ids are one document, empty only when the id
    ranges do not overlap).
    """

    ids: torch.Tensor
    kv_ids: torch.Tensor | None = None
    extent: tuple[int, int] | None = None  # the (t, s) bound to: a chunk must stay inside it

    @property
    def batch(self):
        return self.ids.shape[0] if self.ids.ndim == 2 else None

    def bind(self, t: int, s: int) -> "Document":
        n = self.ids.shape[-1]
        if self.kv_ids is None:  # one sequence's ids: queries and keys both index it
            _check_lengths("document ids", n if t >= s else None, n if s >= t else None, t, s,
                           self.extent)
        else:
            _check_lengths("document ids (ids, kv_ids)", n, self.kv_ids.shape[-1], t, s, self.extent)
        return self if self.extent is not None else replace(self, extent=(t, s))

    def _pick(self, ids, b, idx):
        if ids.ndim == 1:
            return ids[idx]
        return ids[_index(b, ids.device), idx]

    def __call__(self, b, h, q_idx, kv_idx):
        kv_ids = self.ids if self.kv_ids is None else self.kv_ids
        return self._pick(self.ids, b, _index(q_idx)) == self._pick(kv_ids, b, _index(kv_idx))

    def kinds(self, q_lo, q_hi, k_lo, k_hi):
        kv_ids = self.ids if self.kv_ids is None else self.kv_ids
        qmin, qmax = _block_min_max(self.ids, q_lo, q_hi)  # (..., nq)
        kmin, kmax = _block_min_max(kv_ids, k_lo, k_hi)  # (..., nk)
        qmin, qmax = qmin[..., :, None], qmax[..., :, None]
        kmin, kmax = kmin[..., None, :], kmax[..., None, :]
        full = (qmin == qmax) & (kmin == kmax) & (qmin == kmin)  # (..., nq, nk)
        empty = (qmax < kmin) | (kmax < qmin)
        out = _kinds(full, empty)
        return out[None, None] if out.ndim == 2 else out[:, None]  # (B', 1, nq, nk)


@dataclass(frozen=True, eq=False)
class KeyMask(MaskMod):
    """A per-key bool (B, s) or (s,), True = real key (padding as a mask_mod)."""

    keep: torch.Tensor
    extent: tuple[int, int] | None = None  # the (t, s) bound to: a chunk must stay inside it

    @property
    def batch(self):
        return self.keep.shape[0] if self.keep.ndim == 2 else None

    def bind(self, t: int, s: int) -> "KeyMask":
        _check_lengths("key padding flags", None, self.keep.shape[-1], t, s, self.extent)
        return self if self.extent is not None else replace(self, extent=(t, s))

    def __call__(self, b, h, q_idx, kv_idx):
        # (b, kv) only, broadcasting over the queries: padding drawn alone stays (B, 1, s), not (B, t, s)
        kv_idx = _index(kv_idx)
        return self.keep[kv_idx] if self.keep.ndim == 1 else self.keep[_index(b, self.keep.device), kv_idx]

    def kinds(self, q_lo, q_hi, k_lo, k_hi):
        lo, hi = _block_min_max(self.keep.to(torch.int8), k_lo, k_hi)  # (..., nk)
        full, empty = (lo == 1)[..., None, :], (hi == 0)[..., None, :]
        out = _kinds(full, empty).expand(*full.shape[:-2], len(q_lo), len(k_lo))
        return out[None, None] if out.ndim == 2 else out[:, None]


@dataclass(frozen=True, eq=False)
class Combined(MaskMod):
    """`and_masks` / `or_masks`: a mask_mod of mask_mods."""

    parts: tuple
    op: str  # "and" | "or"

    @property
    def batch(self):
        sizes = {p.batch for p in self.parts if isinstance(p, MaskMod) and p.batch is not None}
        return sizes.pop() if sizes else None

    @property
    def shift_invariant(self) -> bool:
        return all(getattr(p, "shift_invariant", False) for p in self.parts)

    @property
    def analytic(self) -> bool:
        return all(_analytic(p) for p in self.parts)

    def bind(self, t, s):
        return Combined(tuple(p.bind(t, s) if isinstance(p, MaskMod) else p for p in self.parts), self.op)

    def __call__(self, b, h, q_idx, kv_idx):
        out = None
        for p in self.parts:
            m = p(b, h, q_idx, kv_idx)
            out = m if out is None else (out & m if self.op == "and" else out | m)
        return out

    def kinds(self, q_lo, q_hi, k_lo, k_hi):
        out = None
        for p in self.parts:
            k = p.kinds(q_lo, q_hi, k_lo, k_hi)
            out = k if out is None else (torch.minimum(out, k) if self.op == "and" else torch.maximum(out, k))
        return out


def _kinds(full: torch.Tensor, empty: torch.Tensor) -> torch.Tensor:
    """EMPTY 0, PARTIAL 1, FULL 2 as (not empty) + full (a full block is never empty)."""
    return (~empty).to(torch.int8) + (full & ~empty).to(torch.int8)


def _analytic(mod) -> bool:
    if isinstance(mod, Combined):
        return mod.analytic
    return isinstance(mod, MaskMod)


# -- the public constructors (re-exported as qkv.masks) -----------------------------------------
def causal(alignment: str = "top_left") -> MaskMod:
    """Query i uses keys up to its own position `p_i` (see `alignment`, as in
    [`qkv.scaled_dot_product_attention`][qkv.scaled_dot_product_attention]'s `causal_alignment`):

    ```text
    t=2, s=4   "top_left"       "bottom_right"
               q0  1 0 0 0      q0  1 1 1 0
               q1  1 1 0 0      q1  1 1 1 1
    ```
    """
    _check_alignment(alignment)
    return Band(None, 0, alignment)


# The largest window side, prefix or offset a mask takes: wider than any sequence, and positions
# plus or minus a few of them (an offset, a width) still fit the int64 tensors masks compute in.
MAX_POSITION = 2**60


def check_position(what: str, n, *, none: bool = False) -> None:
    """`n` is an int in [0, MAX_POSITION] (or None where `none`), else a one-line ValueError."""
    if n is None and none:
        return
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ValueError(f"{what} must be an int >= 0{' or None' if none else ''}, got {n!r}")
    if n > MAX_POSITION:
        unbounded = " (None is unbounded)" if none else ""
        raise ValueError(f"{what} must be at most 2**60, wider than any sequence{unbounded}, got {n!r}")


def sliding_window(left: int | None, right: int | None = 0, alignment: str = "top_left") -> MaskMod:
    """Keys `p_i − left … p_i + right` (None = unbounded on that side); `right=0` is causal.

    `sliding_window(512, 0)` is a causal window of 513 keys (the query's own and 512 before).
    """
    for side, w in (("left", left), ("right", right)):
        check_position(f"sliding_window {side}", w, none=True)
    _check_alignment(alignment)
    return Band(left, right, alignment)


def document(ids: torch.Tensor | Sequence[int], kv_ids: torch.Tensor | None = None) -> MaskMod:
    """Packed sequences: a token uses only keys of its own document.

    `ids`: (N,) or (B, N) integer, the document of each token (e.g. `[0, 0, 0, 1, 1]`).
    Compose with causality: `and_masks(document(ids), causal())`.
    """
    ids = torch.as_tensor(ids)
    for name, x in (("ids", ids), ("kv_ids", kv_ids)):
        if x is not None and (x.is_floating_point() or x.dtype == torch.bool or x.ndim not in (1, 2)):
            raise ValueError(f"document {name} must be a (N,) or (B, N) integer tensor, got "
                             f"dtype {x.dtype}, shape {tuple(x.shape)}")
    return Document(ids, kv_ids)


def prefix_lm(prefix_len: int) -> MaskMod:
    """Every query sees the first `prefix_len` keys (bidirectional prefix) and is causal after."""
    check_position("prefix_len", prefix_len)
    return or_masks(causal(), KeysBelow(prefix_len))


def and_masks(*mods) -> MaskMod:
    """A key takes part when every mask lets it."""
    return _combined(mods, "and")


def or_masks(*mods) -> MaskMod:
    """A key takes part when any mask lets it."""
    return _combined(mods, "or")


def _combined(mods, op) -> MaskMod:
    if not mods or not all(callable(m) for m in mods):
        raise ValueError(f"{op}_masks needs one or more mask_mods, got {mods!r}")
    return Combined(tuple(mods), op)


def band_sides(causal: bool, window: tuple[int | None, int | None] | None) -> tuple[int | None, int | None]:
    """The one rule for causality with a window: causal *is* the window `(None, 0)`, and the two
    intersect, so the band keeps `p_i − left ≤ j ≤ p_i + min(right, 0)` (None = unbounded side).

    Examples:
        >>> band_sides(True, None), band_sides(True, (3, 5)), band_sides(False, (2, None))
        ((None, 0), (3, 0), (2, None))
    """
    left, right = window if window is not None else (None, None)
    if causal:
        right = 0 if right is None else min(right, 0)
    return left, right


def band(causal: bool, window: tuple[int | None, int | None] | None,
         alignment: str = "top_left") -> Band | None:
    """Causality and a window as one `Band` mask_mod (`band_sides`), or None when
    neither restricts the keys."""
    left, right = band_sides(causal, window)
    return None if left is None and right is None else Band(left, right, alignment)


def _check_alignment(alignment):
    if alignment not in ALIGNMENTS:
        raise ValueError(f"alignment must be one of {ALIGNMENTS}, got {alignment!r}")


# -- the block mask -------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class BlockMask:
    """A mask cut into blocks: kinds per block, and what the attention needs to visit them.

    Attributes:
        B: the batch size the mask was built for (None = the same for every sequence).
        H: the heads it was built for (None = the same for every head).
        t: the query length.
        s: the key length.
        block_size: the tile side.
        kinds: (B', H', nq, nk) int8: 0 empty, 1 partial, 2 full (B' ∈ {1, B}, H' ∈ {1, H}).
        mask_mod: the (bound) mask_mod.
        q_offset: the global index of query 0 (chunks of a longer sequence).
        k_offset: the global index of key 0.
        runs: per query block row, `(c0, c1, full)`: consecutive non-empty key blocks
            c0 … c1−1 (non-empty for some batch row or head), `full` when all are full for all.
        partial: per query block row, the sorted key blocks that are non-empty but not full
            for every batch row and head (the ones a run's pieces must mask).
        tiles: the booleans (B', H', bq, bk) of partial blocks of a custom mask_mod,
            by (row, col); None for the built-ins (they are evaluated where needed).
    """

    B: int | None
    H: int | None
    t: int
    s: int
    block_size: int
    kinds: torch.Tensor
    mask_mod: Callable
    q_offset: int = 0
    k_offset: int = 0
    runs: list = field(default_factory=list, repr=False)
    tiles: dict | None = field(default=None, repr=False)
    partial: list = field(default_factory=list, repr=False)

    def pieces(self, row: int, max_blocks: int):
        """The row's runs cut into pieces of at most `max_blocks` key blocks, each
        `(c0, c1, full)`: the blockwise loop's unit of work (a tile that stays in cache)."""
        cols = self.partial[row]
        for c0, c1, full in self.runs[row]:
            for a in range(c0, c1, max_blocks):
                b = min(a + max_blocks, c1)
                yield a, b, full or bisect.bisect_left(cols, a) == bisect.bisect_left(cols, b)

    @property
    def shape(self) -> tuple:
        return (self.B, self.H, self.t, self.s)

    @property
    def num_blocks(self) -> tuple[int, int]:
        return tuple(self.kinds.shape[-2:])

    def sparsity(self) -> float:
        """Percent of blocks skipped (empty), as FlexAttention reports it."""
        k = self.kinds
        return 100.0 * float((k == EMPTY).sum()) / max(k.numel(), 1)

    def to_string(self, limit: int = 32) -> str:
        """The block kinds of (batch 0, head 0) as rows of ■ (full) ◩ (partial) · (empty)."""
        sym = {EMPTY: "·", PARTIAL: "◩", FULL: "■"}
        grid = self.kinds[0, 0, :limit, :limit].tolist()
        return "\n".join(" ".join(sym[x] for x in row) for row in grid)

    def __repr__(self):
        nq, nk = self.num_blocks
        return (f"BlockMask(shape={self.shape}, block_size={self.block_size}, blocks={nq}x{nk}, "
                f"sparsity={self.sparsity():.1f}%)")

    def check(self, B: int | None, H: int | None, t: int, s: int) -> None:
        """Raise `ValueError` unless this mask fits (B, H, t, s) attention."""
        if (self.t, self.s) != (t, s):
            raise ValueError(f"block_mask was built for t={self.t}, s={self.s}, but the attention has "
                             f"t={t}, s={s}; build one for these lengths")
        if self.kinds.shape[0] != 1 and self.kinds.shape[0] != B:
            raise ValueError(f"block_mask was built for batch B={self.kinds.shape[0]}, but the "
                             f"attention has batch {B}")
        if self.kinds.shape[1] != 1 and self.kinds.shape[1] != H:
            raise ValueError(f"block_mask was built for H={self.kinds.shape[1]} heads, but the "
                             f"attention has {H} query heads")

    def dense_block(self, row: int, c0: int, c1: int, device=None) -> torch.Tensor:
        """(B', H', bq, keys of blocks c0 … c1−1) bool: the mask on one run of one block row."""
        bs = self.block_size
        q0, q1 = row * bs, min((row + 1) * bs, self.t)
        k0, k1 = c0 * bs, min(c1 * bs, self.s)
        if self.tiles is None:
            q_idx = torch.arange(q0, q1, device=device)[:, None] + self.q_offset
            kv_idx = torch.arange(k0, k1, device=device)[None, :] + self.k_offset
            b = torch.arange(self.kinds.shape[0], device=device).view(-1, 1, 1, 1)
            h = torch.arange(self.kinds.shape[1], device=device).view(1, -1, 1, 1)
            out = self.mask_mod(b, h, q_idx[None, None], kv_idx[None, None])
            return out.expand(*self.kinds.shape[:2], q1 - q0, k1 - k0)
        out = torch.empty(*self.kinds.shape[:2], q1 - q0, k1 - k0, dtype=torch.bool, device=device)
        for c in range(c0, c1):
            part = out[..., (c - c0) * bs: min((c - c0 + 1) * bs, k1 - k0)]
            tile = self.tiles.get((row, c))
            if tile is not None:
                part.copy_(tile)
            else:
                part.copy_((self.kinds[:, :, row, c] == FULL)[..., None, None])
        return out

    def rows_mask(self, rows: torch.Tensor, device=None) -> torch.Tensor:
        """(B', H', r, s) bool: the mask on query rows `rows` (r,) only — O(r · s)."""
        if self.tiles is None:
            b = torch.arange(self.kinds.shape[0], device=device).view(-1, 1, 1, 1)
            h = torch.arange(self.kinds.shape[1], device=device).view(1, -1, 1, 1)
            q_idx = rows.view(1, 1, -1, 1) + self.q_offset
            kv_idx = torch.arange(self.s, device=device).view(1, 1, 1, -1) + self.k_offset
            return self.mask_mod(b, h, q_idx, kv_idx).expand(*self.kinds.shape[:2], len(rows), self.s)
        nk = self.kinds.shape[-1]
        out = torch.empty(*self.kinds.shape[:2], len(rows), self.s, dtype=torch.bool, device=device)
        for i, row in enumerate(rows.tolist()):
            r = row // self.block_size
            out[..., i, :] = self.dense_block(r, 0, nk, device=device)[..., row - r * self.block_size, :]
        return out

    def materialize(self, *, rank: int = 4, device=None) -> torch.Tensor:
        """The whole (B', H', t, s) bool mask (tests and the reference path; O(t · s)),
        with leading dims dropped to fit scores of `rank` < 4."""
        nq = self.kinds.shape[-2]
        rows = [self.dense_block(r, 0, self.kinds.shape[-1], device=device) for r in range(nq)]
        dense = torch.cat(rows, dim=-2) if rows else torch.zeros(
            *self.kinds.shape[:2], self.t, self.s, dtype=torch.bool, device=device)
        if rank >= 4:
            return dense
        lead = dense.shape[: 4 - rank]
        if any(n != 1 for n in lead):
            raise ValueError(f"a block mask built for B={self.B}, H={self.H} needs (b, h, t, d) "
                             f"inputs, got rank {rank}")
        return dense.reshape(dense.shape[4 - rank:])


def create_block_mask(mask_mod: Callable, B: int | None, H: int | None, Lq: int, Lk: int,
                      block_size: int = 128, *, q_offset: int = 0, k_offset: int = 0,
                      device: torch.device | str | None = None) -> BlockMask:
    """A [`BlockMask`][qkv.attention.block_mask.BlockMask] for `mask_mod` over (B, H, Lq, Lk)
    attention (FlexAttention's meaning).

    Args:
        mask_mod: `mask_mod(b, h, q_idx, kv_idx) -> bool` (True = takes part), a built-in from
            [`qkv.masks`][qkv.masks] (classified without evaluation) or any function of broadcasting
            index tensors (evaluated one block row at a time).
        B, H: batch size and query heads, or None when the mask is the same for all of them.
        Lq, Lk: query and key lengths (t, s).
        block_size: the tile side (> 0).
        q_offset, k_offset: global index of the first query / key, for a chunk of a longer
            sequence: the mask_mod sees `q_offset + i` and `k_offset + j`.

    Examples:
        >>> bm = create_block_mask(lambda b, h, q, k: (q - k).abs() <= 1, None, None, 6, 6, block_size=2)
        >>> bm.kinds[0, 0].tolist()
        [[2, 1, 0], [1, 2, 1], [0, 1, 2]]
    """
    if not callable(mask_mod):
        raise ValueError(f"mask_mod must be callable (b, h, q_idx, kv_idx) -> bool, got {type(mask_mod).__name__}")
    for name, n in (("B", B), ("H", H)):
        if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 1):
            raise ValueError(f"{name} must be a positive int or None, got {n!r}")
    for name, n in (("Lq", Lq), ("Lk", Lk), ("q_offset", q_offset), ("k_offset", k_offset)):
        check_position(name, n)
    if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size <= 0:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    if isinstance(mask_mod, MaskMod):
        mask_mod = mask_mod.bind(Lq + q_offset, Lk + k_offset)
    else:
        _check_arity(mask_mod)
    nq, nk = math.ceil(Lq / block_size), math.ceil(Lk / block_size)
    _check_size(mask_mod, B, H, Lq, Lk, block_size, device)
    q_lo = torch.arange(nq, device=device) * block_size
    k_lo = torch.arange(nk, device=device) * block_size
    q_hi, k_hi = (q_lo + block_size).clamp(max=Lq), (k_lo + block_size).clamp(max=Lk)
    tiles = None
    if nq == 0 or nk == 0:
        kinds = torch.zeros(1, 1, nq, nk, dtype=torch.int8, device=device)
    elif _analytic(mask_mod):
        _check_batch(mask_mod, B)
        kinds = mask_mod.kinds(q_lo + q_offset, q_hi + q_offset, k_lo + k_offset, k_hi + k_offset)
    else:
        kinds, tiles = _evaluate(mask_mod, B, H, Lq, Lk, block_size, q_offset, k_offset, device)
    runs, partial = _runs(kinds)
    return BlockMask(B, H, Lq, Lk, block_size, kinds.contiguous(), mask_mod, q_offset, k_offset,
                     runs=runs, tiles=tiles, partial=partial)


def _check_arity(mask_mod) -> None:
    """A custom mask_mod takes (b, h, q_idx, kv_idx): refused up front, not as a TypeError
    from inside the first block row."""
    try:
        signature = inspect.signature(mask_mod)
    except (TypeError, ValueError):  # a builtin without a signature: let the call decide
        return
    try:
        signature.bind(0, 0, 0, 0)
    except TypeError:
        raise ValueError(f"mask_mod must take four arguments (b, h, q_idx, kv_idx), got "
                         f"{getattr(mask_mod, '__name__', type(mask_mod).__name__)}{signature}") from None


def _check_size(mask_mod, B, H, Lq, Lk, block_size, device) -> None:
    """Refuse, with the estimate, a block mask larger than the device's memory (10⁹ × 10⁹
    scores in 128-blocks is a 61 TB block table) instead of attempting the allocation.

    The estimate: the (B', H', nq, nk) int8 kinds and about three (nq, nk) temporaries while
    their runs are found; a custom mask_mod also evaluates (B, H, block_size, Lk) booleans a
    block row at a time (the row, its two padded copies) beside its int32 key indices.
    """
    nq, nk = math.ceil(Lq / block_size), math.ceil(Lk / block_size)
    analytic = _analytic(mask_mod)
    rows = (getattr(mask_mod, "batch", None) or 1) if analytic else (B or 1) * (H or 1)
    need = (rows + 3) * nq * nk
    if not analytic:
        need += 3 * (B or 1) * (H or 1) * min(block_size, Lq) * Lk + 4 * Lk
    have = _memory_of(device)
    if have is not None and need > have:
        raise ValueError(
            f"create_block_mask for {Lq} × {Lk} scores in blocks of {block_size} needs about "
            f"{_bytes(need)} ({nq} × {nk} blocks), more than the {_bytes(have)} of memory here; "
            f"use a larger block_size or shorter lengths")


def _memory_of(device) -> int | None:
    """Bytes of memory on `device` (a GPU's total, the host's physical memory), if known."""
    device = torch.device(device) if device is not None else torch.device("cpu")
    if device.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.mem_get_info(device)[1]
    if device.type == "meta":
        return None
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not a POSIX host
        return None


def _bytes(n: float) -> str:
    """`n` bytes in decimal units: `_bytes(6.1e13) == '61.0 TB'`."""
    unit = 0
    while n >= 1000 and unit < 4:
        n, unit = n / 1000, unit + 1
    return f"{n:.1f} {('bytes', 'KB', 'MB', 'GB', 'TB')[unit]}"


def _check_batch(mod, B):
    got = getattr(mod, "batch", None)
    if got is not None and B is not None and got != B:
        raise ValueError(f"the mask's per-batch data has {got} rows but B={B}")


def _evaluate(mask_mod, B, H, Lq, Lk, bs, q_offset, k_offset, device):
    """A custom mask_mod, one block row at a time: kinds (B', H', nq, nk) and partial tiles."""
    nq, nk = math.ceil(Lq / bs), math.ceil(Lk / bs)
    Bn, Hn = B or 1, H or 1
    # int32 indices, as FlexAttention passes them: half the memory traffic of int64 for the
    # (block × Lk) arithmetic a mask_mod does (the bulk of the build time)
    i32 = dict(dtype=torch.int32, device=device)
    b = torch.arange(Bn, **i32).view(-1, 1, 1, 1)
    h = torch.arange(Hn, **i32).view(1, -1, 1, 1)
    kv = torch.arange(Lk, **i32).view(1, 1, 1, -1) + k_offset
    kinds = torch.empty(Bn, Hn, nq, nk, dtype=torch.int8, device=device)
    tiles = {}
    pad = nk * bs - Lk
    for r in range(nq):
        q0, q1 = r * bs, min((r + 1) * bs, Lq)
        q = torch.arange(q0, q1, **i32).view(1, 1, -1, 1) + q_offset
        got = mask_mod(b if B else 0, h if H else 0, q, kv)
        want = (Bn, Hn, q1 - q0, Lk)
        if not isinstance(got, torch.Tensor) or got.dtype != torch.bool:
            raise ValueError(f"mask_mod must return a bool tensor, got "
                             f"{getattr(got, 'dtype', type(got).__name__)}")
        try:
            got = got.expand(want)  # (B', H', bq, s)
        except RuntimeError:
            raise ValueError(f"mask_mod returned shape {tuple(got.shape)}, which does not broadcast "
                             f"to (B, H, q block, Lk) = {want}") from None
        if pad:
            got_t = torch.cat([got, got.new_ones(*want[:3], pad)], -1)
            got_f = torch.cat([got, got.new_zeros(*want[:3], pad)], -1)
        else:
            got_t = got_f = got
        full = got_t.reshape(Bn, Hn, q1 - q0, nk, bs).all(-1).all(-2)  # (B', H', nk)
        some = got_f.reshape(Bn, Hn, q1 - q0, nk, bs).any(-1).any(-2)
        kinds[:, :, r] = _kinds(full, ~some)
        for c in ((some.any((0, 1)) & ~full.all((0, 1))).nonzero().flatten().tolist()):
            tiles[(r, c)] = got[..., c * bs: min((c + 1) * bs, Lk)].clone()
    return kinds, tiles


def _runs(kinds: torch.Tensor) -> tuple[list, list]:
    """Per block row: [(c0, c1, all_full), …], the consecutive non-empty key blocks; and the
    sorted partial (non-empty, not all-full) key blocks of each row."""
    nonempty = (kinds != EMPTY).flatten(0, 1).any(0)  # (nq, nk) non-empty for some b, h
    full = (kinds == FULL).flatten(0, 1).all(0)  # (nq, nk) full for every b, h
    nq, nk = nonempty.shape
    if nq == 0:
        return [], []
    edges = torch.nn.functional.pad(nonempty.to(torch.int8), (1, 1)).diff(dim=-1)  # (nq, nk + 1)
    starts = (edges == 1).nonzero().tolist()
    ends = (edges == -1).nonzero()[:, 1].tolist()
    partial = [[] for _ in range(nq)]
    for r, c in (nonempty & ~full).nonzero().tolist():
        partial[r].append(c)
    runs = [[] for _ in range(nq)]
    for (r, c0), c1 in zip(starts, ends):
        cols = partial[r]  # the run is full when no partial block lies in [c0, c1)
        runs[r].append((c0, c1, bisect.bisect_left(cols, c0) == bisect.bisect_left(cols, c1)))
    return runs, partial


# -- from an AttentionMask description (what the blockwise backend receives) ---------------------
_CACHE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def block_mask_for(mask, B: int, H: int, t: int, s: int, device=None,
                   block_size: int | None = None) -> BlockMask:
    """The [`BlockMask`][qkv.attention.block_mask.BlockMask] of an
    [`AttentionMask`][qkv.attention.attention_mask.AttentionMask] description: its one compiled
    mask_mod ([`mask_mod`][qkv.attention.attention_mask.AttentionMask.mask_mod]) cut into blocks; a
    `dense` tensor has no block form (`ValueError`). Built once per (description, shape): a model's
    layers share it.

    `block_size` None: 64 for a sliding window, 128 otherwise. A band's ragged ends are
    partial tiles, about block / (w + block) of the scores a window of w visits; 64-row tiles
    halve that waste (measured, 16k tokens, one thread: w = 512 165 vs 192 ms, w = 256 108 vs
    126 ms, w = 2048 543 vs 559 ms), while documents and plain causality run 2–8 % slower with
    them.
    """
    if mask.block is not None:
        return mask.block
    if mask.dense is not None:
        raise ValueError("the blockwise backend takes masks as structure (causal, window, padding, "
                         "packed sequences, block_mask=); a dense attn_mask has no block form — use "
                         "backend='fused' or 'reference', or express it as a mask_mod")
    if block_size is None:
        windowed = mask.band is not None and mask.band.left is not None and mask.varlen is None
        block_size = 64 if windowed else 128
    key = (B, H, t, s, str(device), block_size)
    cached = _CACHE.get(mask)
    if cached is not None and cached[0] == key:
        return cached[1]
    mod = mask.mask_mod if mask.mask_mod is not None else Band(None, None)  # None: every key
    bm = create_block_mask(mod, B, H, t, s, block_size, device=device)
    _CACHE[mask] = (key, bm)
    return bm
