"""Sums of attention weights from the saved lse, blockwise: columns and tiles, O(N) memory.

A forward that kept each row's log-sum-exp (`return_lse=True`) can give back any weight
`w_ij = exp(q_i · k_j · scale − lse_i)` ([`qkv.attention_weights`][qkv.attention_weights]). Summing
them over the query rows, one block of rows at a time over the key blocks the mask leaves non-empty,
gives the whole-map quantities without ever holding a (t × s) matrix:

```text
received_j   = Σ_i w_ij                 how much attention key j gets (H2O's eviction score)
weighted_j   = Σ_i r_i w_ij             a row vector times the attention matrix (rollout)
tile_IJ      = Σ_{i∈I, j∈J} w_ij        a (block × block) map of the whole matrix
```

Cost: one q·kᵀ and one exp per visited score (the forward's first half), memory one piece of
scores. Sums are accumulated in float64 across blocks and returned in the arithmetic dtype
(float32; float64 for float64 inputs).

Examples:
    >>> import torch, qkv
    >>> q = k = v = torch.randn(1, 2, 300, 16)                       # (b, h, t, d)
    >>> bm = qkv.create_block_mask(qkv.masks.causal(), None, None, 300, 300)
    >>> out, lse = qkv.scaled_dot_product_attention(q, k, v, block_mask=bm, return_lse=True)
    >>> got = attention_received(q, k, lse, block_mask=bm)             # (b, h, s)
    >>> round(float(got.sum()), 2)                                    # every row sums to 1
    600.0
    >>> attention_block_sums(q, k, lse, block_mask=bm, block=128).shape  # 3 × 3 tiles
    torch.Size([1, 2, 3, 3])
"""

from __future__ import annotations

import math

import torch

from qkv.attention.block_mask import BlockMask, create_block_mask, sliding_window
from qkv.attention.blockwise import PIECE_BYTES, compute_dtype
from qkv.attention.weights import _select, check_query_key_lse


#: the tile side a block map takes by default (the blockwise kernel's own block)
BLOCK = 128


def _mask(block_mask: BlockMask | None, t: int, s: int, block: int | None, device) -> BlockMask:
    """The mask to sweep with: `block_mask` (rebuilt at `block` when its tiles differ), or
    every key when None."""
    if block_mask is None:
        return create_block_mask(sliding_window(None, None), None, None, t, s, block or BLOCK,
                                 device=device)
    if not isinstance(block_mask, BlockMask):
        raise ValueError(f"block_mask must be a BlockMask, got {type(block_mask).__name__}")
    if block is not None and block_mask.block_size != block:
        return create_block_mask(block_mask.mask_mod, block_mask.B, block_mask.H, t, s, block,
                                 q_offset=block_mask.q_offset, k_offset=block_mask.k_offset,
                                 device=device)
    return block_mask


def _sweep(query, key, lse, *, heads, block_mask, block, scale, enable_gqa, row_weights=None):
    """Yield `(r0, k0, p)` per visited piece: the weights `p` (B, H, n, L) of query rows
    r0 … r0 + n − 1 on keys k0 … k0 + L − 1 (the caller accumulates them).

    Blocks of rows where `row_weights` (m, t) are all zero are skipped (nothing of them counts).
    """
    groups = check_query_key_lse(query, key, lse, enable_gqa)
    h, t, d = query.shape[-3:]
    h_kv, s = key.shape[-3], key.shape[-2]
    bm = _mask(block_mask, t, s, block, query.device)
    batch = math.prod(query.shape[:-3])
    bm.check(batch, h, t, s)
    heads = _select("heads", heads, h, query.device)
    c = compute_dtype(query.dtype)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    q = query.reshape(batch, h, t, d).index_select(1, heads).to(c)  # (B, H, t, d)
    k = key.reshape(batch, h_kv, s, d).index_select(1, heads // groups).to(c)  # (B, H, s, d)
    row_lse = lse.reshape(batch, h, t).index_select(1, heads).to(c)  # (B, H, t)
    # rows with no key: lse −inf; subtract +inf there so every weight is exp(−inf) = 0
    row_lse = row_lse.masked_fill(torch.isneginf(row_lse), float("inf")).unsqueeze(-1)
    active = None if row_weights is None else (row_weights != 0).any(0)  # (t,)
    bs = bm.block_size
    per_block = batch * len(heads) * bs * bs * 4
    for r, runs in enumerate(bm.runs):
        r0, r1 = r * bs, min((r + 1) * bs, t)
        if not runs or (active is not None and not bool(active[r0:r1].any())):
            continue
        qb = q[:, :, r0:r1] * scale  # (B, H, n, d)
        lb = row_lse[:, :, r0:r1]  # (B, H, n, 1)
        for c0, c1, full in bm.pieces(r, max(1, PIECE_BYTES // per_block)):
            k0, k1 = c0 * bs, min(c1 * bs, s)
            scores = qb @ k[:, :, k0:k1].transpose(-1, -2)  # (B, H, n, L)
            if not full:
                keep = bm.dense_block(r, c0, c1, device=query.device)  # (B', H', n, L)
                if keep.shape[1] != 1:
                    keep = keep.index_select(1, heads)
                scores = scores.masked_fill_(~keep, float("-inf"))
            yield r0, k0, scores.sub_(lb).exp_()


def _heads_out(query: torch.Tensor, heads) -> tuple:
    """The leading dims of a result: (..., H)."""
    return (*query.shape[:-3], len(_select("heads", heads, query.shape[-3], query.device)))


def attention_received(query: torch.Tensor, key: torch.Tensor, lse: torch.Tensor, *,
                       heads=None, block_mask: BlockMask | None = None,
                       scale: float | None = None, enable_gqa: bool = False,
                       row_weights: torch.Tensor | None = None) -> torch.Tensor:
    """Each key's received weight Σ_i w_ij, or `row_weights` times the attention matrix.

    Args:
        query: (..., h, t, d). key: (..., h_kv, s, d). lse: (..., h, t), the forward's.
        heads: which query heads (None = all; an int, a sequence, a slice).
        block_mask: the mask the forward used (None = every key takes part).
        scale: the forward's scale (default 1/√d).
        row_weights: None (every row counts once), (t,) or (m, t): r with Σ_i r_i w_ij.

    Returns:
        (..., H, s), or (..., H, m, s) for (m, t) row weights; float32 (float64 inputs: float64).
    """
    t, s = query.shape[-2], key.shape[-2]
    one = row_weights is None or row_weights.ndim == 1
    if row_weights is not None:
        if not isinstance(row_weights, torch.Tensor) or row_weights.ndim not in (1, 2) \
                or row_weights.shape[-1] != t:
            raise ValueError(f"row_weights must be a tensor (t,) or (m, t) with t = {t}, got "
                             f"{getattr(row_weights, 'shape', type(row_weights).__name__)}")
        row_weights = row_weights.reshape(-1, t).to(torch.float64)
    m = 1 if row_weights is None else row_weights.shape[0]
    lead = _heads_out(query, heads)
    acc = torch.zeros(math.prod(lead[:-1]), lead[-1], m, s, dtype=torch.float64,
                      device=query.device)  # (B, H, m, s)
    for r0, k0, p in _sweep(query, key, lse, heads=heads, block_mask=block_mask, block=None,
                            scale=scale, enable_gqa=enable_gqa, row_weights=row_weights):
        n, L = p.shape[-2], p.shape[-1]
        if row_weights is None:
            part = p.sum(-2, keepdim=True)  # (B, H, 1, L)
        else:
            part = row_weights[:, r0:r0 + n].to(p.dtype) @ p  # (m, n) @ (B, H, n, L) → (B, H, m, L)
        acc[..., k0:k0 + L] += part
    out = acc.to(compute_dtype(query.dtype))
    out = out.reshape(*lead, m, s)
    return out.squeeze(-2) if one else out


def block_limit(n: int) -> int:
    """The widest tile a block map of an `n`-token text takes: `n` (one tile holds the whole
    text), or `BLOCK` for a shorter text, so the default always fits."""
    return max(n, BLOCK)


def check_block(block, n: int) -> int:
    """`block` when it is a tile side in 1 … `block_limit` (`n`); ValueError naming the
    value and the limit otherwise (a wider tile is the same single tile)."""
    most = block_limit(n)
    if not isinstance(block, int) or isinstance(block, bool) or not 1 <= block <= most:
        raise ValueError(f"block must be a whole number of tokens in 1–{most} (a tile of the "
                         f"{n}-token text at most), got {block!r}")
    return block


def attention_block_sums(query: torch.Tensor, key: torch.Tensor, lse: torch.Tensor, *,
                         heads=None, block_mask: BlockMask | None = None, block: int = BLOCK,
                         scale: float | None = None, enable_gqa: bool = False) -> torch.Tensor:
    """The sum of the weights in every (block × block) tile: (..., H, ⌈t/block⌉, ⌈s/block⌉).

    Tile (I, J) holds Σ w_ij over query rows i in I·block … (I+1)·block − 1 and keys j in
    J·block …; each row of tiles sums to the number of rows it covers that see a key. Same
    arguments as `attention_received`; `block` in 1 … `block_limit` (max(t, s)).

    The sweep runs at the mask's own block size (`block_mask`'s, else `BLOCK`) whatever
    the tile side: memory is one piece of scores plus the tiles, never rows × `block`.
    """
    t, s = query.shape[-2], key.shape[-2]
    check_block(block, max(t, s))
    nq, nk = math.ceil(t / block), math.ceil(s / block)
    lead = _heads_out(query, heads)
    acc = torch.zeros(math.prod(lead[:-1]), lead[-1], nq, nk, dtype=torch.float64,
                      device=query.device)  # (B, H, nq, nk)
    for r0, k0, p in _sweep(query, key, lse, heads=heads, block_mask=block_mask, block=None,
                            scale=scale, enable_gqa=enable_gqa):
        n, L = p.shape[-2], p.shape[-1]
        cols = torch.arange(k0, k0 + L, device=p.device) // block  # (L,) each key's tile column
        # the piece's rows, cut where a row of tiles ends
        for a in [r0, *range((r0 // block + 1) * block, r0 + n, block)]:
            b = min(r0 + n, (a // block + 1) * block)
            part = p[:, :, a - r0:b - r0].sum(-2).to(torch.float64)  # (B, H, L)
            acc[:, :, a // block].index_add_(-1, cols, part)
    return acc.to(compute_dtype(query.dtype)).reshape(*lead, nq, nk)
