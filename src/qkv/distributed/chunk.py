"""Attention between one query chunk and one full or diagonal key/value chunk, returning the
log-sum-exp, and its backward from that log-sum-exp — ring attention's per-step work where no mask
is needed inside the pair (partial pairs go to `qkv.attention.blockwise`'s chunk functions).

    chunk_forward(q, k, v, scale=, causal=)                    -> (out, lse)
    chunk_backward(dout, q, k, v, out, lse, scale=, causal=)   -> (dq, dk, dv)

Both are `qkv.attention.flash_cpu` (torch's CPU flash kernel and its backward; a plain path
elsewhere), the one place qkv wraps that kernel. `out` and `lse` passed to the backward are
the *final* (merged over every chunk) ones. q: (B, h, t, d); k, v: (B, h, s, d) (GQA already
expanded); `causal`: top-left causal on a square chunk (every row keeps its diagonal key, so
no row is empty).
"""

from __future__ import annotations

import torch

from qkv.attention.flash_cpu import flash_backward, flash_forward


def chunk_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float,
                  causal: bool = False, nan_keys: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (B, h, t, dv), lse (B, h, t)) of softmax(q·kᵀ·scale)·v, causal or not; `nan_keys`
    (B, h, s) bool or None: rows that see a key holding a NaN give NaN (see `flash_forward`)."""
    return flash_forward(q, k, v, scale=scale, causal=causal, nan_keys=nan_keys)


def chunk_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   out: torch.Tensor, lse: torch.Tensor, *, scale: float,
                   causal: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """This chunk's (dq, dk, dv) from the global `out` (B, h, t, dv) and `lse` (B, h, t)."""
    return flash_backward(dout, q, k, v, out, lse, scale=scale, causal=causal)
