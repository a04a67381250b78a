"""Attention weights on demand: the exact softmax rows of chosen queries, from the saved lse.

A long sequence's forward keeps only the log-sum-exp `lse` (..., h, t) of each row
(`return_lse=True`); the weights of any row are then one dot product away:

```text
w_ij = exp(q_i · k_j · scale − lse_i)      (0 where the mask excludes j, or the row has no key)
```

so explaining one token of a 64k-token text costs O(rows · s) numbers, never (t × s).
(flax's `dot_product_attention_weights`, split out "for introspection", is the model.)

Examples:
    >>> import torch, qkv
    >>> q = k = v = torch.randn(1, 2, 1000, 16)                     # (b, h, t, d)
    >>> bm = qkv.create_block_mask(qkv.masks.causal(), None, None, 1000, 1000)
    >>> out, lse = qkv.scaled_dot_product_attention(q, k, v, block_mask=bm, return_lse=True)
    >>> w = qkv.attention_weights(q, k, lse, rows=[0, 999], heads=[1], block_mask=bm)
    >>> tuple(w.shape), round(float(w[0, 0, 1].sum()), 4)          # (b, heads, rows, s)
    ((1, 1, 2, 1000), 1.0)
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from qkv.attention.block_mask import BlockMask
from qkv.attention.blockwise import compute_dtype
from qkv.attention.functional import check_flag, check_softcap, resolve_scale
from qkv.attention.softcap import soft_cap


def _select(name: str, sel, n: int, device) -> torch.Tensor:
    """rows=/heads= (None = all, an int, a sequence, a slice or a 1-D integer tensor) → indices."""
    if sel is None:
        return torch.arange(n, device=device)
    if isinstance(sel, slice):
        return torch.arange(n, device=device)[sel]
    if isinstance(sel, int) and not isinstance(sel, bool):
        sel = [sel]
    try:  # a str, a ragged list, an int beyond int64 ("Overflow when unpacking long long")
        idx = None if isinstance(sel, (str, bytes)) else torch.as_tensor(sel, device=device)
    except (TypeError, ValueError, RuntimeError, OverflowError):
        idx = None
    if idx is None or idx.ndim != 1 or idx.is_floating_point() or idx.dtype == torch.bool:
        raise ValueError(f"{name} must be None, an int, a slice or a 1-D sequence of ints, got {sel!r}")
    if idx.numel() and (int(idx.min()) < -n or int(idx.max()) >= n):
        raise ValueError(f"{name} {idx.tolist()} out of range for {n} {name}")
    return idx % n if n else idx


def check_query_key_lse(query, key, lse, enable_gqa: bool) -> int:
    """ValueError naming the argument unless query (..., h, t, d), key (..., h_kv, s, d) and
    lse (..., h, t) fit together; returns the query heads per key head (1 without GQA)."""
    for name, x in (("query", query), ("key", key), ("lse", lse)):
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if query.ndim < 3 or key.ndim != query.ndim or query.shape[-1] != key.shape[-1] \
            or query.shape[:-3] != key.shape[:-3]:
        raise ValueError(f"query (..., h, t, d) and key (..., h_kv, s, d) must agree, got query "
                         f"{tuple(query.shape)}, key {tuple(key.shape)}")
    h = query.shape[-3]
    if not lse.is_floating_point():  # an lse is a log: an integer one was never a forward's
        raise ValueError(f"lse must be a floating-point tensor (the forward's log-sum-exp), got "
                         f"dtype {lse.dtype}")
    if tuple(lse.shape) != tuple(query.shape[:-1]):
        raise ValueError(f"lse must have shape (..., h, t) = {tuple(query.shape[:-1])}, got "
                         f"{tuple(lse.shape)}")
    groups = h // key.shape[-3] if check_flag("enable_gqa", enable_gqa) and key.shape[-3] else 1
    if groups * key.shape[-3] != h:
        raise ValueError(f"query has {h} heads and key {key.shape[-3]}; pass enable_gqa=True for "
                         f"grouped-query attention")
    return groups


def attention_weights(query: torch.Tensor, key: torch.Tensor, lse: torch.Tensor, *,
                      rows: int | Sequence[int] | slice | torch.Tensor | None = None,
                      heads: int | Sequence[int] | slice | torch.Tensor | None = None,
                      block_mask: BlockMask | None = None, scale: float | None = None,
                      enable_gqa: bool = False, softcap: float | None = None,
                      bias: torch.Tensor | None = None, verify: bool = False) -> torch.Tensor:
    """The softmax weights of query `rows` for `heads`: (..., len(heads), len(rows), s).

    Args:
        query: (..., h, t, d). key: (..., h_kv, s, d) (h_kv divides h with `enable_gqa`).
        lse: (..., h, t), from `scaled_dot_product_attention(..., return_lse=True)`.
        rows, heads: which query rows and heads (None = all).
        block_mask: the mask the forward used (None = every key takes part).
        scale: the forward's scale (default 1/√d).
        bias: the forward's float score bias (ALiBi, T5's position bias, a float mask),
            broadcastable to (..., h, t, s), if any.
        softcap: the forward's logit cap (Gemma 2), if any. Sinks need nothing here: the
            forward's lse already counts them, so the weights sum to 1 − the sink's share.
        verify: check that each returned row sums to 1 (0 for a row with no key), i.e. that
            `lse`, `block_mask`, `scale`, `bias` and `softcap` are the forward's
            (without sinks, whose rows sum to less); ValueError naming the first row that does
            not. The bound is derived in `row_sum_bound`.

    Returns:
        float32 weights (float64 for float64 inputs), each kept row summing to 1 (0 for a row
        with no key; NaN where the forward's row was NaN).
    """
    groups = check_query_key_lse(query, key, lse, enable_gqa)
    h, t, s = query.shape[-3], query.shape[-2], key.shape[-2]
    softcap = check_softcap(softcap)
    scale = resolve_scale(scale, query.shape[-1])
    check_flag("verify", verify)
    if bias is not None:
        want = (*query.shape[:-1], s)
        try:
            ok = bias.is_floating_point() and torch.broadcast_shapes(bias.shape, want) == want
        except (AttributeError, RuntimeError):
            ok = False
        if not ok:
            raise ValueError(f"bias must be a floating-point tensor broadcastable to (..., h, t, s) = "
                             f"{want}, got {getattr(bias, 'shape', type(bias).__name__)}")
    rows = _select("rows", rows, t, query.device)
    heads = _select("heads", heads, h, query.device)
    compute = compute_dtype(query.dtype)
    q = query.index_select(-3, heads).index_select(-2, rows).to(compute)  # (..., H, r, d)
    k = key.index_select(-3, heads // groups).to(compute)  # (..., H, s, d)
    row_lse = lse.index_select(-2, heads).index_select(-1, rows).to(compute)  # (..., H, r)
    scores = (q @ k.transpose(-1, -2)) * scale  # (..., H, r, s)
    if softcap is not None:
        scores = soft_cap(scores, softcap)
    if bias is not None:
        full = bias.expand(*query.shape[:-1], s)  # (..., h, t, s), a view
        scores = scores + full.index_select(-3, heads).index_select(-2, rows).to(compute)
    if block_mask is not None:
        if not isinstance(block_mask, BlockMask):
            raise ValueError(f"block_mask must be a BlockMask, got {type(block_mask).__name__}")
        block_mask.check(math.prod(query.shape[:-3]), h, t, s)
        keep = block_mask.rows_mask(rows, device=query.device)  # (B', H', r, s)
        if keep.shape[1] != 1:
            keep = keep.index_select(1, heads)
        # the mask's batch is the flattened batch dims; one row of it broadcasts over them all
        keep = keep[0] if keep.shape[0] == 1 else keep.reshape(*query.shape[:-3], *keep.shape[1:])
        scores = scores.masked_fill(~keep, float("-inf"))
    # rows with no key: lse −inf; subtract +inf there so every weight is exp(−inf) = 0
    safe = row_lse.masked_fill(torch.isneginf(row_lse), float("inf")).unsqueeze(-1)
    weights = (scores - safe).exp()  # (..., H, r, s)
    if verify:
        _verify(weights, row_lse, row_sum_bound(q, k, row_lse, scale, bias), rows, heads)
    return weights


def row_sum_bound(q: torch.Tensor, k: torch.Tensor, row_lse: torch.Tensor, scale: float,
                  bias: torch.Tensor | None) -> torch.Tensor:
    """(..., H, r): how far each row of
    [`attention_weights`][qkv.attention.weights.attention_weights] may sum from 1 when the lse is
    the forward's, in the compute dtype (eps its machine epsilon, u = eps/2).

    Σ_j w_j = Σ_j exp(s_j − lse) = exp(L − lse)·(1 + e_sum), L the log-sum-exp of the scores
    as recomputed here. Three errors, each first order:

    * e_sum — exp and the s-term sum: ≤ (s + 1)·eps (tests/tolerance.py's
      `softmax_sum_tolerance`: exp's own error is one rounding per term, the sum s − 1).
    * the scores — here and in the forward, q·k over d terms is rounded with error
      ≤ d·u·Σ_l |q_l k_l| ≤ d·u·|q|·|k| (Cauchy–Schwarz), the scale product and a bias add one
      rounding each of |score| ≤ M = scale·|q|·max_j |k_j| + max |bias|; two computations
      (forward, here) of a shift in every score shift L by at most 2·(d + 2)·u·M ≤ (d + 2)·eps·M.
    * the lse itself — stored rounded (u·|lse|) and summed by the forward in blocks (≤ s·u):
      ≤ (|lse| + s)·eps/2, a shift of L − lse by as much.

    exp(x) − 1 ≈ x for these small x, so |Σ w − 1| ≤ eps·(s + 1 + (d + 2)·M + (|lse| + s)/2),
    doubled for the second-order terms and the forward's own kernel (a fused kernel may
    reassociate its sums). An lse from another mask or scale is off by O(1) — e.g. rows summing
    to 2.7 — far outside it.
    """
    eps = torch.finfo(q.dtype).eps
    s, d = k.shape[-2], q.shape[-1]
    magnitude = scale * q.norm(dim=-1) * k.norm(dim=-1).amax(-1, keepdim=True)  # (..., H, r)
    finite_bias = None if bias is None else bias.abs()[torch.isfinite(bias)]  # −inf is a mask
    if finite_bias is not None and finite_bias.numel():
        magnitude = magnitude + float(finite_bias.amax())
    lse = row_lse.masked_fill(~torch.isfinite(row_lse), 0).abs()
    return 2 * eps * (s + 1 + (d + 2) * magnitude + (lse + s) / 2)


def _verify(weights, row_lse, bound, rows, heads) -> None:
    """ValueError at the first row whose sum is not 1 within `bound` (a row with no key sums
    to 0, a NaN row of the forward stays NaN)."""
    total = weights.sum(-1)  # (..., H, r)
    empty = torch.isneginf(row_lse) & (total == 0)
    ok = ((total - 1).abs() <= bound) | empty | torch.isnan(row_lse)
    if bool(ok.all()):
        return
    at = (~ok).nonzero()[0].tolist()  # (..., head index, row index)
    raise ValueError(
        f"lse does not fit these scores: row {int(rows[at[-1]])} of head {int(heads[at[-2]])} sums "
        f"to {float(total[tuple(at)]):.6g}, not 1 (within {float(bound[tuple(at)]):.2g}); pass the "
        f"forward's lse, block_mask, scale, bias and softcap")
