"""Merging partial attention results with their log-sum-exps — the one formula for attention
computed in parts (ring attention's chunks, the spans of `qkv.attention.spans`).

Attention over keys K = K₁ ∪ K₂ from the results over each part: with `lse_i = log Σ_{j∈K_i}
exp(s_j)` and `out_i` the softmax-weighted values over K_i,

    lse = log(exp(lse₁) + exp(lse₂))   (torch.logaddexp: overflow-safe, −inf for two −inf)
    out = exp(lse₁ − lse) · out₁ + exp(lse₂ − lse) · out₂

Every weight's exponent is ≤ 0 (no overflow for scores in the thousands). A row that has seen no
key yet has `lse = −inf` and `out = 0`; `−inf − (−inf)` is NaN, so an all-empty pair
weighs with lse = 0 instead and stays (0, −inf). Computed in float32 at least (float64 stays
float64).

Examples:
    >>> import torch
    >>> s = torch.tensor([[1.0, 2.0, 3.0, 4.0]]); v = torch.arange(4.0)[:, None]   # (1, 4), (4, 1)
    >>> part = lambda a, b: ((s[:, a:b].softmax(-1) @ v[a:b]), s[:, a:b].logsumexp(-1))
    >>> out, lse = part(0, 2)
    >>> merge_into(out, lse, *part(2, 4), rows=slice(None))
    >>> torch.allclose(out, s.softmax(-1) @ v), torch.allclose(lse, s.logsumexp(-1))
    (True, True)
"""

from __future__ import annotations

import torch


def merge_into(out: torch.Tensor, lse: torch.Tensor, part_out: torch.Tensor, part_lse: torch.Tensor,
               rows: slice) -> None:
    """Merge a part covering query rows `rows` into the running `out` (..., t, dv) and
    `lse` (..., t), in place: rescale `out`'s rows, then add the part's weighted rows
    (`addcmul_`), so a merge allocates nothing of `out`'s size (the ring's peak memory).
    `out` and `lse` may be strided views (the spans path merges a call's units at once)."""
    o, old = out[..., rows, :], lse[..., rows]  # views
    new_lse = torch.logaddexp(old, part_lse.to(lse.dtype))  # (..., rows), −inf where both are
    ref = new_lse.masked_fill(new_lse == float("-inf"), 0.0)  # rows with no key: weights exp(−inf) = 0
    o.mul_(torch.exp(old - ref).unsqueeze(-1))
    o.addcmul_(part_out.to(o.dtype), torch.exp(part_lse.to(lse.dtype) - ref).unsqueeze(-1))
    old.copy_(new_lse)


def reduce_parts(out: torch.Tensor, lse: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge the parts laid along `dim` of `out` (…, parts, …, t, dv) and `lse` (…, parts, …, t)
    into one (flash-decoding's last step, the same formula as `merge_into` for many parts);
    `dim` counts from the left and is dropped."""
    total = torch.logsumexp(lse, dim)  # (…, t), −inf where every part is
    ref = total.masked_fill(total == float("-inf"), 0.0)
    w = torch.exp(lse - ref.unsqueeze(dim))  # (…, parts, …, t)
    return (out * w.unsqueeze(-1).to(out.dtype)).sum(dim), total
