"""Blockwise attention: the online softmax (FlashAttention-2), forward and backward, O(N) memory.

This is where the *online* softmax is (the one-pass softmax of `reference.py` made blockwise).
For each block of `block_size` query rows, the key blocks that a
[`BlockMask`][qkv.attention.block_mask.BlockMask] marks non-empty are visited in runs of consecutive
blocks (one matmul per run, all heads and grouped-query heads at once); full blocks are computed
unmasked, partial ones masked, empty ones never touched. A running maximum `m`, sum `l` and output
`acc` are rescaled as each run arrives (Milakov & Gimelshein 2018; Dao 2023, *FlashAttention-2*,
Algorithm 1):

```text
m' = max(m, rowmax(S))          p = exp(S − m')        α = exp(m − m')
l' = α·l + rowsum(p)            acc' = α·acc + p·V
out = acc / l                   lse = m + log l        (−inf and out = 0 for a row with no key)
```

The backward recomputes each block's probabilities from the saved `lse` (Algorithm 2):
`P = exp(S − lse)`, `dV += Pᵀ dO`, `dP = dO Vᵀ`, `dS = P ∘ (dP − D)` with
`D = rowsum(dO ∘ O)`, `dQ += dS K · scale`, `dK += dSᵀ Q · scale`: no (t × s) tensor is
ever held, so memory stays O(N).

Arithmetic is float32 for float16/bfloat16 inputs (float64 stays float64); `lse` is float32
(float64 for float64 inputs). A NaN in a query row makes that row's output and lse NaN (qkv's
policy on every backend, see
[`qkv.scaled_dot_product_attention`][qkv.scaled_dot_product_attention]).

Functions (shapes: query (..., h, t, d), key (..., h_kv, s, d), value (..., h_kv, s, dv)):

* `blockwise_attention(q, k, v, block_mask, *, scale, enable_gqa=False) -> (out, lse)` —
  differentiable (an `autograd.Function`); `lse` is differentiable too.
* `blockwise_forward(q, k, v, block_mask, *, scale, enable_gqa=False) -> (out, lse)` and
  `blockwise_backward(q, k, v, out, dout, lse, block_mask, *, scale, enable_gqa=False,
  dlse=None) -> (dq, dk, dv)` — the two halves, pure functions without autograd.
* For one (query chunk, key/value chunk) pair of a longer sequence (ring attention):

```text
forward_chunk(q, k, v, *, mask_mod=None, q_offset=0, k_offset=0, scale=None,
              enable_gqa=False, block_size=128) -> (out, lse)
backward_chunk(q, k, v, out, dout, lse, *, dlse=None, mask_mod=None, q_offset=0,
               k_offset=0, scale=None, enable_gqa=False, block_size=128) -> (dq, dk, dv)
```

  `mask_mod` is evaluated at *global* indices `q_offset + i`, `k_offset + j`
  (e.g. `qkv.masks.causal()`; None = every key). Partial results of chunks merge by lse:
  `lse = logaddexp(lse₁, lse₂)`, `out = out₁·exp(lse₁ − lse) + out₂·exp(lse₂ − lse)`.

Examples:
    >>> import torch, qkv
    >>> q = k = v = torch.randn(1, 2, 300, 16)
    >>> bm = qkv.create_block_mask(qkv.masks.sliding_window(64, 0), None, None, 300, 300)
    >>> out, lse = blockwise_attention(q, k, v, bm, scale=0.25)
    >>> ref = qkv.scaled_dot_product_attention(q, k, v, window=(64, 0), is_causal=True, backend="reference")
    >>> bool((out - ref).abs().max() < 1e-5), tuple(lse.shape)
    (True, (1, 2, 300))
"""

from __future__ import annotations

import math

import torch
from torch.autograd.function import once_differentiable

from qkv.attention.block_mask import BlockMask, create_block_mask, sliding_window
from qkv.attention.softcap import soft_cap

_NEG_INF = float("-inf")


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype attention arithmetic and its lse run in: float64 stays float64, all else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


class Layout:
    """q, k, v viewed as (B, h_kv, g, t, d) / (B, h_kv, s, d): B the flattened batch dims,
    g the query heads per key/value head (1 without GQA)."""

    def __init__(self, q: torch.Tensor, k: torch.Tensor, enable_gqa: bool):
        self.rank = q.ndim
        self.t, self.s, self.d = q.shape[-2], k.shape[-2], q.shape[-1]
        self.lead = tuple(q.shape[:-3]) if q.ndim >= 3 else ()
        self.h = q.shape[-3] if q.ndim >= 3 else 1
        self.h_kv = k.shape[-3] if k.ndim >= 3 else 1
        self.g = self.h // self.h_kv if enable_gqa else 1
        if self.g == 1:
            self.h_kv = self.h
        self.b = math.prod(self.lead)

    def queries(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(self.b, self.h_kv, self.g, self.t, x.shape[-1])  # (B, h_kv, g, t, ·)

    def keys(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(self.b, self.h_kv, self.s, x.shape[-1])  # (B, h_kv, s, ·)

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(self.b, self.h_kv, self.g, self.t)  # (B, h_kv, g, t)

    def back_q(self, x: torch.Tensor) -> torch.Tensor:
        if self.rank == 2:
            return x.reshape(self.t, x.shape[-1])
        return x.reshape(*self.lead, self.h, self.t, x.shape[-1])  # (..., h, t, ·)

    def back_k(self, x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        return x.reshape(like.shape)

    def back_rows(self, x: torch.Tensor) -> torch.Tensor:
        if self.rank == 2:
            return x.reshape(self.t)
        return x.reshape(*self.lead, self.h, self.t)  # (..., h, t)


def check_block_mask(bm: BlockMask, lay: Layout) -> None:
    """The mask's batch is the inputs' batch dims flattened (b for (b, h, t, d) inputs)."""
    if not isinstance(bm, BlockMask):
        raise ValueError(f"block_mask must be a qkv BlockMask (qkv.create_block_mask), got "
                         f"{type(bm).__name__}")
    bm.check(lay.b, lay.h, lay.t, lay.s)


class _RunMasks:
    """The additive masks (0 / −inf) of partial runs, in the scores' 3-D layout.

    Added by `baddbmm` in the same pass as q·kᵀ (no separate masking pass). For a mask that
    depends only on k − q (causal, windows) every run at the same offset has the same mask:
    it is built once and reused (a sliding window builds one or two per call).
    """

    def __init__(self, bm: BlockMask, lay: Layout, dtype: torch.dtype, device):
        self.bm, self.lay, self.dtype, self.device = bm, lay, dtype, device
        self.invariant = getattr(bm.mask_mod, "shift_invariant", False) and bm.tiles is None
        self.cache: dict = {}

    def __call__(self, row: int, c0: int, c1: int) -> torch.Tensor:
        bs, lay = self.bm.block_size, self.lay
        q0, k0 = row * bs, c0 * bs
        n, L = min(q0 + bs, lay.t) - q0, min(c1 * bs, lay.s) - k0
        key = (k0 - q0, n, L) if self.invariant else None
        got = self.cache.get(key) if key is not None else None
        if got is None:
            got = self._build(row, c0, c1)
            if key is not None:
                self.cache[key] = got
        return got

    def _build(self, row, c0, c1) -> torch.Tensor:
        lay = self.lay
        m = self.bm.dense_block(row, c0, c1, device=self.device)  # (B', H', bq, L) bool
        Bm, Hm, bq, L = m.shape
        if Hm == lay.h and lay.h > 1:
            m = m.reshape(Bm, lay.h_kv, lay.g * bq, L)  # query heads grouped as the scores are
        elif lay.g > 1:
            m = m.unsqueeze(2).expand(Bm, 1, lay.g, bq, L).reshape(Bm, 1, lay.g * bq, L)
        if Bm * m.shape[1] == 1:
            m = m.reshape(1, m.shape[2], L)  # broadcasts over every (batch, head)
        else:
            m = m.expand(lay.b, lay.h_kv, m.shape[2], L).reshape(lay.b * lay.h_kv, m.shape[2], L)
        return torch.zeros(m.shape, dtype=self.dtype, device=self.device).masked_fill_(~m, _NEG_INF)


# The scores of one piece, (B·h_kv, g·bq, L) floats, are swept five times (mask + matmul, max,
# exp, sum, matmul); cutting long rows into pieces keeps them near the cache, but each piece
# costs Python calls and a smaller matmul. Measured (benchmarks/long.py's shapes, N = 8k, one
# thread, 4 paired rounds): 2 MiB pieces (8 blocks of 128 keys for 4 heads) beat 256 KiB ones by
# ~5-15 % on causal and document masks and tie on a window; longer rows than that gain nothing.
PIECE_BYTES = 1 << 21


def _max_blocks(bm: BlockMask, lay: Layout) -> int:
    per_block = lay.b * lay.h_kv * lay.g * bm.block_size * bm.block_size * 4
    return max(1, PIECE_BYTES // per_block)


def _scores(qb: torch.Tensor, kr: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """qb (BH, n, d) · kr (BH, L, d)ᵀ (+ the additive mask): (BH, n, L)."""
    if bias is None:
        return torch.bmm(qb, kr.transpose(1, 2))
    return torch.baddbmm(bias, qb, kr.transpose(1, 2))


def _capped(qb: torch.Tensor, kr: torch.Tensor, mask: torch.Tensor | None,
            softcap: float | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The scores with Gemma 2's soft-capping `c·tanh(s/c)` before the mask: (scores, tanh)
    — the tanh kept for the backward's `1 − tanh²` (None without a cap)."""
    if softcap is None:
        return _scores(qb, kr, mask), None
    scores, th = soft_cap(torch.bmm(qb, kr.transpose(1, 2)), softcap, inplace=True,
                          keep_tanh=True)  # (BH, n, L) each
    return (scores if mask is None else scores.add_(mask)), th


def blockwise_forward(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      block_mask: BlockMask, *, scale: float, enable_gqa: bool = False,
                      softcap: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The online-softmax forward: `(out (..., h, t, dv), lse (..., h, t))` (see the module doc).
    `softcap`: scaled scores become `softcap·tanh(s/softcap)` before the mask (Gemma 2)."""
    lay = Layout(query, key, enable_gqa)
    check_block_mask(block_mask, lay)
    c = compute_dtype(query.dtype)
    bs, t, s, BH = block_mask.block_size, lay.t, lay.s, lay.b * lay.h_kv
    # no copies of q, k, v in float32 (extra memory is the output, lse and one block's scores)
    q = lay.queries(query.to(c))  # (B, h_kv, g, t, d)
    k = lay.keys(key.to(c)).reshape(BH, s, lay.d)  # (B·h_kv, s, d)
    v = lay.keys(value.to(c))
    dv = v.shape[-1]
    v = v.reshape(BH, s, dv)  # (B·h_kv, s, dv)
    out = q.new_zeros(lay.b, lay.h_kv, lay.g, t, dv)  # (B, h_kv, g, t, dv)
    lse = q.new_full((lay.b, lay.h_kv, lay.g, t), _NEG_INF)  # (B, h_kv, g, t)
    masks = _RunMasks(block_mask, lay, c, q.device)
    pieces = _max_blocks(block_mask, lay)
    for r, runs in enumerate(block_mask.runs):
        if not runs:
            continue  # no key for any row of the block: zeros, lse −inf
        r0, r1 = r * bs, min((r + 1) * bs, t)
        n = lay.g * (r1 - r0)
        qb = q[:, :, :, r0:r1].reshape(BH, n, lay.d) * scale  # (B·h_kv, g·bq, d), scaled once per block
        m = l = acc = m_safe_old = None
        for c0, c1, full in block_mask.pieces(r, pieces):
            k0, k1 = c0 * bs, min(c1 * bs, s)
            scores, _ = _capped(qb, k[:, k0:k1], None if full else masks(r, c0, c1), softcap)  # (BH, n, L)
            m_new = scores.amax(-1, keepdim=True)  # (BH, n, 1)
            if m is not None:
                m_new = torch.maximum(m, m_new)
            # a row with no key so far has max −inf; subtract 0 there so exp gives 0, not NaN
            m_safe = m_new.masked_fill(m_new == _NEG_INF, 0.0)
            p = scores.sub_(m_safe).exp_()  # (BH, n, L)
            pv = torch.bmm(p, v[:, k0:k1])  # (BH, n, dv)
            if acc is None:
                l, acc = p.sum(-1, keepdim=True), pv
            else:
                alpha = (m_safe_old - m_safe).exp_()  # rescale what the earlier pieces summed
                l = l.mul_(alpha).add_(p.sum(-1, keepdim=True))
                acc = acc.mul_(alpha).add_(pv)
            m, m_safe_old = m_new, m_safe
        acc = acc.div_(l.masked_fill(l == 0, 1.0))  # l = 0 only where acc = 0: the row stays 0
        out[:, :, :, r0:r1] = acc.view(lay.b, lay.h_kv, lay.g, r1 - r0, dv)
        lse[:, :, :, r0:r1] = (m_safe_old + l.log()).view(lay.b, lay.h_kv, lay.g, r1 - r0)
    propagate_nan_rows(query, lay, out, lse)
    return lay.back_q(out).to(query.dtype), lay.back_rows(lse)


def any_nan(x: torch.Tensor) -> bool:
    """Whether `x` holds a NaN: the one check per call on the path without NaN. `amax`
    propagates NaN and reads `x` once without a bool copy (4 × 16k × 64 floats, one thread:
    0.6 ms against 8 ms for `isnan().any(-1)` on a 2-core AMD EPYC)."""
    return x.numel() > 0 and bool(x.amax().isnan())


def propagate_nan_rows(query: torch.Tensor, lay: Layout, out: torch.Tensor, lse: torch.Tensor) -> None:
    """NaN in → NaN out: a query row holding a NaN gives a NaN output row and lse, even where
    the mask leaves it no key (the policy every backend follows)."""
    if not any_nan(query):  # the common case, without a bool copy of the query
        return
    bad = query.isnan().any(-1)  # (..., h, t)
    if bool(bad.any()):
        bad = lay.rows(bad)
        out.masked_fill_(bad.unsqueeze(-1), float("nan"))
        lse.masked_fill_(bad, float("nan"))


def blockwise_backward(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       out: torch.Tensor, dout: torch.Tensor, lse: torch.Tensor,
                       block_mask: BlockMask, *, scale: float, enable_gqa: bool = False,
                       dlse: torch.Tensor | None = None,
                       softcap: float | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FlashAttention-2's backward: `(dq, dk, dv)` shaped like query, key, value.

    `dlse` (..., h, t), optional: the gradient reaching `lse` (∂lse/∂S = P adds
    `dlse · P` to dS), for callers that merge chunks by their log-sum-exp.
    """
    lay = Layout(query, key, enable_gqa)
    check_block_mask(block_mask, lay)
    c = compute_dtype(query.dtype)
    bs, t, s, BH = block_mask.block_size, lay.t, lay.s, lay.b * lay.h_kv
    q = lay.queries(query.to(c))  # (B, h_kv, g, t, d)
    k = lay.keys(key.to(c)).reshape(BH, s, lay.d)  # (BH, s, d)
    v = lay.keys(value.to(c))
    v = v.reshape(BH, s, v.shape[-1])  # (BH, s, dv)
    do = lay.queries(dout.to(c))  # (B, h_kv, g, t, dv)
    o = lay.queries(out.to(c))  # (B, h_kv, g, t, dv)
    dlse4 = lay.rows(dlse.to(c)) if dlse is not None else None
    lse4 = lay.rows(lse.to(c))
    lse4 = lse4.masked_fill(lse4 == _NEG_INF, float("inf"))  # rows with no key: P = exp(−inf) = 0
    dq = torch.zeros_like(q)
    dk, dvv = torch.zeros_like(k), torch.zeros_like(v)
    masks = _RunMasks(block_mask, lay, c, q.device)
    pieces = _max_blocks(block_mask, lay)
    for r, runs in enumerate(block_mask.runs):
        if not runs:
            continue
        r0, r1 = r * bs, min((r + 1) * bs, t)
        n = lay.g * (r1 - r0)
        qb = q[:, :, :, r0:r1].reshape(BH, n, lay.d) * scale  # (BH, g·bq, d)
        dob = do[:, :, :, r0:r1].reshape(BH, n, do.shape[-1])  # (BH, g·bq, dv)
        lse_b = lse4[:, :, :, r0:r1].reshape(BH, n, 1)
        # D = rowsum(dO ∘ O), per block so that no (t, dv) temporary is held
        delta_b = (dob * o[:, :, :, r0:r1].reshape(BH, n, -1)).sum(-1, keepdim=True)  # (BH, g·bq, 1)
        if dlse4 is not None:
            delta_b -= dlse4[:, :, :, r0:r1].reshape(BH, n, 1)
        dq_b = None
        for c0, c1, full in block_mask.pieces(r, pieces):
            k0, k1 = c0 * bs, min(c1 * bs, s)
            kr, vr = k[:, k0:k1], v[:, k0:k1]
            p, th = _capped(qb, kr, None if full else masks(r, c0, c1), softcap)  # (BH, n, L)
            p = p.sub_(lse_b).exp_()  # P, recomputed from the saved lse
            dvv[:, k0:k1].baddbmm_(p.transpose(1, 2), dob)  # dV += Pᵀ dO, in place
            ds = torch.bmm(dob, vr.transpose(1, 2)).sub_(delta_b).mul_(p)  # dS = P ∘ (dP − D)
            if th is not None:  # through the cap: d(c·tanh(s/c))/ds = 1 − tanh²
                ds.mul_(th.square_().neg_().add_(1.0))
            dq_b = torch.bmm(ds, kr) if dq_b is None else dq_b.baddbmm_(ds, kr)  # (BH, n, d)
            dk[:, k0:k1].baddbmm_(ds.transpose(1, 2), qb)  # dK += dSᵀ Q (q carries the scale)
        dq[:, :, :, r0:r1] = dq_b.view(lay.b, lay.h_kv, lay.g, r1 - r0, lay.d)
    dq = dq.mul_(scale)
    return (lay.back_q(dq).to(query.dtype), lay.back_k(dk, key).to(key.dtype),
            lay.back_k(dvv, value).to(value.dtype))


class LseAttention(torch.autograd.Function):
    """`(out, lse)` of a forward/backward pair with FlashAttention-2's contract (the backward
    recomputes from the saved lse and takes a gradient reaching lse as `dlse`): this file's
    pure-torch pair and `spans.py`'s fused one. `block_mask` and `options` (scale, GQA,
    softcap) are constants."""

    @staticmethod
    def forward(ctx, pair, query, key, value, block_mask, options):
        ctx.set_materialize_grads(False)
        out, lse = pair[0](query, key, value, block_mask, **options)
        ctx.save_for_backward(query, key, value, out, lse)
        ctx.pair, ctx.block_mask, ctx.options = pair, block_mask, options
        return out, lse

    @staticmethod
    @once_differentiable
    def backward(ctx, dout, dlse):
        query, key, value, out, lse = ctx.saved_tensors
        if dout is None:
            dout = torch.zeros_like(out)
        dq, dk, dv = ctx.pair[1](query, key, value, out, dout, lse, ctx.block_mask, dlse=dlse,
                                 **ctx.options)
        return None, dq, dk, dv, None, None


def differentiable(pair, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   block_mask: BlockMask, **options) -> tuple[torch.Tensor, torch.Tensor]:
    """`pair = (forward, backward)`'s `(out, lse)`, through `LseAttention` when a
    gradient is wanted, the forward alone otherwise."""
    if torch.is_grad_enabled() and any(x.requires_grad for x in (query, key, value)):
        return LseAttention.apply(pair, query, key, value, block_mask, options)
    return pair[0](query, key, value, block_mask, **options)


def blockwise_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        block_mask: BlockMask, *, scale: float, enable_gqa: bool = False,
                        softcap: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Differentiable blockwise attention: `(out (..., h, t, dv), lse (..., h, t))`."""
    return differentiable((blockwise_forward, blockwise_backward), query, key, value, block_mask,
                          scale=float(scale), enable_gqa=bool(enable_gqa), softcap=softcap)


# -- one chunk of a longer sequence (ring attention) ---------------------------------------------
def _chunk_mask(q, k, mask_mod, q_offset, k_offset, block_size) -> BlockMask:
    # B = H = None: a custom mask_mod is called with b = h = 0, the same for every batch row
    # and head (the built-ins carry their own per-batch data, e.g. document ids (B, N)).
    mod = mask_mod if mask_mod is not None else sliding_window(None, None)
    return create_block_mask(mod, None, None, q.shape[-2], k.shape[-2], block_size,
                             q_offset=q_offset, k_offset=k_offset, device=q.device)


def forward_chunk(query, key, value, *, mask_mod=None, q_offset: int = 0, k_offset: int = 0,
                  scale: float | None = None, enable_gqa: bool = False,
                  block_size: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """`(out, lse)` of one query chunk against one key/value chunk; the mask in global indices.

    Examples:
        >>> import torch, qkv
        >>> q, k = torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8)
        >>> out, lse = forward_chunk(q, k, k, mask_mod=qkv.masks.causal(), q_offset=0, k_offset=4)
        >>> bool(torch.isneginf(lse).all())       # keys 4…7 are all after queries 0…3
        True
    """
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)
    bm = _chunk_mask(query, key, mask_mod, q_offset, k_offset, block_size)
    return blockwise_forward(query, key, value, bm, scale=scale, enable_gqa=enable_gqa)


def backward_chunk(query, key, value, out, dout, lse, *, dlse=None, mask_mod=None,
                   q_offset: int = 0, k_offset: int = 0, scale: float | None = None,
                   enable_gqa: bool = False, block_size: int = 128):
    """`(dq, dk, dv)` of one chunk pair, from the *merged* `out` and `lse` of the query rows
    (FlashAttention-2's backward is exact per chunk when `out`/`lse` are the final ones)."""
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)
    bm = _chunk_mask(query, key, mask_mod, q_offset, k_offset, block_size)
    return blockwise_backward(query, key, value, out, dout, lse, bm, scale=scale,
                              enable_gqa=enable_gqa, dlse=dlse)
