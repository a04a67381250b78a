"""Attention weights on demand: the exact softmax rows of chosen queries, from the saved lse.

A long sequence's forward keeps only the log-sum-exp ``lse`` (..., h, t) of each row
(``return_lse=True``); the weights of any row are then one dot product away::

    w_ij = exp(q_i · k_j · scale − lse_i)      (0 where the mask excludes j, or the row has no key)

so explaining one token of a 64k-token text costs O(rows · s) numbers, never (t × s).
(flax's ``dot_product_attention_weights``, split out "for introspection", is the model.)

Example:
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


def _select(name: str, sel, n: int, device) -> torch.Tensor:
    """rows=/heads= (None = all, an int, a sequence, a slice or a 1-D integer tensor) → indices."""
    if sel is None:
        return torch.arange(n, device=device)
    if isinstance(sel, slice):
        return torch.arange(n, device=device)[sel]
    if isinstance(sel, int) and not isinstance(sel, bool):
        sel = [sel]
    idx = torch.as_tensor(sel, device=device)
    if idx.ndim != 1 or idx.is_floating_point() or idx.dtype == torch.bool:
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
    if tuple(lse.shape) != tuple(query.shape[:-1]):
        raise ValueError(f"lse must have shape (..., h, t) = {tuple(query.shape[:-1])}, got "
                         f"{tuple(lse.shape)}")
    groups = h // key.shape[-3] if enable_gqa else 1
    if groups * key.shape[-3] != h:
        raise ValueError(f"query has {h} heads and key {key.shape[-3]}; pass enable_gqa=True for "
                         f"grouped-query attention")
    return groups


def attention_weights(query: torch.Tensor, key: torch.Tensor, lse: torch.Tensor, *,
                      rows: int | Sequence[int] | slice | torch.Tensor | None = None,
                      heads: int | Sequence[int] | slice | torch.Tensor | None = None,
                      block_mask: BlockMask | None = None, scale: float | None = None,
                      enable_gqa: bool = False, softcap: float | None = None,
                      bias: torch.Tensor | None = None) -> torch.Tensor:
    """The softmax weights of query ``rows`` for ``heads``: (..., len(heads), len(rows), s).

    Args:
        query: (..., h, t, d). key: (..., h_kv, s, d) (h_kv divides h with ``enable_gqa``).
        lse: (..., h, t), from ``scaled_dot_product_attention(..., return_lse=True)``.
        rows, heads: which query rows and heads (None = all).
        block_mask: the mask the forward used (None = every key takes part).
        scale: the forward's scale (default 1/√d).
        bias: the forward's float score bias (ALiBi, T5's position bias, a float mask),
            broadcastable to (..., h, t, s), if any.
        softcap: the forward's logit cap (Gemma 2), if any. Sinks need nothing here: the
            forward's lse already counts them, so the weights sum to 1 − the sink's share.

    Returns:
        float32 weights (float64 for float64 inputs), each kept row summing to 1 (0 for a row
        with no key; NaN where the forward's row was NaN).
    """
    groups = check_query_key_lse(query, key, lse, enable_gqa)
    h, t, s = query.shape[-3], query.shape[-2], key.shape[-2]
    if softcap is not None and not (isinstance(softcap, (int, float)) and not isinstance(softcap, bool)
                                    and math.isfinite(softcap) and softcap > 0):
        raise ValueError(f"softcap must be a finite number > 0 or None, got {softcap!r}")
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
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)
    q = query.index_select(-3, heads).index_select(-2, rows).to(compute)  # (..., H, r, d)
    k = key.index_select(-3, heads // groups).to(compute)  # (..., H, s, d)
    row_lse = lse.index_select(-2, heads).index_select(-1, rows).to(compute)  # (..., H, r)
    scores = (q @ k.transpose(-1, -2)) * scale  # (..., H, r, s)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
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
    return (scores - safe).exp()
