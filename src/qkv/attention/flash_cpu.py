"""torch's fused CPU flash-attention kernel, with its log-sum-exp, forward and backward — the one
place qkv calls it (the spans path of :mod:`qkv.attention.spans`, ring attention's chunks).

    flash_forward(q, k, v, *, scale, causal=False, mask=None)                -> (out, lse)
    flash_backward(dout, q, k, v, out, lse, *, scale, causal=False, mask=None) -> (dq, dk, dv)

q (B, h, t, d), k and v (B, h_kv, s, d) with h a multiple of h_kv (the kernel serves query head
``i`` from key head ``i // (h / h_kv)``, GQA without copies) — any strides: overlapping
``as_strided`` views of one key tensor are read in place. ``mask``: an additive float mask
(0 / −inf) broadcasting to (B, h, t, s); ``causal``: top-left. ``out`` and ``lse`` passed to the
backward are the *final* (merged over every part) ones: FlashAttention-2's backward needs only
the row's global log-sum-exp (P = exp(S − lse)) and D = rowsum(dO ∘ O), so each part's share of
dQ, dK, dV is computed alone and the shares add up.

What the kernel does that callers must know (torch 2.13, ``aten/src/ATen/native/cpu/FlashAttentionKernel.cpp``):

* a row whose keys are all masked gets out = 0 and lse = 0 (not −inf): callers that mask mark
  such rows themselves (:func:`flash_forward` does, given ``mask``);
* a NaN in a query row gives that row out = 0 (callers restore qkv's NaN-in, NaN-out policy);
* q, k and v share one head size; lse is float32 for float32/bfloat16/float16, float64 for float64;
* the work is split statically: (batch, head, block of 32/64/256 query rows) in contiguous
  chunks per thread (``at::parallel_for``, ``torch.get_num_threads()``), key blocks of 512.

On other devices or dtypes a plain path does the same math in float32 (float64 stays float64).
"""

from __future__ import annotations

import torch

from qkv.attention.blockwise import compute_dtype

KERNEL_DTYPES = (torch.float32, torch.float64)
"""The dtypes qkv runs the CPU kernel in (half types are computed in float32 by the callers)."""


def uses_kernel(q: torch.Tensor) -> bool:
    return q.device.type == "cpu" and q.dtype in KERNEL_DTYPES and q.ndim == 4


def _full(mask: torch.Tensor | None, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor | None:
    """The kernel takes a 4-D mask; a smaller one is expanded (a view: strides 0, no copy)."""
    return None if mask is None else mask.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])


def _plain_scores(q, k, scale, causal, mask):
    f = compute_dtype(q.dtype)
    g = q.shape[1] // k.shape[1]
    k = k.to(f).repeat_interleave(g, 1) if g > 1 else k.to(f)
    s = (q.to(f) @ k.transpose(-1, -2)) * scale  # (B, h, t, s)
    if causal:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril(),
                          float("-inf"))
    if mask is not None:
        s = s + mask.to(f)
    return s


def flash_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float,
                  causal: bool = False, mask: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (B, h, t, dv), lse (B, h, t)) of softmax(q·kᵀ·scale + mask)·v; rows with no key
    (every mask entry −inf) give out = 0, lse = −inf."""
    if uses_kernel(q):
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, causal, attn_mask=_full(mask, q, k), scale=scale)
        if mask is not None:
            empty = torch.isneginf(mask).all(-1)  # (…, t) on the mask as given: small
            if bool(empty.any()):
                lse = lse.masked_fill(empty.expand_as(lse), float("-inf"))
        return out, lse
    s = _plain_scores(q, k, scale, causal, mask)
    lse = s.logsumexp(-1)  # (B, h, t)
    ref = lse.masked_fill(torch.isneginf(lse), 0.0)
    g = q.shape[1] // v.shape[1]
    v = v.repeat_interleave(g, 1) if g > 1 else v
    return (torch.exp(s - ref.unsqueeze(-1)) @ v.to(s.dtype)).to(q.dtype), lse


def flash_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   out: torch.Tensor, lse: torch.Tensor, *, scale: float, causal: bool = False,
                   mask: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """This part's (dq, dk, dv) from the global ``out`` (B, h, t, dv) and ``lse`` (B, h, t);
    dk, dv come back shaped like k, v (summed over the query heads a key head serves)."""
    lse = lse.masked_fill(lse == float("-inf"), 0.0)  # a row with no key anywhere contributes 0
    if uses_kernel(q):
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            dout, q, k, v, out, lse.to(q.dtype), 0.0, causal, attn_mask=_full(mask, q, k), scale=scale)
    s = _plain_scores(q, k, scale, causal, mask)
    f = s.dtype
    g = q.shape[1] // k.shape[1]
    kf, vf = (x.to(f).repeat_interleave(g, 1) if g > 1 else x.to(f) for x in (k, v))
    p = torch.exp(s - lse.to(f).unsqueeze(-1))  # (B, h, t, s)
    dof = dout.to(f)
    dv = p.transpose(-1, -2) @ dof  # (B, h, s, dv)
    d = (dof * out.to(f)).sum(-1, keepdim=True)  # (B, h, t, 1)
    ds = p * (dof @ vf.transpose(-1, -2) - d) * scale  # (B, h, t, s)
    dk = ds.transpose(-1, -2) @ q.to(f)
    if g > 1:
        dk = dk.unflatten(1, (-1, g)).sum(2)
        dv = dv.unflatten(1, (-1, g)).sum(2)
    return (ds @ kf).to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
