"""Blockwise attention by spans: torch's fused CPU flash kernel called once per *span* of key
blocks, the pieces merged by their log-sum-exp — the same answer as `qkv.attention.blockwise`
(the readable reference path), at the kernel's speed, with no compile.

For every query tile the non-empty key blocks of a [`BlockMask`][qkv.attention.block_mask.BlockMask]
form a few contiguous spans. A span of full blocks runs through the kernel unmasked, a stretch
with partial blocks with a small additive mask, and the pieces merge by lse
(`qkv.attention.merge`). Tiles whose work has the same shape go into *one* call as the
kernel's "heads" (`as_strided` views, no copies of k or v), so each call's static thread split
(`qkv.attention.flash_cpu`) gets equal units of work:

* a **window** (a band, any alignment): every interior tile sees the same (T × (w + T)) mask over
  keys shifted by T — one call over all of them; the tiles at the ends take the general path:

  ```text
  q tiles     keys →                 unit i = rows [iT, iT + T) × keys [iT − left, iT + T + right)
  ■■■◩ .  .                          one (T, left + right + T) mask shared by every unit
  .◩■■■◩ .
  . .◩■■■◩
  ```

* **causal** (t ≤ s, either alignment): the T-row diagonal tiles as units of one causal call, and
  the full part below the diagonal as log₂(t/T) calls of equal squares (level ℓ: rows
  [a + S, a + 2S) × keys [a, a + S) for S = T·2^ℓ, a = 0, 2S, 4S, …) — every unit of a call costs
  the same, so the kernel's split is balanced even with one head (torch's own causal kernel gives
  its first thread the cheap rows);
* **rows with identical spans** (documents, prefix-LM's prefix, no mask): one big-row call per
  span, and equal calls at a constant stride (documents of one length) fused into one call;
* **decoding** (few query rows, a long span): the keys split into chunks as units
  (flash-decoding), merged by lse;
* anything else: per tile, full runs of ≥ 2 blocks unmasked, the rest masked
  (`BlockMask.dense_block`).

The backward is FlashAttention-2's by the same calls: the kernel's backward takes the *merged*
out and lse, so each piece's dQ, dK, dV is exact and they add up (overlapping key spans of the
window's units are overlap-added). A gradient reaching lse (`dlse`) enters through one extra
head dimension of each call's rows and keys: q, k padded with 0, v with 0, out with −dlse and
dout with 1 make the kernel's `D = rowsum(dO ∘ O)` equal `D − dlse` (FlashAttention-2's
dS = P ∘ (dP − D)) and change nothing else.

Arithmetic: float32 (bfloat16/float16 inputs are computed in float32, as blockwise does), float64
stays float64 (the kernel runs in float64). Memory: O(N) — the output, lse, and one call's part
(`CALL_BYTES`); the backward holds dq, dk, dv, lse and one call's temporaries
(`BACKWARD_CALL_BYTES` a thread, at most `MAX_CALL_BYTES`), reading q, k, v, out and dout
in place in any layout whose batch and heads are one stride (b = 1, or contiguous). Time: the
backward's five matrix products per block to the forward's two make forward + backward ≈ 3.5×
the forward where the kernel runs both passes at one rate; a Xeon's (benchmarks/long.py, 16k
and 64k, 1-2 threads) gave 2.9-3.7× for a window of 512, 3.1-3.3× for documents of 2,048.
NaN in → NaN out; a row with no key gives 0 and lse −inf. Not expressible in the kernel, so
`spans_with_lse` in `backends.py` runs the pure-torch path instead: `softcap=` (the
kernel has no score transform), a value head size ≠ the query's, non-CPU tensors. Threads: the
kernel's own (`torch.get_num_threads()`); nothing global is set.

Examples:
    >>> import torch, qkv
    >>> q = k = v = torch.randn(1, 2, 300, 16)
    >>> bm = qkv.create_block_mask(qkv.masks.sliding_window(64, 0), None, None, 300, 300, block_size=32)
    >>> out, lse = spans_attention(q, k, v, bm, scale=0.25)
    >>> from qkv.attention.blockwise import blockwise_attention
    >>> ref, ref_lse = blockwise_attention(q, k, v, bm, scale=0.25)
    >>> bool((out - ref).abs().max() < 1e-5), bool((lse - ref_lse).abs().max() < 1e-5)
    (True, True)
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, replace

import torch

from qkv.attention.block_mask import FULL, Band, BlockMask
from qkv.attention.blockwise import check_block_mask, Layout, propagate_nan_rows, compute_dtype, differentiable
from qkv.attention.flash_cpu import any_nan, flash_backward, flash_forward
from qkv.attention.merge import merge_into, reduce_parts

_NEG_INF = float("-inf")

# One call's part (its output, or in the backward its dK/dV of overlapping spans) is held whole
# before it is merged; calls with more units than this budget allows are cut into several calls
# (each still of equal units). 16 MiB keeps a 64k window's extra memory far under 64 MB.
CALL_BYTES = 16 << 20
# The backward's parts are the kernel's dQ, dK, dV of a call's units (dK, dV over overlapping
# spans, added into the gradients at once) and its copy of dO, BACKWARD_CALL_BYTES a thread, at
# most MAX_CALL_BYTES. Measured on a Xeon, window 512 at 16k, the backward alone: 1 thread
# 284-294 ms at 8 MiB calls, 296 at 16, 335-364 at 32; 2 threads 219-242 ms at 8, 185 at 16,
# 167-169 at 32; the earlier 64 MiB calls 404 and 282 ms (a fifth of it zeroing fresh pages).
# The kernel splits a call's (batch, head) items statically over the threads: a call cut to
# fewer than ITEMS_PER_THREAD items a thread takes more units, up to MAX_CALL_BYTES.
BACKWARD_CALL_BYTES = 16 << 20
ITEMS_PER_THREAD = 4
MAX_CALL_BYTES = 32 << 20
# Flash-decoding: a span of at least SPLIT_MIN_KEYS keys whose call has fewer than
# SPLIT_ITEMS_PER_THREAD kernel work items per thread is cut into chunks of SPLIT_KEYS keys.
SPLIT_MIN_KEYS = 4096
SPLIT_KEYS = 2048
SPLIT_ITEMS_PER_THREAD = 4
# Full runs shorter than this (in blocks) inside a row with partial blocks join the masked
# stretch around them: a separate unmasked call and merge cost more than masking one block.
MIN_FULL_BLOCKS = 2


@dataclass(frozen=True, eq=False)
class Call:
    """`count` units of one kernel call: unit i takes query rows `[q0 + i·q_step, +n)` and keys
    `[k0 + i·k_step, +L)`. `q_step = 0`: the units share their rows (a key split, merged
    before it is placed). `keep`: (B', H', n, L) bool (True = takes part), shared by every unit,
    or None (all keys). `first`: no earlier call of the plan touched these rows."""

    q0: int
    q_step: int
    n: int
    k0: int
    k_step: int
    L: int
    count: int = 1
    causal: bool = False
    keep: torch.Tensor | None = None
    first: bool = False


# -- the plan: which calls, computed once per block mask -----------------------------------------
_PLANS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def plan(bm: BlockMask) -> list[Call]:
    """The calls that cover `bm`'s non-empty blocks exactly once (cached per block mask)."""
    got = _PLANS.get(bm)
    if got is None:
        calls = _band_calls(bm)
        if calls is None:
            calls = _causal_calls(bm)
        if calls is None:
            calls = _row_calls(bm, range(len(bm.runs)))
        got = _mark_first(_fuse(calls), bm.t)
        _PLANS[bm] = got
    return got


def _band(bm: BlockMask) -> Band | None:
    mod = bm.mask_mod
    if isinstance(mod, Band) and bm.tiles is None and bm.q_offset == 0 and bm.k_offset == 0:
        return mod
    return None


def _band_calls(bm: BlockMask) -> list[Call] | None:
    """A window: one call over the interior tiles (one shared mask), the ends per tile."""
    band = _band(bm)
    if band is None or band.left is None or band.right is None:
        return None
    T, t, s, off = bm.block_size, bm.t, bm.s, band._offset()
    L = band.left + band.right + T
    # tile r is interior when its whole span [rT + off − left, rT + T − 1 + off + right] is in [0, s)
    lo = max(0, -(-(band.left - off) // T))  # first r with rT + off − left ≥ 0
    hi = min(t // T, (s - off - band.right) // T)  # r < hi: (r+1)T − 1 + off + right ≤ s − 1
    if hi - lo < 2:
        return None
    c = torch.arange(L)[None, :] - torch.arange(T)[:, None]  # (T, L) key column − row
    keep = ((c >= 0) & (c <= band.left + band.right))[None, None]  # (1, 1, T, L)
    interior = Call(lo * T, T, T, lo * T + off - band.left, T, L, count=hi - lo, keep=keep)
    return [interior] + _row_calls(bm, [*range(lo), *range(hi, len(bm.runs))])


def _causal_calls(bm: BlockMask) -> list[Call] | None:
    """Causal (row i sees keys ≤ i + D, D ≥ 0, t + D ≤ s): the keys below D in one call, the
    diagonal tiles in one causal call, the squares under the diagonal in one call per level."""
    band = _band(bm)
    if band is None or band.left is not None or band.right is None:
        return None
    T, t, s = bm.block_size, bm.t, bm.s
    D = band._offset() + band.right
    if D < 0 or t + D > s or t == 0:
        return None
    calls = [Call(0, 0, t, 0, 0, D)] if D > 0 else []
    full = t // T
    if full:
        calls.append(Call(0, T, T, D, T, T, count=full, causal=True))
    if full * T < t:
        calls.append(Call(full * T, 0, t - full * T, D + full * T, 0, t - full * T, causal=True))
    S = T
    while S < t:
        whole = t // (2 * S)  # units a = 0, 2S, … with a + 2S ≤ t
        if whole:
            calls.append(Call(S, 2 * S, S, D, 2 * S, S, count=whole))
        a = whole * 2 * S
        if a + S < t:  # a ragged last unit: fewer rows
            calls.append(Call(a + S, 0, t - a - S, D + a, 0, S))
        S *= 2
    return calls


def _row_calls(bm: BlockMask, rows) -> list[Call]:
    """The general path for the block rows `rows`: consecutive rows whose runs are all full and
    identical share one big-row call per run; a row with partial blocks is cut into unmasked full
    stretches and masked ones."""
    T, t, s = bm.block_size, bm.t, bm.s
    calls: list[Call] = []
    masks = _MaskCache(bm)
    group: tuple | None = None  # (r0, r1, runs) of all-full identical rows

    def flush():
        if group is not None:
            r0, r1, runs = group
            q0, q1 = r0 * T, min(r1 * T, t)
            for c0, c1, _ in runs:
                calls.append(Call(q0, 0, q1 - q0, c0 * T, 0, min(c1 * T, s) - c0 * T))

    for r in rows:
        runs = bm.runs[r]
        if not runs:
            continue
        if not bm.partial[r]:
            if group is not None and group[1] == r and group[2] == runs:
                group = (group[0], r + 1, runs)
            else:
                flush()
                group = (r, r + 1, runs)
            continue
        q0, q1 = r * T, min((r + 1) * T, t)
        for c0, c1, full in runs:
            for a, b, is_full in _stretches(bm, r, c0, c1, full):
                k0, k1 = a * T, min(b * T, s)
                keep = None if is_full else masks(r, a, b)
                calls.append(Call(q0, 0, q1 - q0, k0, 0, k1 - k0, keep=keep))
    flush()
    return calls


def _stretches(bm: BlockMask, r: int, c0: int, c1: int, full: bool):
    """Run [c0, c1) of row r cut into (a, b, full): full stretches of ≥ MIN_FULL_BLOCKS blocks,
    and the masked stretches between them."""
    if full:
        yield c0, c1, True
        return
    is_full = (bm.kinds[:, :, r, c0:c1] == FULL).flatten(0, 1).all(0).tolist()
    a = c0
    c = c0
    while c < c1:
        if is_full[c - c0]:
            e = c
            while e < c1 and is_full[e - c0]:
                e += 1
            if e - c >= MIN_FULL_BLOCKS:
                if c > a:
                    yield a, c, False
                yield c, e, True
                a = e
            c = e
        else:
            c += 1
    if a < c1:
        yield a, c1, False


class _MaskCache:
    """`dense_block` per masked stretch; a mask that depends only on k − q (shift-invariant)
    is built once per (offset, shape) and shared."""

    def __init__(self, bm: BlockMask):
        self.bm = bm
        self.invariant = getattr(bm.mask_mod, "shift_invariant", False) and bm.tiles is None
        self.cache: dict = {}

    def __call__(self, r: int, a: int, b: int) -> torch.Tensor:
        bm, T = self.bm, self.bm.block_size
        q0, k0 = r * T, a * T
        key = (k0 - q0, min(q0 + T, bm.t) - q0, min(b * T, bm.s) - k0) if self.invariant else None
        got = self.cache.get(key) if key is not None else None
        if got is None:
            got = bm.dense_block(r, a, b).contiguous()  # (B', H', n, L)
            if key is not None:
                self.cache[key] = got
        return got


def _fuse(calls: list[Call]) -> list[Call]:
    """Consecutive unmasked single-unit calls of one shape at a constant stride (documents of one
    length) become one call whose units are those calls."""
    out: list[Call] = []
    for c in calls:
        p = out[-1] if out else None
        if (p is not None and c.count == 1 and c.keep is None and p.keep is None and not c.causal
                and not p.causal and (p.n, p.L) == (c.n, c.L)):
            if p.count == 1 and c.q0 - p.q0 >= p.n and c.k0 - p.k0 > 0:
                out[-1] = replace(p, q_step=c.q0 - p.q0, k_step=c.k0 - p.k0, count=2)
                continue
            if (p.count > 1 and c.q0 == p.q0 + p.count * p.q_step
                    and c.k0 == p.k0 + p.count * p.k_step):
                out[-1] = replace(p, count=p.count + 1)
                continue
        out.append(c)
    return out


def _mark_first(calls: list[Call], t: int) -> list[Call]:
    covered = torch.zeros(max(t, 1), dtype=torch.bool)
    out = []
    for c in calls:
        rows = covered.as_strided((c.count if c.q_step else 1, c.n), (c.q_step, 1), c.q0)
        first = not bool(rows.any())
        rows.fill_(True)
        out.append(replace(c, first=first))
    return out


# -- running a plan -------------------------------------------------------------------------------
def _flat(x: torch.Tensor, *shape: int) -> torch.Tensor:
    """`x` as `shape` — a view whenever its strides allow (a transposed (b, t, h, d) input with
    b = 1, as a model's attention passes it, is read in place), else one copy; the kernel needs
    the last dim contiguous."""
    y = x.reshape(shape)
    return y if y.stride(-1) == 1 else y.contiguous()


class _Tensors:
    """q (X, g, t, d), k, v (X, s, d), the running out (X, g, t, dv) and lse (X, g, t), with
    X = batch · key heads and g query heads per key head, any strides (last dim contiguous);
    views of one call's units as the kernel's (X, units · g, rows, ·) (query head i of a call
    uses key head i // g)."""

    def __init__(self, lay: Layout, q, k, v):
        self.lay, self.X, self.g = lay, lay.b * lay.h_kv, lay.g
        self.q, self.k, self.v = q, k, v

    @staticmethod
    def out_rows(x: torch.Tensor, c: Call, u0: int, u1: int) -> torch.Tensor:
        """x (X, g, t, e) → the units' rows (X, units, g, n, e), a view."""
        X, g, t, e = x.shape
        sx, sg, st, _ = x.stride()
        return x.as_strided((X, u1 - u0, g, c.n, e), (sx, c.q_step * st, sg, st, 1),
                            x.storage_offset() + (c.q0 + u0 * c.q_step) * st)

    def rows(self, x: torch.Tensor, c: Call, u0: int, u1: int) -> torch.Tensor:
        """x (X, g, t, e) → the units' rows (X, (u1 − u0)·g, n, e) (a copy when g > 1 and units > 1)."""
        X, g, _, e = x.shape
        return self.out_rows(x, c, u0, u1).reshape(X, (u1 - u0) * g, c.n, e)

    @staticmethod
    def row_values(x: torch.Tensor, c: Call, u0: int, u1: int) -> torch.Tensor:
        """x (X, g, t) → (X, units, g, n) view."""
        X, g, t = x.shape
        sx, sg, st = x.stride()
        return x.as_strided((X, u1 - u0, g, c.n), (sx, c.q_step * st, sg, st),
                            x.storage_offset() + (c.q0 + u0 * c.q_step) * st)

    @staticmethod
    def keys(x: torch.Tensor, c: Call, u0: int, u1: int, k0: int | None = None,
             L: int | None = None) -> torch.Tensor:
        """x (X, s, e) → the units' keys (X, units, L, e), overlapping views of x."""
        X, s, e = x.shape
        sx, ss, _ = x.stride()
        k0 = c.k0 if k0 is None else k0
        L = c.L if L is None else L
        return x.as_strided((X, u1 - u0, L, e), (sx, c.k_step * ss, ss, 1),
                            x.storage_offset() + (k0 + u0 * c.k_step) * ss)

    def mask(self, c: Call, dtype) -> torch.Tensor | None:
        """The additive mask (0 / −inf) broadcasting to (X, units · g, n, L)."""
        if c.keep is None:
            return None
        keep = c.keep  # (B', H', n, L)
        Bm, Hm = keep.shape[:2]
        if Bm * Hm == 1:
            m = keep[0]  # (1, n, L): the same for every batch row and head
        else:
            assert c.count == 1, "per-batch or per-head masks run one unit at a time"
            lay = self.lay
            m = keep.reshape(Bm, lay.h_kv if Hm > 1 else 1, lay.g if Hm > 1 else 1, c.n, c.L)
            m = m.expand(lay.b, lay.h_kv, lay.g, c.n, c.L).reshape(self.X, lay.g, c.n, c.L)
        return torch.zeros(m.shape, dtype=dtype).masked_fill_(~m, _NEG_INF)


def _unit_ranges(c: Call, per_unit_bytes: int, budget: int = CALL_BYTES, items_per_unit: int = 0):
    """The call's units cut into ranges of at most `budget` bytes of temporaries — or more, up to
    MAX_CALL_BYTES, where `items_per_unit` kernel work items per unit would otherwise leave
    fewer than ITEMS_PER_THREAD per thread."""
    step = budget // max(per_unit_bytes, 1)
    if items_per_unit:
        balanced = -(-ITEMS_PER_THREAD * torch.get_num_threads() // items_per_unit)
        step = max(step, min(balanced, MAX_CALL_BYTES // max(per_unit_bytes, 1)))
    step = max(1, step)
    for u0 in range(0, c.count, step):
        yield u0, min(u0 + step, c.count)


def _split_keys(c: Call, X: int, g: int) -> Call:
    """Flash-decoding: a single-unit unmasked call with too few work items for the threads and a
    long span becomes units of SPLIT_KEYS keys sharing the rows (plus nothing: L is cut evenly)."""
    items = X * g * math.ceil(c.n / 32)  # the kernel's (batch, head, 32-row block) work items
    if (c.count != 1 or c.keep is not None or c.causal or c.L < SPLIT_MIN_KEYS
            or items >= SPLIT_ITEMS_PER_THREAD * torch.get_num_threads()):
        return c
    parts = math.ceil(c.L / SPLIT_KEYS)
    while c.L % parts:  # equal chunks (a chunk of a few more keys costs less than another call)
        parts -= 1
    if parts < 2:
        return c
    return replace(c, k_step=c.L // parts, L=c.L // parts, count=parts)


def spans_forward(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  block_mask: BlockMask, *, scale: float,
                  enable_gqa: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """`(out (..., h, t, dv), lse (..., h, t))` — the same contract as
    `qkv.attention.blockwise.blockwise_forward` (no `softcap`; dv = d)."""
    lay = Layout(query, key, enable_gqa)
    check_block_mask(block_mask, lay)
    c = compute_dtype(query.dtype)
    X, g, t, s, d = lay.b * lay.h_kv, lay.g, lay.t, lay.s, lay.d
    q = _flat(lay.queries(query.to(c)), X, g, t, d)  # (X, g, t, d), in place where strides allow
    k = _flat(lay.keys(key.to(c)), X, s, d)  # (X, s, d)
    v = _flat(lay.keys(value.to(c)), X, s, d)
    out = q.new_zeros(X, g, t, d)  # (X, g, t, dv)
    lse = q.new_full((X, g, t), _NEG_INF)  # (X, g, t)
    # NaN in → NaN out for keys: one check of the keys the plan visits (a decoding row's window
    # is a few hundred of a 64k cache: checking all of k cost 8× the attention); only when a key
    # holds a NaN does each kernel call get its keys' flags (the kernel alone gives 0 to a row
    # whose keys are all NaN)
    calls = plan(block_mask)
    lo = min((c.k0 for c in calls), default=0)
    hi = max((c.k0 + (c.count - 1) * c.k_step + c.L for c in calls), default=0)
    nan_keys = k.isnan().any(-1, keepdim=True) if any_nan(k[:, max(lo, 0):hi]) else None  # (X, s, 1)
    ts = _Tensors(lay, q, k, v)
    for call in calls:
        call = _split_keys(call, X, g)
        mask = ts.mask(call, c)
        per_unit = X * g * call.n * d * q.element_size() * (2 if g > 1 else 1)
        units = [(0, call.count)] if call.q_step == 0 else _unit_ranges(call, per_unit)
        for u0, u1 in units:
            n_u = u1 - u0
            flags = None if nan_keys is None else ts.keys(nan_keys, call, u0, u1).squeeze(-1)  # (X, units, L)
            o, l = flash_forward(ts.rows(q, call, u0, u1), ts.keys(k, call, u0, u1),
                                 ts.keys(v, call, u0, u1), scale=scale, causal=call.causal, mask=mask,
                                 nan_keys=flags)
            o = o.view(X, n_u, g, call.n, d)  # (X, units, g, n, dv)
            l = l.view(X, n_u, g, call.n)
            if call.q_step == 0 and n_u > 1:  # units share their rows: merge them first
                o, l = reduce_parts(o, l, 1)
                o, l = o.unsqueeze(1), l.unsqueeze(1)
                n_u = 1
            o_view = ts.out_rows(out, call, u0, u0 + n_u)  # (X, units, g, n, dv)
            l_view = ts.row_values(lse, call, u0, u0 + n_u)
            if call.first:
                o_view.copy_(o)
                l_view.copy_(l)
            else:
                merge_into(o_view, l_view, o, l, rows=slice(None))
            del o, l  # before the next call's
    shape5 = (lay.b, lay.h_kv, g, t)
    propagate_nan_rows(query, lay, out.view(*shape5, d), lse.view(shape5))
    return lay.back_q(out.view(*shape5, d)).to(query.dtype), lay.back_rows(lse.view(shape5))


def spans_backward(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   out: torch.Tensor, dout: torch.Tensor, lse: torch.Tensor,
                   block_mask: BlockMask, *, scale: float, enable_gqa: bool = False,
                   dlse: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FlashAttention-2's backward by the forward's calls: `(dq, dk, dv)` shaped like
    query, key, value (the contract of `qkv.attention.blockwise.blockwise_backward`).

    Memory beyond dq, dk, dv: one call's temporaries (`BACKWARD_CALL_BYTES` a thread, at most
    `MAX_CALL_BYTES`) and lse; q, k, v, out and dout are read in place (no copies of them);
    D = rowsum(dO ∘ O) is the kernel's, per row block."""
    lay = Layout(query, key, enable_gqa)
    check_block_mask(block_mask, lay)
    c = compute_dtype(query.dtype)
    X, g, t, s, d = lay.b * lay.h_kv, lay.g, lay.t, lay.s, lay.d
    q = _flat(lay.queries(query.to(c)), X, g, t, d)  # (X, g, t, d), views where strides allow
    k = _flat(lay.keys(key.to(c)), X, s, d)  # (X, s, d)
    v = _flat(lay.keys(value.to(c)), X, s, d)
    o = _flat(lay.queries(out.to(c)), X, g, t, d)  # (X, g, t, dv)
    do = _flat(lay.queries(dout.to(c)), X, g, t, d)
    lse3 = lay.rows(lse.to(c)).reshape(X, g, t)
    lse3 = lse3.masked_fill(torch.isneginf(lse3), 0.0)  # (X, g, t); rows with no key: P = 0 anyway
    neg_dlse = None if dlse is None else -lay.rows(dlse.to(c)).reshape(X, g, t)  # (X, g, t)
    dq, dk, dv = q.new_zeros(X, g, t, d), k.new_zeros(X, s, d), v.new_zeros(X, s, d)
    ts = _Tensors(lay, q, k, v)
    budget = min(BACKWARD_CALL_BYTES * torch.get_num_threads(), MAX_CALL_BYTES)
    for call in plan(block_mask):
        call = _split_keys(call, X, g)
        mask = ts.mask(call, c)
        if call.q_step == 0:
            ranges = [(0, call.count)]  # units sharing their rows (a key split): one call
        else:
            per_unit = _backward_unit_bytes(call, X, g, d, q.element_size(), dlse is not None)
            ranges = _unit_ranges(call, per_unit, budget, items_per_unit=X * g)
        for u0, u1 in ranges:
            gq, gk, gv = _backward_units(ts, call, u0, u1, do, o, lse3, neg_dlse, scale, mask)
            ts.out_rows(dq, call, u0, u0 + gq.shape[1]).add_(gq)
            _overlap_add(dk, gk, call, u0, u1)
            _overlap_add(dv, gv, call, u0, u1)
            del gq, gk, gv  # before the next call's: one call's parts at a time
    shape_q = (lay.b, lay.h_kv, g, t, d)
    return (lay.back_q(dq.view(shape_q)).to(query.dtype), lay.back_k(dk, key).to(key.dtype),
            lay.back_k(dv, value).to(value.dtype))


def _backward_unit_bytes(c: Call, X: int, g: int, d: int, size: int, padded: bool) -> int:
    """The temporaries one unit of a backward call holds: the kernel's dQ (g·n rows), dK and dV
    (L rows each) and its contiguous copy of dO (g·n rows); q, out, dO rows copied where g > 1
    (units × g heads are not one stride); with dlse, the call's rows and keys padded by one."""
    e = d + 1 if padded else d
    copies = (3 if g > 1 else 0) + (3 if padded else 0)
    return X * size * e * (g * c.n * (2 + copies) + 2 * c.L * (2 if padded else 1))


def _backward_units(ts: _Tensors, c: Call, u0: int, u1: int, do, o, lse3, neg_dlse, scale, mask):
    """The kernel's backward over units [u0, u1) of call c: dq (X, rows, g, n, d) for the
    distinct row sets (1 for a key split, whose units' shares are summed), dk, dv (X, units, L, d).

    A gradient reaching lse enters through one extra head dimension of this call's rows and
    keys (see the module doc): q, k padded with 0, v with 0, out with −dlse and dO with 1."""
    X, g, n_u = ts.X, ts.g, u1 - u0
    rows_u = 1 if c.q_step == 0 else n_u  # distinct row sets
    r1 = u0 + rows_u

    def rows(x):  # (X, n_u · g, n, e); rows shared by the units (a key split) repeat for each
        got = ts.rows(x, c, u0, r1)  # (X, rows_u · g, n, e)
        return got if rows_u == n_u else _repeat_units(got, n_u, g)

    def row_values(x):  # x (X, g, t) → (X, n_u · g, n, 1)
        got = ts.row_values(x, c, u0, r1).reshape(X, rows_u * g, c.n, 1)
        return got if rows_u == n_u else _repeat_units(got, n_u, g)

    qr, dor, orr = rows(ts.q), rows(do), rows(o)
    lr = row_values(lse3).squeeze(-1)
    kr, vr = ts.keys(ts.k, c, u0, u1), ts.keys(ts.v, c, u0, u1)  # (X, n_u, L, d)
    d = qr.shape[-1]
    if neg_dlse is not None:
        qr, kr, vr = (torch.nn.functional.pad(x, (0, 1)) for x in (qr, kr, vr))
        dor = torch.nn.functional.pad(dor, (0, 1), value=1.0)
        orr = torch.cat([orr, row_values(neg_dlse)], -1)
    gq, gk, gv = flash_backward(dor, qr, kr, vr, orr, lr, scale=scale, causal=c.causal, mask=mask)
    gq = gq.view(X, n_u, g, c.n, gq.shape[-1])[..., :d]  # (X, n_u, g, n, d)
    if rows_u != n_u:
        gq = gq.sum(1, keepdim=True)
    return gq, gk[..., :d], gv[..., :d]


def _repeat_units(x: torch.Tensor, n_u: int, g: int) -> torch.Tensor:
    """(X, g, n, e) rows shared by `n_u` units → (X, n_u · g, n, e) (a stride-0 view flattened)."""
    X, _, n, e = x.shape
    return x.unsqueeze(1).expand(X, n_u, g, n, e).reshape(X, n_u * g, n, e)


def _overlap_add(acc: torch.Tensor, part: torch.Tensor, c: Call, u0: int, u1: int) -> None:
    """acc (X, s, e) += the units' key gradients part (X, units, L, e); units whose spans overlap
    (k_step < L) are added k_step columns at a time, so no view overlaps itself."""
    step = c.k_step if 0 < c.k_step < c.L and u1 - u0 > 1 else c.L
    for a in range(0, c.L, step):
        w = min(step, c.L - a)
        _Tensors.keys(acc, c, u0, u1, k0=c.k0 + a, L=w).add_(part[:, :, a:a + w])


def spans_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    block_mask: BlockMask, *, scale: float,
                    enable_gqa: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Differentiable attention by spans: `(out (..., h, t, dv), lse (..., h, t))`."""
    return differentiable((spans_forward, spans_backward), query, key, value, block_mask,
                          scale=float(scale), enable_gqa=bool(enable_gqa))


def supports(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
             softcap: float | None = None) -> bool:
    """Whether the spans path can answer (else the pure-torch blockwise path does): CPU, no
    softcap, one head size for q, k and v, non-empty lengths."""
    return (softcap is None and query.device.type == "cpu" and query.shape[-1] == value.shape[-1]
            == key.shape[-1] and query.shape[-1] > 0 and query.shape[-2] > 0 and key.shape[-2] > 0)
