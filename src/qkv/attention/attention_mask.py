"""The mask description: what may attend to what, kept as *structure* until a backend needs it.

Two kinds of tensor mask exist, with one meaning each (the same as torch's SDPA):

* **bool**: True = the key takes part, False = excluded;
* **float**: added to the scaled scores (−inf excludes, 0 leaves the score alone).

Combining follows one rule (`combine`): bool with bool is AND; anything with a float mask
gives a float mask, with −inf wherever a bool part excludes. A *score bias* (ALiBi, and later
others) is not a mask: it travels to the backends separately (the `bias` argument), so the
explainer can show "scaled + bias" and "which keys were excluded" as two things.

Structure is described, not drawn: an [`AttentionMask`][qkv.attention.attention_mask.AttentionMask]
says "causal, aligned bottom-right", "a window of (left, right)", "these keys are padding" or "these
are packed sequences" ([`VarLen`][qkv.attention.attention_mask.VarLen]). Its meaning is one
FlexAttention `mask_mod` built from the built-ins of `qkv.attention.block_mask`
([`AttentionMask.mask_mod`][qkv.attention.attention_mask.AttentionMask.mask_mod]): the blockwise
backend classifies blocks from it,
[`AttentionMask.materialize`][qkv.attention.attention_mask.AttentionMask.materialize] evaluates it
densely (what the reference path does), and the fused backend uses the description directly where
torch has a kernel for it (its causal kernel; the padding-free grid of packed sequences).

A query row `i` sits at key position `p_i = i + offset`, where the offset depends on the
alignment of the (t × s) score matrix when `t != s`:

```text
causal_alignment="top_left"  (torch's is_causal)   causal_alignment="bottom_right" (KV cache)
t=3, s=5: p_i = i                                  t=3, s=5: p_i = i + (s - t) = i + 2

    k0 k1 k2 k3 k4                                     k0 k1 k2 k3 k4
q0   1  0  0  0  0                                 q0   1  1  1  0  0
q1   1  1  0  0  0                                 q1   1  1  1  1  0
q2   1  1  1  0  0                                 q2   1  1  1  1  1
```

With a KV cache the new queries are the *last* t of s positions, so bottom-right is the
alignment that decoding needs. When `t > s` bottom-right leaves the first `t - s` rows with
no key at all; those rows give an output of zeros.

A window `(left, right)` keeps keys `p_i - left <= j <= p_i + right` (`None` on a side means
unbounded); `is_causal` is the window `(None, 0)`, and both together intersect
(`band_sides`, the one place that rule is written).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
import functools
from typing import TYPE_CHECKING, Sequence

import torch

from qkv.attention.block_mask import ALIGNMENTS, Band, Document, KeyMask, MaskMod, and_masks
from qkv.attention.block_mask import band as band_of

if TYPE_CHECKING:
    from qkv.attention.block_mask import BlockMask

__all__ = ["ALIGNMENTS", "AttentionMask", "NO_MASK", "VarLen", "as_additive", "combine",
           "combine_masks", "evaluate", "padding_mask", "structural_mask"]


def structural_mask(
    t: int,
    s: int,
    *,
    is_causal: bool = False,
    window: tuple[int | None, int | None] | None = None,
    causal_alignment: str = "top_left",
    device: torch.device | str | None = None,
) -> torch.Tensor | None:
    """The (t, s) bool mask (True = takes part) of causality and windowing, or None if neither:
    the band mask_mod (`band`) evaluated on every (i, j).

    Examples:
        >>> structural_mask(2, 3, is_causal=True, causal_alignment="bottom_right").int()
        tensor([[1, 1, 0],
                [1, 1, 1]], dtype=torch.int32)
    """
    mod = band_of(is_causal, window, causal_alignment)
    return None if mod is None else evaluate(mod, t, s, device=device)


def evaluate(mod: MaskMod, t: int, s: int, *, device: torch.device | str | None = None,
             rows: torch.Tensor | None = None) -> torch.Tensor:
    """A mask_mod on every (query i, key j) of a (t × s) score matrix: bool (B', t, s) when it
    holds per-batch data (B' = its `batch`), (t, s) otherwise — or narrower where the mask_mod
    does not depend on the query (key padding alone: (B', 1, s)). O(t · s): the reference path's
    and the tests' view; the blockwise backend classifies blocks instead. `rows` (r,): those
    query positions (in [0, t)) only, (B', r, s) or (r, s): the same rows of the whole mask."""
    mod = mod.bind(t, s)
    b = torch.arange(mod.batch, device=device).view(-1, 1, 1) if mod.batch is not None else 0
    q_idx = torch.arange(t, device=device).view(t, 1) if rows is None else rows.view(-1, 1)  # (t | r, 1)
    kv_idx = torch.arange(s, device=device).view(1, s)  # (1, s)
    return mod(b, 0, q_idx, kv_idx)  # (B', t | 1, s) or (t, s)


def combine(*masks: torch.Tensor | None) -> torch.Tensor | None:
    """The one rule: all bool → AND; any float → float, −inf where a bool part excludes.

    Masks must broadcast together; `None` parts are skipped (all `None` → `None`).

    Examples:
        >>> keep = torch.tensor([True, False])
        >>> combine(keep, torch.tensor([True, True])).tolist()
        [True, False]
        >>> combine(torch.tensor([0.5, 0.0]), keep).tolist()
        [0.5, -inf]
    """
    present = [m for m in masks if m is not None]
    if not present:
        return None
    floats = [m for m in present if m.dtype != torch.bool]
    bools = [m for m in present if m.dtype == torch.bool]
    keep = None
    for m in bools:
        keep = m if keep is None else keep & m
    if not floats:
        return keep
    out = floats[0]
    for m in floats[1:]:
        out = out + m
    return out if keep is None else out.masked_fill(~keep, float("-inf"))


def as_additive(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """A mask as the float added to the scores: bool True → 0, False → −inf; float as is.

    Examples:
        >>> as_additive(torch.tensor([True, False]), torch.float32).tolist()
        [0.0, -inf]
    """
    if mask is None:
        return None
    if mask.dtype != torch.bool:
        return mask.to(dtype)
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, float("-inf"))


# Kept under its old name: tests and users combine a user mask with a structural one.
def combine_masks(attn_mask: torch.Tensor | None, structure: torch.Tensor | None) -> torch.Tensor | None:
    """`combine(attn_mask, structure)` that returns an input unchanged when the other is None."""
    return combine(attn_mask, structure)


def padding_mask(lengths: torch.Tensor, s: int) -> torch.Tensor:
    """(b,) lengths → (b, 1, 1, s) bool key mask, True for real tokens.

    Examples:
        >>> padding_mask(torch.tensor([1, 3]), 3)[:, 0, 0].int()
        tensor([[1, 0, 0],
                [1, 1, 1]], dtype=torch.int32)
    """
    keep = torch.arange(s, device=lengths.device) < lengths.unsqueeze(-1)  # (b, s)
    return keep[:, None, None, :]  # (b, 1, 1, s)


# -- packed variable-length sequences ------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class VarLen:
    """n sequences packed one after another along the length axis: N = Σ lengths tokens.

    Attention stays inside each sequence (a block-diagonal mask); causality and windows apply
    within a sequence. Built once per batch and shared by every layer. For a backend that wants
    the sequences apart, `index` says where each packed token sits in an (n · max_len) grid:

    ```text
    packed  a0 a1 a2 b0 b1            grid  a0 a1 a2      (n = 2, max_len = 3)
    index    0  1  2  3  4                  b0 b1 ·       (· = padding, excluded as a key)
    ```

    Attributes:
        lengths: tokens per sequence (Python ints, each >= 1).
        cu_seqlens: (n + 1,) int64 cumulative lengths [0, l_0, l_0 + l_1, …] (flash-attn's).
        max_len: the longest sequence.
        sequence: (N,) which sequence each token belongs to.
        position: (N,) each token's position inside its sequence (0-based).
        index: (N,) each token's row in the (n · max_len) grid.
        real: (n, max_len) bool, True where the grid holds a token.

    Examples:
        >>> vl = VarLen.from_lengths([3, 2])
        >>> vl.cu_seqlens.tolist(), vl.position.tolist(), vl.index.tolist()
        ([0, 3, 5], [0, 1, 2, 0, 1], [0, 1, 2, 3, 4])
    """

    lengths: tuple[int, ...]
    cu_seqlens: torch.Tensor
    max_len: int
    sequence: torch.Tensor
    position: torch.Tensor
    index: torch.Tensor
    real: torch.Tensor

    @classmethod
    def from_lengths(cls, lengths: Sequence[int], device: torch.device | str | None = None) -> "VarLen":
        lengths = tuple(int(n) for n in lengths)
        if not lengths or min(lengths) < 1:
            raise ValueError(f"packed sequence lengths must be >= 1 and at least one, got {list(lengths)}")
        n, max_len = len(lengths), max(lengths)
        lens = torch.tensor(lengths, dtype=torch.long, device=device)  # (n,)
        cu = torch.zeros(n + 1, dtype=torch.long, device=device)
        cu[1:] = lens.cumsum(0)
        real = torch.arange(max_len, device=device) < lens[:, None]  # (n, max_len)
        sequence, position = real.nonzero(as_tuple=True)  # (N,) each, sequences in order
        return cls(lengths, cu, max_len, sequence, position, sequence * max_len + position, real)

    @classmethod
    def from_cu_seqlens(cls, cu_seqlens: torch.Tensor) -> "VarLen":
        """From flash-attn's cumulative lengths (n + 1,) starting at 0."""
        if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.ndim != 1 or cu_seqlens.numel() < 2 \
                or cu_seqlens.is_floating_point() or int(cu_seqlens[0]) != 0:
            raise ValueError(f"cu_seqlens must be a 1-D integer tensor [0, l_0, l_0 + l_1, …], got "
                             f"{cu_seqlens!r}")
        return cls.from_lengths(cu_seqlens.diff().tolist(), device=cu_seqlens.device)

    @property
    def total(self) -> int:
        """N, the number of packed tokens."""
        return sum(self.lengths)

    def block_diagonal(self) -> torch.Tensor:
        """(N, N) bool: True where query and key are in the same sequence."""
        return self.sequence[:, None] == self.sequence[None, :]


class cached_property(functools.cached_property):
    """`functools.cached_property` without Python 3.11's lock (3.12 dropped it): torch.compile
    cannot enter an `RLock`, and a traced forward reads `band` and `mask_mod`."""

    def __get__(self, instance, owner=None):
        if instance is None:
            return self
        cache = instance.__dict__
        if self.attrname not in cache:
            cache[self.attrname] = self.func(instance)
        return cache[self.attrname]


# -- the description -----------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class AttentionMask:
    """Which keys each query may use, as a description a backend may materialise or not; its
    meaning is one mask_mod ([`mask_mod`][qkv.attention.attention_mask.AttentionMask.mask_mod]).

    Fields (all optional; the default lets every query see every key):
        causal: query i sees keys up to its own position (see `alignment`).
        alignment: `"top_left"` or `"bottom_right"` — where the diagonal lies when t ≠ s.
        window: `(left, right)` keys within p_i − left … p_i + right (None = unbounded side).
        key_padding: (..., s) bool, True for real keys; `...` are the batch dims in front of
            the heads, e.g. (b, s) for (b, h, t, d) queries.
        dense: a tensor mask (bool or float, see the module doc) broadcastable to (..., t, s).
        varlen: packed sequences ([`VarLen`][qkv.attention.attention_mask.VarLen]); t = s = N,
        attention within each sequence. block: a [`BlockMask`][qkv.attention.block_mask.BlockMask]
        (any `mask_mod`, e.g. from
            [`qkv.masks`][qkv.masks]), built for this call's (B, H, t, s); it stands alone (no other
            field may be set with it), and the blockwise backend visits only its non-empty blocks.

    Examples:
        >>> m = AttentionMask(causal=True, key_padding=torch.tensor([[True, True, False]]))
        >>> m.materialize(3, 3)[0, 0].int()          # (b, 1, t, s) bool
        tensor([[1, 0, 0],
                [1, 1, 0],
                [1, 1, 0]], dtype=torch.int32)
    """

    causal: bool = False
    alignment: str = "top_left"
    window: tuple[int | None, int | None] | None = None
    key_padding: torch.Tensor | None = None
    dense: torch.Tensor | None = None
    varlen: VarLen | None = None
    block: "BlockMask | None" = None

    @property
    def structural(self) -> bool:
        """Whether causality or a window restricts keys by position."""
        return self.band is not None

    @cached_property
    def band(self) -> Band | None:
        """Causality and the window as one band (unbound: the alignment is resolved against the
        lengths), None when neither restricts keys."""
        return band_of(self.causal, self.window, self.alignment)

    @cached_property
    def mask_mod(self) -> MaskMod | None:
        """The description as one FlexAttention mask_mod (True = takes part), built from the
        built-ins: the band, key padding as a per-key mask over the flattened batch, packed
        sequences as documents, AND-ed; a block mask's own mask_mod. None when every key takes
        part. `dense` is a tensor, not structure: it is not part of it (`materialize` adds it).

        Examples:
            >>> m = AttentionMask(causal=True, window=(1, None))
            >>> m.mask_mod(0, 0, torch.tensor([[2]]), torch.arange(4)).int().tolist()
            [[0, 1, 1, 0]]
        """
        if self.block is not None:
            return self.block.mask_mod
        parts = [self.band] if self.band is not None else []
        if self.key_padding is not None:
            kp = self.key_padding
            parts.append(KeyMask(kp.reshape(-1, kp.shape[-1]) if kp.ndim >= 2 else kp))
        if self.varlen is not None:
            parts.append(Document(self.varlen.sequence))
        return None if not parts else parts[0] if len(parts) == 1 else and_masks(*parts)

    @property
    def empty(self) -> bool:
        """True when nothing is masked: every query sees every key."""
        return not self.structural and self.key_padding is None and self.dense is None \
            and self.varlen is None and self.block is None

    def with_(self, **changes) -> "AttentionMask":
        """A copy with some fields changed (`dataclasses.replace`)."""
        return replace(self, **changes)

    def padding_for(self, rank: int) -> torch.Tensor | None:
        """`key_padding` (..., s) shaped to broadcast against (..., [h,] t, s) scores."""
        if self.key_padding is None:
            return None
        kp = self.key_padding.unsqueeze(-2)  # (..., 1, s): every query row
        return kp.unsqueeze(-3) if rank >= 3 else kp  # (..., 1, 1, s): every head

    def materialize(self, t: int, s: int, *, rank: int = 4,
                    device: torch.device | str | None = None,
                    rows: torch.Tensor | None = None) -> torch.Tensor | None:
        """The whole description as one tensor mask broadcastable to (..., t, s), or None:
        [`mask_mod`][qkv.attention.attention_mask.AttentionMask.mask_mod] evaluated on every (i, j),
        combined with `dense`.

        Bool unless `dense` is float (then float, −inf where excluded). `rank` is the rank
        of the scores (4 for (b, h, t, s)), used to place `key_padding`'s dims. `rows` (r,):
        the structure drawn for those query positions only, (..., r | 1, s) — for a description
        without `dense` or `block` (a traced row's mask; the others are whole tensors already).
        """
        device = device if device is not None else _device_of(self)
        if rows is not None and (self.dense is not None or self.block is not None):
            raise ValueError("AttentionMask.materialize(rows=...) draws the structure alone: "
                             "a dense or block mask is picked by rows from the whole one")
        if self.block is not None:  # built for this call's (B, H): its own tiles, already placed
            return combine(self.dense, self.block.materialize(rank=rank, device=device))
        if self.mask_mod is None:
            return combine(self.dense)
        keep = evaluate(self.mask_mod, t, s, device=device, rows=rows)  # (B', t | r | 1, s) or (t | r, s)
        if self.key_padding is not None:  # B' → key padding's batch dims, in front of the heads
            keep = keep.reshape(*self.key_padding.shape[:-1], *keep.shape[-2:])  # (..., t | 1, s)
            keep = keep.unsqueeze(-3) if rank >= 3 else keep  # (..., 1, t | 1, s)
        return combine(self.dense, keep)


def _device_of(mask: AttentionMask):
    for x in (mask.dense, mask.key_padding, mask.varlen.cu_seqlens if mask.varlen else None,
              mask.block.kinds if mask.block is not None else None):
        if x is not None:
            return x.device
    return None


NO_MASK = AttentionMask()
