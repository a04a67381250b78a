"""Merging partial attention results with their log-sum-exps — the one formula ring attention needs.

Attention over keys K = K₁ ∪ K₂ from the results over each part: with ``lse_i = log Σ_{j∈K_i}
exp(s_j)`` and ``out_i`` the softmax-weighted values over K_i,

    lse = log(exp(lse₁) + exp(lse₂)) = m + log(exp(lse₁ − m) + exp(lse₂ − m)),   m = max(lse₁, lse₂)
    out = exp(lse₁ − lse) · out₁ + exp(lse₂ − lse) · out₂

Subtracting m keeps every exponent ≤ 0 (no overflow for scores in the thousands). A row that has
seen no key yet has ``lse = −inf`` and ``out = 0``; ``−inf − (−inf)`` is NaN, so an all-empty pair
uses m = 0 instead and stays (0, −inf). Computed in float32 at least (float64 stays float64).

Example:
    >>> import torch
    >>> s = torch.tensor([[1.0, 2.0, 3.0, 4.0]]); v = torch.arange(4.0)[:, None]   # (1, 4), (4, 1)
    >>> part = lambda a, b: ((s[:, a:b].softmax(-1) @ v[a:b]), s[:, a:b].logsumexp(-1))
    >>> out, lse = merge(*part(0, 2), *part(2, 4))
    >>> torch.allclose(out, s.softmax(-1) @ v), torch.allclose(lse, s.logsumexp(-1))
    (True, True)
"""

from __future__ import annotations

import torch


def merge_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64; everything else merges in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def merge(out1: torch.Tensor, lse1: torch.Tensor, out2: torch.Tensor,
          lse2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) over the union of two disjoint key sets.

    Args:
        out1, out2: (..., t, dv) each part's normalised output (zeros for rows with no key).
        lse1, lse2: (..., t) each part's log-sum-exp of the scaled scores (−inf: no key).

    Returns:
        out (..., t, dv) and lse (..., t) in :func:`merge_dtype` of ``out1``'s dtype.
    """
    dtype = merge_dtype(out1.dtype)
    lse1, lse2 = lse1.to(dtype), lse2.to(dtype)
    lse = lse_of_union(lse1, lse2)  # (..., t), −inf where both are
    ref = lse.masked_fill(lse == float("-inf"), 0.0)
    w1 = torch.exp(lse1 - ref).unsqueeze(-1)  # (..., t, 1), in [0, 1]
    w2 = torch.exp(lse2 - ref).unsqueeze(-1)
    return w1 * out1.to(dtype) + w2 * out2.to(dtype), lse


def merge_into(out: torch.Tensor, lse: torch.Tensor, part_out: torch.Tensor, part_lse: torch.Tensor,
               rows: slice) -> None:
    """:func:`merge` a part covering query rows ``rows`` into the running ``out`` (..., t, dv) and
    ``lse`` (..., t), in place: rescale ``out``'s rows, then add the part's weighted rows
    (``addcmul_``), so a merge allocates nothing of ``out``'s size (the ring's peak memory)."""
    o, old = out[..., rows, :], lse[..., rows]  # views
    new_lse = lse_of_union(old, part_lse.to(lse.dtype))
    ref = new_lse.masked_fill(new_lse == float("-inf"), 0.0)
    o.mul_(torch.exp(old - ref).unsqueeze(-1))
    o.addcmul_(part_out.to(o.dtype), torch.exp(part_lse.to(lse.dtype) - ref).unsqueeze(-1))
    old.copy_(new_lse)


def lse_of_union(lse1: torch.Tensor, lse2: torch.Tensor) -> torch.Tensor:
    """log(exp(lse1) + exp(lse2)), overflow-safe, −inf where both are −inf."""
    m = torch.maximum(lse1, lse2)
    m = m.masked_fill(m == float("-inf"), 0.0)  # rows with no key on either side: exponents stay −inf
    return m + torch.log(torch.exp(lse1 - m) + torch.exp(lse2 - m))
