"""Asking a forward for every row's log-sum-exp instead of some rows' weights: O(t) per head.

``model(ids, trace_rows=LSE)`` makes each :class:`~qkv.modules.MultiHeadAttention` run the
attention with ``return_lse=True`` (the blockwise backend: O(N) memory, the same cost as the
fused kernel) and record an :class:`LseTrace` — the queries and keys it used (after rotary
positions and any q/k norm), its values, each row's log-sum-exp and the mask description. From
these every weight is one dot product away (:func:`qkv.attention_weights`)::

    w_ij = exp(q_i · k_j · scale − lse_i)      (0 where the mask excludes j)

so nothing (t × s) is ever held, and any row, column sum or tile sum can be asked for later
(:mod:`qkv.explain.document`). The request rides on ``trace_rows`` because every model already
threads that argument from its forward to each attention call; the layers pass the record back
in ``LayerTrace.self_attn`` as they pass a row trace.

Example:
    >>> import torch
    >>> from qkv.modules import MultiHeadAttention
    >>> mha = MultiHeadAttention(16, 4)
    >>> rec = mha(torch.randn(1, 300, 16), is_causal=True, trace_rows=LSE).trace
    >>> tuple(rec.query.shape), tuple(rec.lse.shape)               # (b, h, t, d), (b, h, t)
    ((1, 4, 300, 4), (1, 4, 300))
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from qkv.attention.attention_mask import AttentionMask


class LseRequest:
    """The type of :data:`LSE` (``trace_rows=LSE``: record q, k, v and every row's lse)."""

    def __repr__(self) -> str:
        return "LSE"


#: ``trace_rows=LSE``: every attention call records an :class:`LseTrace`.
LSE = LseRequest()


@dataclass(frozen=True)
class LseTrace:
    """What one attention call needs to give any of its weights later, in O(t) numbers per head.

    Fields:
        query: (b, h, t, d) the queries as the kernel read them (after positions, q norm).
        key: (b, h_kv, s, d) the keys, likewise; h_kv < h under GQA/MQA.
        value: (b, h_kv, s, dv) the values.
        lse: (b, h, t) each row's log-sum-exp of its masked, scaled scores (float32; −inf for a
            row with no key).
        mask: the :class:`~qkv.attention.AttentionMask` the call used (a description).
        scale: the scale the scores were multiplied by, or None for 1/√d.
        softcap: the logit soft-cap applied after scaling (Gemma 2), or None.
    """

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    lse: torch.Tensor
    mask: AttentionMask
    scale: float | None = None
    softcap: float | None = None

    @property
    def enable_gqa(self) -> bool:
        return self.key.shape[-3] != self.query.shape[-3]
