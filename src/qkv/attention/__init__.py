"""The attention core: a pure function of tensors, its trace, its masks and its backends.

* `functional.py` — [`scaled_dot_product_attention`][qkv.attention.scaled_dot_product_attention] and
  [`attention_trace`][qkv.attention.attention_trace]
* `reference.py`  — the readable math (where the softmax is)
* `backends.py`   — named backends and the `"auto"` dispatch rule
* `attention_mask.py` — [`AttentionMask`][qkv.attention.AttentionMask] (causal, window, padding,
  packed sequences as a description compiled to one mask_mod), [`VarLen`][qkv.attention.VarLen], and
  how tensor masks combine
* `trace.py`      — [`AttentionTrace`][qkv.attention.AttentionTrace], the typed record of
  intermediates (and `LseTrace`)
* `traced.py`     — `traced_attention`: the one traced call (rows traced, edits applied) that
  qkv's layers and transformers' attention run
* `softcap.py`    — `soft_cap`: Gemma 2's `c·tanh(z/c)`, written once
* `block_mask.py` — [`BlockMask`][qkv.attention.BlockMask],
  [`create_block_mask`][qkv.attention.create_block_mask] and the built-in mask_mods (`qkv.masks`):
  which blocks of the scores are full, partial or empty
* `blockwise.py`  — the online softmax (FlashAttention-2), forward and backward, O(N) memory
* `weights.py`    — [`attention_weights`][qkv.attention.attention_weights]: chosen softmax rows from
  the saved lse
"""

from qkv.attention.backends import BACKENDS, choose_backend, register_backend
from qkv.attention.block_mask import BlockMask, create_block_mask
from qkv.attention.functional import attention_trace, scaled_dot_product_attention
from qkv.attention.attention_mask import AttentionMask, VarLen, padding_mask, structural_mask
from qkv.attention.reference import reference_attention
from qkv.attention.trace import AttentionTrace
from qkv.attention.weights import attention_weights

__all__ = [
    "AttentionMask", "AttentionTrace", "BACKENDS", "BlockMask", "VarLen", "attention_trace",
    "attention_weights", "create_block_mask", "choose_backend", "padding_mask",
    "reference_attention", "register_backend", "scaled_dot_product_attention", "structural_mask",
]
