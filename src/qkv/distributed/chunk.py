"""Attention between one query chunk and one key/value chunk, returning the log-sum-exp, and its
backward from that log-sum-exp — the per-step work of ring attention.

    chunk_forward(q, k, v, scale=, causal=, mask=)             -> (out, lse)
    chunk_backward(dout, q, k, v, out, lse, scale=, causal=, mask=) -> (dq, dk, dv)

``out`` and ``lse`` passed to the backward are the *final* (merged over every chunk) ones:
FlashAttention-2's backward needs only the row's global log-sum-exp (P = exp(S − lse)) and
D = rowsum(dO ∘ O), so each chunk's share of dQ, dK, dV is computed alone and the shares add up.

On CPU (float32/float64) both run torch's flash kernel (``_scaled_dot_product_flash_attention_for_cpu``
and its backward), which returns the log-sum-exp; elsewhere a plain path (below) does the same math.
q: (B, h, t, d); k, v: (B, h, s, d) (GQA already expanded); mask: None, or bool (t, s) / (B, h, t, s),
True = takes part; ``causal``: top-left causal on a square chunk. Rows with no key give out 0 and
lse −inf (the kernel's 0 is corrected).
"""

from __future__ import annotations

import torch

_FLASH_DTYPES = (torch.float32, torch.float64)


def _flash(q: torch.Tensor) -> bool:
    return q.device.type == "cpu" and q.dtype in _FLASH_DTYPES and q.ndim == 4


def _additive(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    if mask is None:
        return None
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, float("-inf"))


def chunk_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float,
                  causal: bool = False, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (B, h, t, dv), lse (B, h, t)) of softmax(q·kᵀ·scale, masked)·v; see the module doc."""
    if _flash(q):
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, causal, attn_mask=_additive(mask, q.dtype), scale=scale)
    else:
        s = (q.float() @ k.float().transpose(-1, -2)) * scale  # (B, h, t, s)
        keep = mask
        if causal:
            keep = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril()
        if keep is not None:
            s = s.masked_fill(~keep, float("-inf"))
        lse = s.logsumexp(-1)  # (B, h, t)
        p = torch.exp(s - lse.masked_fill(lse == float("-inf"), 0.0).unsqueeze(-1))
        out = (p @ v.float()).to(q.dtype)
    if mask is not None:  # the kernel reports lse 0 for a row with no key; the merge needs −inf
        lse = lse.masked_fill(~mask.any(-1).expand_as(lse), float("-inf"))
    return out, lse


def chunk_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   out: torch.Tensor, lse: torch.Tensor, *, scale: float, causal: bool = False,
                   mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """This chunk's (dq, dk, dv) from the global ``out`` (B, h, t, dv) and ``lse`` (B, h, t)."""
    lse = lse.masked_fill(lse == float("-inf"), 0.0)  # a row with no key anywhere: P = 0 by the mask
    if _flash(q):
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            dout.contiguous(), q, k, v, out.contiguous(), lse.to(q.dtype).contiguous(), 0.0, causal,
            attn_mask=_additive(mask, q.dtype), scale=scale)
    f = torch.float32 if q.dtype != torch.float64 else q.dtype
    qf, kf, vf, dof = q.to(f), k.to(f), v.to(f), dout.to(f)
    s = (qf @ kf.transpose(-1, -2)) * scale  # (B, h, t, s)
    keep = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril() if causal else mask
    p = torch.exp(s - lse.to(f).unsqueeze(-1))
    if keep is not None:
        p = p.masked_fill(~keep, 0.0)
    dv = p.transpose(-1, -2) @ dof  # (B, h, s, dv)
    dp = dof @ vf.transpose(-1, -2)  # (B, h, t, s)
    d = (dof * out.to(f)).sum(-1, keepdim=True)  # (B, h, t, 1)
    ds = p * (dp - d) * scale
    return (ds @ kf).to(q.dtype), (ds.transpose(-1, -2) @ qf).to(q.dtype), dv.to(q.dtype)
