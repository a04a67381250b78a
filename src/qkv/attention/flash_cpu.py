"""torch's fused CPU flash-attention kernel, with its log-sum-exp, forward and backward — the one
place qkv calls it (the spans path of `qkv.attention.spans`, ring attention's chunks).

    flash_forward(q, k, v, *, scale, causal=False, mask=None, nan_keys=None) -> (out, lse)
    flash_backward(dout, q, k, v, out, lse, *, scale, causal=False, mask=None) -> (dq, dk, dv)

q (B, h, t, d), k and v (B, h_kv, s, d) with h a multiple of h_kv (the kernel serves query head
`i` from key head `i // (h / h_kv)`, GQA without copies) — any strides: overlapping
`as_strided` views of one key tensor are read in place. `mask`: an additive float mask
(0 / −inf) broadcasting to (B, h, t, s); `causal`: top-left. `out` and `lse` passed to the
backward are the *final* (merged over every part) ones: FlashAttention-2's backward needs only
the row's global log-sum-exp (P = exp(S − lse)) and D = rowsum(dO ∘ O), so each part's share of
dQ, dK, dV is computed alone and the shares add up.

What the kernel does that callers must know (torch 2.13,
`aten/src/ATen/native/cpu/FlashAttentionKernel.cpp`):

* a row whose keys are all masked gets out = 0 and lse = 0 (not −inf): callers that mask mark
  such rows themselves (`flash_forward` does, given `mask`);
* a NaN in a query row gives that row out = 0 (callers restore qkv's NaN-in, NaN-out policy);
* a row whose only visible keys hold a NaN gets out = 0 and lse = 0, as if it had no key (the
  kernel's running max skips a NaN score); `flash_forward` makes such rows NaN given
  `nan_keys`, and `nan_key_rows` is that rule for callers of torch's public SDPA;
* q, k and v share one head size; lse is float32 for float32/bfloat16/float16, float64 for float64;
* the work is split statically: (batch, head, block of 32/64/256 query rows) in contiguous
  chunks per thread (`at::parallel_for`, `torch.get_num_threads()`), key blocks of 512.

On other devices or dtypes a plain path does the same math in float32 (float64 stays float64).
"""

from __future__ import annotations

import torch

from qkv.attention.blockwise import any_nan, compute_dtype  # noqa: F401 (any_nan: its callers import it here too)

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
                  causal: bool = False, mask: torch.Tensor | None = None,
                  nan_keys: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (B, h, t, dv), lse (B, h, t)) of softmax(q·kᵀ·scale + mask)·v; rows with no key
    (every mask entry −inf) give out = 0, lse = −inf.

    `nan_keys` (B, h_kv, s) bool, True where a key holds a NaN (callers check once per call
    of theirs and pass None when no key does, which costs nothing): a row that sees such a key
    gets a NaN output and lse, even where the kernel would give 0 (see the module doc)."""
    if uses_kernel(q):
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, causal, attn_mask=_full(mask, q, k), scale=scale)
        if mask is not None:
            empty = torch.isneginf(mask).all(-1)  # (…, t) on the mask as given: small
            if bool(empty.any()):
                lse = lse.masked_fill(empty.expand_as(lse), float("-inf"))
    else:
        s = _plain_scores(q, k, scale, causal, mask)
        lse = s.logsumexp(-1)  # (B, h, t)
        ref = lse.masked_fill(torch.isneginf(lse), 0.0)
        g = q.shape[1] // v.shape[1]
        v = v.repeat_interleave(g, 1) if g > 1 else v
        out = (torch.exp(s - ref.unsqueeze(-1)) @ v.to(s.dtype)).to(q.dtype)
    if nan_keys is not None:
        keep = None if mask is None else ~torch.isneginf(mask)
        seen = nan_key_rows(nan_keys, q.shape[-2], heads=q.shape[1], causal=causal, keep=keep)  # (B, h, t)
        out = out.masked_fill(seen.unsqueeze(-1), float("nan"))
        lse = lse.masked_fill(seen, float("nan"))
    return out, lse


def nan_key_rows(nan_keys: torch.Tensor, t: int, *, heads: int | None = None, causal: bool = False,
                 keep: torch.Tensor | None = None) -> torch.Tensor:
    """The query rows that see a key holding a NaN: (..., h, t) bool — qkv's NaN-in, NaN-out rule
    for keys, written once (the spans path, ring attention's chunks and the fused backend ask it).

    `nan_keys` (..., h_kv, s) bool, True where a key holds a NaN; `heads`: the query heads h
    (a multiple of h_kv: query head i reads key head i // (h / h_kv)); None for inputs without a
    head dim, whose `nan_keys` is (..., s) and result (..., t). `causal`: top-left, row i sees
    keys j ≤ i. `keep`: bool broadcasting to (..., h, t, s), True where the key takes part.
    """
    bad = nan_keys
    if heads is not None and heads != bad.shape[-2]:
        bad = bad.repeat_interleave(heads // bad.shape[-2], dim=-2)  # (..., h, s)
    s = bad.shape[-1]
    if keep is None and not causal:
        return bad.any(-1, keepdim=True).expand(*bad.shape[:-1], t)  # (..., h, t)
    if keep is None:
        seen = bad.cummax(-1).values if s else bad  # (..., h, s): row i sees keys 0…i
        if t > s:  # rows past the last key see every key
            last = seen[..., -1:] if s else bad.new_zeros(*bad.shape[:-1], 1)
            seen = torch.cat([seen, last.expand(*bad.shape[:-1], t - s)], -1)
        return seen[..., :t]
    if causal:
        keep = keep & torch.ones(t, s, dtype=torch.bool, device=keep.device).tril()
    # how many NaN keys each row keeps, by one matmul (no (..., h, t, s) bool is formed when
    # keep is shared by every batch row and head, as the spans path's masks are); counts are
    # exact in float32 below 2**24 keys
    f = torch.float64 if s >= 1 << 24 else torch.float32
    if all(n == 1 for n in keep.shape[:-2]):
        hits = bad.to(f) @ keep.reshape(keep.shape[-2:]).to(f).transpose(0, 1)  # (..., h, t)
    else:
        hits = torch.matmul(keep.to(f), bad.to(f).unsqueeze(-1)).squeeze(-1)  # (..., h, t)
    return hits > 0


def flash_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   out: torch.Tensor, lse: torch.Tensor, *, scale: float, causal: bool = False,
                   mask: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """This part's (dq, dk, dv) from the global `out` (B, h, t, dv) and `lse` (B, h, t);
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
