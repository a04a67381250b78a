"""Which (query chunk, key chunk) pairs a mask leaves empty, full or partial — decided from global
positions, so a rank skips the chunks it does not need without looking at a single score.

A rank's shard is a few runs of global positions
([`layout_ranges`][qkv.distributed.shard.layout_ranges]). The mask is one mask_mod over global
positions (`GlobalMask`: the band of causality and a window, `band`, AND-ed with a `block_mask`'s
mask_mod), and a pair of runs [qa, qb) × [ka, kb) is classified the way
[`create_block_mask`][qkv.attention.create_block_mask] classifies a block — the pair *is* one block
— by the built-ins' `kinds` from its bounds alone. A square pair on the diagonal whose mask is
exactly causal there is CAUSAL (torch's causal kernel).

Zigzag under a causal mask, P = 2 (chunks 0..3; rank 0 holds 0 and 3, rank 1 holds 1 and 2):

```text
keys of rank 0   keys of rank 1
 c0      c3       c1      c2
```
    rank 0   c0   ◣       ·        ·       ·         ◣ diagonal (torch's causal kernel)
             c3   ■       ◣        ■       ■         ■ full  · empty (skipped)
    rank 1   c1   ■       ·        ◣       ·
             c2   ■       ·        ■       ◣

Every rank computes 2 diagonals + 2 full blocks here: balanced. A custom `mask_mod`
(FlexAttention's `mask_mod(b, h, q_idx, kv_idx) -> bool`, True = takes part) cannot be
classified from bounds: a pair the built-in parts do not leave empty is PARTIAL, and the blockwise
kernel (`qkv.attention.blockwise.forward_chunk`) skips the empty blocks inside it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Callable

import torch

from qkv.attention.block_mask import EMPTY as EMPTY_BLOCK, FULL as FULL_BLOCK, PARTIAL as PARTIAL_BLOCK
from qkv.attention.block_mask import Band, Combined, MaskMod, and_masks, band

EMPTY, FULL, CAUSAL, PARTIAL = "empty", "full", "causal", "partial"


@dataclass(frozen=True)
class GlobalMask:
    """A mask over global positions: `causal`, `window` (left, right) and an optional `mask_mod`.

    Called as a mask_mod itself (`mask(b, h, q_idx, kv_idx)`: all three together), which is
    what the blockwise kernel receives for a partial pair of chunks.
    """

    causal: bool = False
    window: tuple[int | None, int | None] | None = None
    mask_mod: Callable | None = None

    @cached_property
    def parts(self) -> tuple:
        """The mask as an intersection of mask_mods: the band, then `mask_mod` (its parts when
        it is itself an intersection)."""
        structure = band(self.causal, self.window)
        parts = [structure] if structure is not None else []
        mod = self.mask_mod
        if isinstance(mod, Combined) and mod.op == "and":
            parts.extend(mod.parts)
        elif mod is not None:
            parts.append(mod)
        return tuple(parts)

    @cached_property
    def combined(self) -> Callable | None:
        """One qkv mask_mod for everything (None: no mask); analytic when the parts are."""
        return None if not self.parts else self.parts[0] if len(self.parts) == 1 else and_masks(*self.parts)

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
        bounds = [torch.tensor([x]) for x in (qa, qb, ka, kb)]  # the pair as one block
        kinds = [_kinds(p, bounds) for p in self.parts]  # each (B', 1, 1, 1)
        kind = torch.tensor(FULL_BLOCK, dtype=torch.int8)  # no part: every key takes part
        for k in kinds:  # AND of the parts: the smallest kind (as and_masks classifies)
            kind = torch.minimum(kind, k)
        if bool((kind == EMPTY_BLOCK).all()):
            return EMPTY
        if bool((kind == FULL_BLOCK).all()):
            return FULL
        if (qa, qb) == (ka, kb) and all(bool((k == FULL_BLOCK).all()) or _causal_on(p, qb - qa)
                                        for p, k in zip(self.parts, kinds)):
            return CAUSAL
        return PARTIAL


def _kinds(mod, bounds) -> torch.Tensor:
    """A part's block kinds on one block (the pair): a built-in's from its bounds, a custom
    mask_mod's PARTIAL (not known without evaluating it)."""
    if isinstance(mod, MaskMod) and getattr(mod, "analytic", True):
        return mod.kinds(*bounds)
    return torch.full((1, 1, 1, 1), PARTIAL_BLOCK, dtype=torch.int8)


def _causal_on(mod, n: int) -> bool:
    """Whether `mod` on a square n × n pair on the diagonal is exactly top-left causal: a band
    closed on the right at the diagonal whose left side reaches the pair's first key."""
    return isinstance(mod, Band) and mod.right == 0 and mod._offset() == 0 and \
        (mod.left is None or mod.left >= n - 1)


def mask_mod_of(block_mask, length: int) -> Callable | None:
    """The `mask_mod` behind `block_mask` for a sequence of `length` tokens: a qkv block
    mask (`.mask_mod`; built for `length` × `length`, or refused), a qkv.masks mask_mod
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
