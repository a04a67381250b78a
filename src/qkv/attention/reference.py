"""The readable reference path: the seed documents' arithmetic, one step a line.

This is where the softmax is. Every other backend is tested against it.
"""

from __future__ import annotations

import torch

from qkv.attention.attention_mask import as_additive
from qkv.attention.sinks import merge_sinks
from qkv.attention.softcap import soft_cap
from qkv.attention.trace import AttentionTrace


def reference_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    *,
    scale: float,
    dropout_p: float = 0.0,
    bias: torch.Tensor | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> AttentionTrace:
    """Attention, step by step, returning every intermediate.

    Args:
        query: (..., t, d). key: (..., s, d). value: (..., s, dv) — already with as many heads
            as the query (grouped-query heads repeated by the caller).
        mask: None, bool (True = takes part) or float (added to the scaled scores),
            broadcastable to (..., t, s): an
            [`AttentionMask`][qkv.attention.attention_mask.AttentionMask] already materialised.
        scale: the factor applied to q·kᵀ (usually 1/√d).
        bias: a float score bias (ALiBi) broadcastable to (..., t, s), added to the scaled
            scores before the mask; kept apart from the mask so the trace shows both.
        softcap: logit soft-capping (Gemma 2): the scaled scores become
            `softcap · tanh(scaled / softcap)` (`soft_cap`)
            before bias and mask; `scaled` keeps them uncapped, `masked` capped.
        sinks: (h,) sink logits (gpt-oss), one per head (dim −3): each adds `exp(sinks[h])` to
            its rows' softmax denominator and takes no value, so weights sum to less than 1 and
            `lse` counts the sink (merged as `merge_sinks` merges).
        dropout_p: dropout on the weights (training only); the trace keeps the weights
            before dropout, and `output` is what the forward used.

    Returns:
        An [`AttentionTrace`][qkv.attention.trace.AttentionTrace]. `output` has the query's dtype.
    """
    out_dtype = query.dtype
    # fp16/bf16 inputs: do the arithmetic in fp32, as torch's math kernel does, so that
    # exp() of large scores and the row sums do not lose the few bits these formats have.
    compute = torch.float32 if query.dtype in (torch.float16, torch.bfloat16) else query.dtype
    q, k, v = query.to(compute), key.to(compute), value.to(compute)

    # 1) similarity: the dot product of each query with every key
    scores = q @ k.transpose(-2, -1)  # (..., t, s)
    # 2) scale by 1/√d so the softmax does not saturate as d grows
    scaled = scores * scale  # (..., t, s)
    # squash into (−softcap, softcap), smoothly (Gemma 2)
    capped = scaled if softcap is None else soft_cap(scaled, softcap)  # (..., t, s)
    # 3) bias and mask: a score bias (ALiBi) is added, excluded keys get −inf
    bias = bias.to(compute) if bias is not None else None
    additive = as_additive(mask, compute)  # (..., t, s) broadcastable: 0, −inf, or the float mask
    masked = capped
    if bias is not None:
        masked = masked + bias
    if additive is not None:
        masked = masked + additive
    # 4) softmax over the keys, so each row of weights sums to 1
    lse = torch.logsumexp(masked, dim=-1)  # (..., t)
    empty = torch.isneginf(lse).unsqueeze(-1)  # (..., t, 1) rows with no key at all
    # A row with every key masked has no distribution: give it zero weights (never NaN).
    # Filling it with 0 *before* the softmax keeps the backward free of NaN too.
    weights = torch.softmax(masked.masked_fill(empty, 0.0), dim=-1).masked_fill(empty, 0.0)
    if sinks is not None:  # each row's denominator also holds exp(sink): the weights shrink by it
        weights, lse = merge_sinks(weights, lse, sinks)  # (..., t, s), (..., t)
    # 5) output: the weighted sum of the values
    used = torch.nn.functional.dropout(weights, p=dropout_p) if dropout_p > 0 else weights
    output = (used @ v).to(out_dtype)  # (..., t, dv)
    return AttentionTrace(
        query=q, key=k, value=v, scores=scores, scaled=scaled, bias=bias, mask=additive, masked=masked,
        weights=weights, output=output, lse=lse, scale=float(scale), softcap=softcap,
        sinks=None if sinks is None else sinks.detach(),
    )
