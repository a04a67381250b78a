"""Which (query chunk, key chunk) pairs a mask leaves empty, full or partial — decided from global
positions, so a rank skips the chunks it does not need without looking at a single score.

A rank's shard is a few runs of global positions (:func:`~qkv.distributed.shard.layout_ranges`);
a pair of runs [qa, qb) × [ka, kb) is classified by interval arithmetic for causal and window
masks, which is exact: with the window written as kv ∈ [i − left, i + right] (causal: right = 0)

    empty  if  ka > (qb − 1) + right   or  kb − 1 < qa − left
    full   if  kb − 1 ≤ qa + right     and ka ≥ (qb − 1) − left

Zigzag under a causal mask, P = 2 (chunks 0..3; rank 0 holds 0 and 3, rank 1 holds 1 and 2)::

                 keys of rank 0   keys of rank 1
                  c0      c3       c1      c2
    rank 0   c0   ◣       ·        ·       ·         ◣ diagonal (torch's causal kernel)
             c3   ■       ◣        ■       ■         ■ full  · empty (skipped)
    rank 1   c1   ■       ·        ◣       ·
             c2   ■       ·        ■       ◣

Every rank computes 2 diagonals + 2 full blocks here: balanced. A ``mask_mod`` (FlexAttention's
``mask_mod(b, h, q_idx, kv_idx) -> bool``, True = takes part; e.g. documents) is evaluated on the
pair's global positions and the pair is skipped when it keeps nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

EMPTY, FULL, CAUSAL = "empty", "full", "causal"


@dataclass(frozen=True)
class GlobalMask:
    """A mask over global positions: ``causal``, ``window`` (left, right) and an optional ``mask_mod``."""

    causal: bool = False
    window: tuple[int | None, int | None] | None = None
    mask_mod: Callable | None = None

    def _sides(self) -> tuple[int | None, int | None]:
        left, right = self.window if self.window is not None else (None, None)
        if self.causal:
            right = 0 if right is None else min(right, 0)
        return left, right

    def pair(self, q_range: tuple[int, int], k_range: tuple[int, int], batch: int = 1,
             heads: int = 1):
        """EMPTY, FULL, CAUSAL (square diagonal chunk) or a bool mask (t, s) / (B, H, t, s)."""
        (qa, qb), (ka, kb) = q_range, k_range
        if qb <= qa or kb <= ka:
            return EMPTY
        left, right = self._sides()
        if (right is not None and ka > qb - 1 + right) or (left is not None and kb - 1 < qa - left):
            return EMPTY
        full = ((right is None or kb - 1 <= qa + right) and (left is None or ka >= qb - 1 - left))
        kind = FULL if full else None
        if kind is None and left is None and right == 0 and (qa, qb) == (ka, kb):
            kind = CAUSAL
        if self.mask_mod is not None and hasattr(self.mask_mod, "kinds"):  # qkv.masks: no evaluation
            kinds = self.mask_mod.kinds(*(torch.tensor([x]) for x in (qa, qb, ka, kb)))
            if bool((kinds == 0).all()):
                return EMPTY
            if bool((kinds == 2).all()) and kind is not None:
                return kind
        elif kind is not None and self.mask_mod is None:
            return kind
        i = torch.arange(qa, qb)[:, None]  # (t, 1) global query positions
        j = torch.arange(ka, kb)[None, :]  # (1, s) global key positions
        keep = torch.ones(qb - qa, kb - ka, dtype=torch.bool)
        if right is not None:
            keep &= j <= i + right
        if left is not None:
            keep &= j >= i - left
        if self.mask_mod is not None:
            b = torch.arange(batch)[:, None, None, None]
            h = torch.arange(heads)[None, :, None, None]
            keep = keep & self.mask_mod(b, h, i, j).to(torch.bool)  # (t, s) or (B, H, t, s)
        if not bool(keep.any()):
            return EMPTY
        if bool(keep.all()):
            return FULL
        return keep


def mask_mod_of(block_mask, length: int) -> Callable | None:
    """The ``mask_mod`` behind ``block_mask`` for a sequence of ``length`` tokens: a qkv block
    mask (``.mask_mod``; built for ``length`` × ``length``, or refused), a qkv.masks mask_mod
    (bound to the length), or any FlexAttention-style callable."""
    if block_mask is None:
        return None
    built = (getattr(block_mask, "t", None), getattr(block_mask, "s", None))
    if hasattr(block_mask, "mask_mod") and built != (length, length):
        raise ValueError(f"block_mask was built for {built[0]} × {built[1]} scores, but the sharded "
                         f"sequence has {length} tokens: build it for the global length")
    fn = getattr(block_mask, "mask_mod", block_mask)
    if not callable(fn):
        raise ValueError(f"block_mask must be a qkv block mask (with a mask_mod) or a mask_mod "
                         f"callable, got {type(block_mask).__name__}")
    return fn.bind(length, length) if hasattr(fn, "bind") else fn
