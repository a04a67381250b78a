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
``mask_mod(b, h, q_idx, kv_idx) -> bool``, True = takes part) from :mod:`qkv.masks` (documents,
prefix LM, …) classifies a pair from its bounds alone (``kinds``); any other callable makes the
pair PARTIAL and the blockwise kernel (:func:`qkv.attention.blockwise.forward_chunk`) skips the
empty blocks inside it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Callable

import torch

from qkv.attention.block_mask import EMPTY as EMPTY_BLOCK, FULL as FULL_BLOCK
from qkv.attention.block_mask import MaskMod, and_masks, sliding_window

EMPTY, FULL, CAUSAL, PARTIAL = "empty", "full", "causal", "partial"


@dataclass(frozen=True)
class GlobalMask:
    """A mask over global positions: ``causal``, ``window`` (left, right) and an optional ``mask_mod``.

    Called as a mask_mod itself (``mask(b, h, q_idx, kv_idx)``: all three together), which is
    what the blockwise kernel receives for a partial pair of chunks.
    """

    causal: bool = False
    window: tuple[int | None, int | None] | None = None
    mask_mod: Callable | None = None

    def sides(self) -> tuple[int | None, int | None]:
        left, right = self.window if self.window is not None else (None, None)
        if self.causal:
            right = 0 if right is None else min(right, 0)
        return left, right

    @cached_property
    def combined(self) -> Callable | None:
        """One qkv mask_mod for everything (None: no mask); analytic when the parts are."""
        left, right = self.sides()
        parts = ([sliding_window(left, right)] if (left, right) != (None, None) else []) + \
            ([self.mask_mod] if self.mask_mod is not None else [])
        return None if not parts else parts[0] if len(parts) == 1 else and_masks(*parts)

    def __call__(self, b, h, q_idx, kv_idx) -> torch.Tensor:
        q, k = torch.as_tensor(q_idx), torch.as_tensor(kv_idx)
        if self.combined is None:
            return torch.ones(torch.broadcast_shapes(q.shape, k.shape), dtype=torch.bool)
        return self.combined(b, h, q, k)

    def pair(self, q_range: tuple[int, int], k_range: tuple[int, int]) -> str:
        """EMPTY (skipped), FULL, CAUSAL (square diagonal chunk: torch's causal kernel) or
        PARTIAL (the blockwise kernel, which skips the empty blocks inside)."""
        (qa, qb), (ka, kb) = q_range, k_range
        if qb <= qa or kb <= ka:
            return EMPTY
        left, right = self.sides()
        if (right is not None and ka > qb - 1 + right) or (left is not None and kb - 1 < qa - left):
            return EMPTY
        full = ((right is None or kb - 1 <= qa + right) and (left is None or ka >= qb - 1 - left))
        kind = FULL if full else PARTIAL
        if kind == PARTIAL and left is None and right == 0 and (qa, qb) == (ka, kb):
            kind = CAUSAL
        mod = self.mask_mod
        if mod is None:
            return kind
        if isinstance(mod, MaskMod) and getattr(mod, "analytic", True):  # qkv.masks: no evaluation
            kinds = mod.kinds(*(torch.tensor([x]) for x in (qa, qb, ka, kb)))  # (B', 1, 1, 1)
            if bool((kinds == EMPTY_BLOCK).all()):
                return EMPTY
            if bool((kinds == FULL_BLOCK).all()):
                return kind
        return PARTIAL


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
