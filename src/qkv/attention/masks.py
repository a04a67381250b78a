"""Where the causal and sliding-window masks are built, and how masks combine.

A query row ``i`` sits at key position ``p_i = i + offset`` where the offset depends on the
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

import torch

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


def combine_masks(attn_mask: torch.Tensor | None, structure: torch.Tensor | None) -> torch.Tensor | None:
    """One mask with both meanings: bool stays bool (AND); a float mask gets −inf where excluded."""
    if structure is None:
        return attn_mask
    if attn_mask is None:
        return structure
    if attn_mask.dtype == torch.bool:
        return attn_mask & structure
    return attn_mask.masked_fill(~structure, float("-inf"))


def padding_mask(lengths: torch.Tensor, s: int) -> torch.Tensor:
    """(b,) lengths → (b, 1, 1, s) bool key mask, True for real tokens.

    Example:
        >>> padding_mask(torch.tensor([1, 3]), 3)[:, 0, 0].int()
        tensor([[1, 0, 0],
                [1, 1, 1]], dtype=torch.int32)
    """
    keep = torch.arange(s, device=lengths.device) < lengths.unsqueeze(-1)  # (b, s)
    return keep[:, None, None, :]  # (b, 1, 1, s)
