"""Asking a forward for every row's log-sum-exp instead of some rows' weights: O(t) per head.

`model(ids, trace_rows=LSE)` makes each [`MultiHeadAttention`][qkv.modules.MultiHeadAttention] run
the attention with `return_lse=True` (the blockwise backend: O(N) memory, the same cost as the
fused kernel) and record an `LseTrace` — the queries and keys it used (after rotary
positions and any q/k norm), its values, each row's log-sum-exp and the mask description. From
these every weight is one dot product away ([`qkv.attention_weights`][qkv.attention_weights]):

```text
w_ij = exp(q_i · k_j · scale − lse_i)      (0 where the mask excludes j)
```

so nothing (t × s) is ever held, and any row, column sum or tile sum can be asked for later
([`qkv.explain.document`][qkv.explain.document]). The request rides on `trace_rows` because every
model already threads that argument from its forward to each attention call; the layers pass the
record back in `LayerTrace.self_attn` as they pass a row trace.

Examples:
    >>> import torch
    >>> from qkv.modules import MultiHeadAttention
    >>> mha = MultiHeadAttention(16, 4)
    >>> rec = mha(torch.randn(1, 300, 16), is_causal=True, trace_rows=LSE).trace
    >>> tuple(rec.query.shape), tuple(rec.lse.shape)               # (b, h, t, d), (b, h, t)
    ((1, 4, 300, 4), (1, 4, 300))
"""

from __future__ import annotations

# The records live beside AttentionTrace (qkv.attention.trace): the one traced attention call
# (qkv.attention.traced) makes them for qkv's own layers and for transformers' alike.
from qkv.attention.trace import LSE, LseRequest, LseTrace

__all__ = ["LSE", "LseRequest", "LseTrace"]
