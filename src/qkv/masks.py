"""Built-in mask_mods for :func:`qkv.create_block_mask` (FlexAttention's meaning: True = takes part).

Each classifies its blocks from their bounds alone — no (t × s) evaluation — and composes:

* :func:`causal` ``(alignment="top_left")`` — keys up to the query's own position
* :func:`sliding_window` ``(left, right=0)`` — keys ``p_i − left … p_i + right``
* :func:`document` ``(ids)`` — packed sequences: keys of the query's own document
* :func:`prefix_lm` ``(prefix_len)`` — a bidirectional prefix, causal after it
* :func:`and_masks` / :func:`or_masks` — intersection / union (also ``a & b``, ``a | b``)

Example:
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
