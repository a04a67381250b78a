"""The one mask algebra: what may attend to what, kept as *structure* until a backend needs it.

Two kinds of tensor mask exist, with one meaning each (the same as torch's SDPA):

* **bool**: True = the key takes part, False = excluded;
* **float**: added to the scaled scores (−inf excludes, 0 leaves the score alone).

Combining follows one rule (:func:`combine`): bool with bool is AND; anything with a float mask
gives a float mask, with −inf wherever a bool part excludes. A *score bias* (ALiBi, and later
others) is not a mask: it travels to the backends separately (the ``bias`` argument), so the
explainer can show "scaled + bias" and "which keys were excluded" as two things.

Structure is described, not drawn: an :class:`AttentionMask` says "causal, aligned bottom-right",
"a window of (left, right)", "these keys are padding" or "these are packed sequences"
(:class:`VarLen`); a backend may materialise it (:meth:`AttentionMask.materialize`, what the
reference path does) or use the description directly (torch's causal kernel; the padding-free
grid of packed sequences; a backend that skips masked blocks).

A query row ``i`` sits at key position ``p_i = i + offset``, where the offset depends on the
alignment of the (t × s) score matrix when ``t != s``::

    causal_alignment="top_left"  (torch's is_causal)   causal_alignment="bottom_right" (KV cache)
    t=3, s=5: p_i = i                                  t=3, s=5: p_i = i + (s - t) = i + 2

        k0 k1 k2 k3 k4                                     k0 k1 k2 k3 k4
    q0   1  0  0  0  0                                 q0   1  1  1  0  0
    q1   1  1  0  0  0                                 q1   1  1  1  1  0
    q2   1  1  1  0  0                                 q2   1  1  1  1  1

With a KV cache the new queries are the *last* t of s positions, so bottom-right is the
alignment that decoding needs. When ``t > s`` bottom-right leaves the first ``t - s`` rows with
no key at all; those rows give an output of zeros.

A window ``(left, right)`` keeps keys ``p_i - left <= j <= p_i + right`` (``None`` on a side means
unbounded); ``is_causal`` is the window ``(None, 0)``, and both together intersect.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Sequence

import torch

if TYPE_CHECKING:
    from qkv.attention.block_mask import BlockMask

ALIGNMENTS = ("top_left", "bottom_right")


def structural_mask(
    t: int,
    s: int,
    *,
    is_causal: bool = False,
    window: tuple[int | None, int | None] | None = None,
    causal_alignment: str = "top_left",
    device: torch.device | str | None = None,
) -> torch.Tensor | None:
    """The (t, s) bool mask (True = takes part) of causality and windowing, or None if neither.

    Example:
        >>> structural_mask(2, 3, is_causal=True, causal_alignment="bottom_right").int()
        tensor([[1, 1, 0],
                [1, 1, 1]], dtype=torch.int32)
    """
    left, right = window if window is not None else (None, None)
    if is_causal:
        right = 0 if right is None else min(right, 0)
    if left is None and right is None:
        return None
    offset = s - t if causal_alignment == "bottom_right" else 0
    pos = torch.arange(t, device=device).unsqueeze(-1) + offset  # (t, 1) key position of each query
    j = torch.arange(s, device=device)  # (s,)
    keep = torch.ones(t, s, dtype=torch.bool, device=device)
    if right is not None:
        keep &= j <= pos + right
    if left is not None:
        keep &= j >= pos - left
    return keep  # (t, s)


def combine(*masks: torch.Tensor | None) -> torch.Tensor | None:
    """The one rule: all bool → AND; any float → float, −inf where a bool part excludes.

    Masks must broadcast together; ``None`` parts are skipped (all ``None`` → ``None``).

    Example:
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

    Example:
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
    """``combine(attn_mask, structure)`` that returns an input unchanged when the other is None."""
    return combine(attn_mask, structure)


def padding_mask(lengths: torch.Tensor, s: int) -> torch.Tensor:
    """(b,) lengths → (b, 1, 1, s) bool key mask, True for real tokens.

    Example:
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
    the sequences apart, ``index`` says where each packed token sits in an (n · max_len) grid::

        packed  a0 a1 a2 b0 b1            grid  a0 a1 a2      (n = 2, max_len = 3)
        index    0  1  2  3  4                  b0 b1 ·       (· = padding, excluded as a key)

    Fields:
        lengths: tokens per sequence (Python ints, each >= 1).
        cu_seqlens: (n + 1,) int64 cumulative lengths [0, l_0, l_0 + l_1, …] (flash-attn's).
        max_len: the longest sequence.
        sequence: (N,) which sequence each token belongs to.
        position: (N,) each token's position inside its sequence (0-based).
        index: (N,) each token's row in the (n · max_len) grid.
        real: (n, max_len) bool, True where the grid holds a token.

    Example:
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


# -- the description -----------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class AttentionMask:
    """Which keys each query may use, as a description a backend may materialise or not.

    Fields (all optional; the default lets every query see every key):
        causal: query i sees keys up to its own position (see ``alignment``).
        alignment: ``"top_left"`` or ``"bottom_right"`` — where the diagonal lies when t ≠ s.
        window: ``(left, right)`` keys within p_i − left … p_i + right (None = unbounded side).
        key_padding: (..., s) bool, True for real keys; ``...`` are the batch dims in front of
            the heads, e.g. (b, s) for (b, h, t, d) queries.
        dense: a tensor mask (bool or float, see the module doc) broadcastable to (..., t, s).
        varlen: packed sequences (:class:`VarLen`); t = s = N, attention within each sequence.
        block: a :class:`~qkv.attention.block_mask.BlockMask` (any ``mask_mod``, e.g. from
            :mod:`qkv.masks`), built for this call's (B, H, t, s); it stands alone (no other
            field may be set with it), and the blockwise backend visits only its non-empty blocks.

    Example:
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
        return self.causal or (self.window is not None and self.window != (None, None))

    @property
    def empty(self) -> bool:
        """True when nothing is masked: every query sees every key."""
        return not self.structural and self.key_padding is None and self.dense is None \
            and self.varlen is None and self.block is None

    def with_(self, **changes) -> "AttentionMask":
        """A copy with some fields changed (``dataclasses.replace``)."""
        return replace(self, **changes)

    def padding_for(self, rank: int) -> torch.Tensor | None:
        """``key_padding`` (..., s) shaped to broadcast against (..., [h,] t, s) scores."""
        if self.key_padding is None:
            return None
        kp = self.key_padding.unsqueeze(-2)  # (..., 1, s): every query row
        return kp.unsqueeze(-3) if rank >= 3 else kp  # (..., 1, 1, s): every head

    def materialize(self, t: int, s: int, *, rank: int = 4,
                    device: torch.device | str | None = None) -> torch.Tensor | None:
        """The whole description as one tensor mask broadcastable to (..., t, s), or None.

        Bool unless ``dense`` is float (then float, −inf where excluded). ``rank`` is the rank
        of the scores (4 for (b, h, t, s)), used to place ``key_padding``'s dims.
        """
        device = device if device is not None else _device_of(self)
        structure = structural_mask(t, s, is_causal=self.causal, window=self.window,
                                    causal_alignment=self.alignment, device=device)
        blocks = self.varlen.block_diagonal() if self.varlen is not None else None  # (N, N)
        tiles = self.block.materialize(rank=rank, device=device) if self.block is not None else None
        return combine(self.dense, self.padding_for(rank), structure, blocks, tiles)


def _device_of(mask: AttentionMask):
    for x in (mask.dense, mask.key_padding, mask.varlen.cu_seqlens if mask.varlen else None,
              mask.block.kinds if mask.block is not None else None):
        if x is not None:
            return x.device
    return None


NO_MASK = AttentionMask()
