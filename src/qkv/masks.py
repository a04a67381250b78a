"""Built-in mask_mods for [`qkv.create_block_mask`][qkv.create_block_mask] (FlexAttention's meaning:
True = takes part).

Each classifies its blocks from their bounds alone — no (t × s) evaluation — and composes:

* [`causal`][qkv.masks.causal] `(alignment="top_left")` — keys up to the query's own position
* [`sliding_window`][qkv.masks.sliding_window] `(left, right=0)` — keys `p_i − left … p_i + right`
* [`document`][qkv.masks.document] `(ids)` — packed sequences: keys of the query's own document
* [`prefix_lm`][qkv.masks.prefix_lm] `(prefix_len)` — a bidirectional prefix, causal after it
* [`and_masks`][qkv.masks.and_masks] / [`or_masks`][qkv.masks.or_masks] — intersection / union (also
  `a & b`, `a | b`)

Examples:
    >>> import torch, qkv
    >>> ids = torch.tensor([0, 0, 0, 1, 1, 1, 1, 2])
    >>> mod = qkv.masks.and_masks(qkv.masks.document(ids), qkv.masks.causal())
    >>> bm = qkv.create_block_mask(mod, None, None, 8, 8, block_size=2)
    >>> print(bm.to_string())
    ◩ · · ·
    ◩ ◩ · ·
    · ◩ ◩ ·
    · ◩ ◩ ◩
"""

from qkv.attention.block_mask import and_masks, causal, document, or_masks, prefix_lm, sliding_window

__all__ = ["and_masks", "causal", "document", "or_masks", "prefix_lm", "sliding_window"]
