"""The attention core: a pure function of tensors, its trace, its masks and its backends.

* ``functional.py`` — :func:`scaled_dot_product_attention` and :func:`attention_trace`
* ``reference.py``  — the readable math (where the softmax is)
* ``backends.py``   — named backends and the ``"auto"`` dispatch rule
* ``masks.py``      — the one mask algebra: :class:`AttentionMask` (causal, window, padding,
  packed sequences as descriptions), :class:`VarLen`, and how tensor masks combine
* ``trace.py``      — :class:`AttentionTrace`, the typed record of intermediates
"""

from qkv.attention.backends import BACKENDS, choose_backend, register_backend
from qkv.attention.functional import attention_trace, scaled_dot_product_attention
from qkv.attention.masks import AttentionMask, VarLen, padding_mask, structural_mask
from qkv.attention.reference import reference_attention
from qkv.attention.trace import AttentionTrace

__all__ = [
    "AttentionMask", "AttentionTrace", "BACKENDS", "VarLen", "attention_trace", "choose_backend", "padding_mask",
    "reference_attention", "register_backend", "scaled_dot_product_attention", "structural_mask",
]
