"""Attention between one query chunk and one full or diagonal key/value chunk, returning the
log-sum-exp, and its backward from that log-sum-exp — ring attention's per-step work where no mask
is needed inside the pair (partial pairs go to :mod:`qkv.attention.blockwise`'s chunk functions).

    chunk_forward(q, k, v, scale=, causal=)                    -> (out, lse)
    chunk_backward(dout, q, k, v, out, lse, scale=, causal=)   -> (dq, dk, dv)

``out`` and ``lse`` passed to the backward are the *final* (merged over every chunk) ones:
FlashAttention-2's backward needs only the row's global log-sum-exp (P = exp(S − lse)) and
D = rowsum(dO ∘ O), so each chunk's share of dQ, dK, dV is computed alone and the shares add up.

On CPU (float32/float64) both run torch's flash kernel (``_scaled_dot_product_flash_attention_for_cpu``
and its backward), which returns the log-sum-exp; elsewhere a plain path does the same math.
q: (B, h, t, d); k, v: (B, h, s, d) (GQA already expanded); ``causal``: top-left causal on a
square chunk (every row keeps its diagonal key, so no row is empty).
"""

from __future__ import annotations

import torch

from qkv.attention.blockwise import compute_dtype

_FLASH_DTYPES = (torch.float32, torch.float64)


def _flash(q: torch.Tensor) -> bool:
    return q.device.type == "cpu" and q.dtype in _FLASH_DTYPES and q.ndim == 4


def _plain_scores(q, k, scale, causal):
    f = compute_dtype(q.dtype)
    s = (q.to(f) @ k.to(f).transpose(-1, -2)) * scale  # (B, h, t, s)
    if causal:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril(),
                          float("-inf"))
    return s


def chunk_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float,
                  causal: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (B, h, t, dv), lse (B, h, t)) of softmax(q·kᵀ·scale)·v, causal or not."""
    if _flash(q):
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, causal, scale=scale)
    s = _plain_scores(q, k, scale, causal)
    lse = s.logsumexp(-1)  # (B, h, t)
    return (torch.exp(s - lse.unsqueeze(-1)) @ v.to(s.dtype)).to(q.dtype), lse


def chunk_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   out: torch.Tensor, lse: torch.Tensor, *, scale: float,
                   causal: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """This chunk's (dq, dk, dv) from the global ``out`` (B, h, t, dv) and ``lse`` (B, h, t)."""
    lse = lse.masked_fill(lse == float("-inf"), 0.0)  # a row with no key anywhere contributes 0
    if _flash(q):
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            dout.contiguous(), q, k, v, out.contiguous(), lse.to(q.dtype).contiguous(), 0.0, causal,
            scale=scale)
    s = _plain_scores(q, k, scale, causal)
    f = s.dtype
    p = torch.exp(s - lse.to(f).unsqueeze(-1))  # (B, h, t, s)
    dof = dout.to(f)
    dv = p.transpose(-1, -2) @ dof  # (B, h, s, dv)
    d = (dof * out.to(f)).sum(-1, keepdim=True)  # (B, h, t, 1)
    ds = p * (dof @ v.to(f).transpose(-1, -2) - d) * scale  # (B, h, t, s)
    return (ds @ k.to(f)).to(q.dtype), (ds.transpose(-1, -2) @ q.to(f)).to(q.dtype), dv.to(q.dtype)
