"""qkv's own C++ forward and backward for the spans path, for masks that give each query row one
interval of keys.

A sliding window, causality, packed documents (each document's tokens contiguous) and their
`and_masks` intersections keep, for query row i, exactly the keys `[lo_i, hi_i)`:

```text
window (left 2)      documents [0 0 0 1 1]     lo/hi per row
■ . . . .            ■ ■ ■ . .                 window: [i − 2, i + 1)
■ ■ . . .            ■ ■ ■ . .                 documents: [first, last + 1) of row i's document
■ ■ ■ . .            ■ ■ ■ . .
. ■ ■ ■ .            . . . ■ ■
. . ■ ■ ■            . . . ■ ■
```

For such a mask the kernel (`intervals.cpp`) runs FlashAttention-2's forward per query tile
of `BLOCK_Q` rows: S = scale · Q_tile · K_spanᵀ by BLAS over the tile's span of keys (in chunks
of at most `BLOCK_K`), the interval and the online softmax applied in one sweep over S while it
is in cache, then O += P · V_span by BLAS; (batch · head, tile) items split over torch's threads.
It returns `(out, lse)` with `qkv.attention.spans.spans_forward`'s contract.

The backward (`kernel_backward`, the contract of `qkv.attention.spans.spans_backward`)
is FlashAttention-2's over the same tiles: per chunk of a tile's keys it recomputes
P = exp(S − lse) on the rows' intervals and runs dV += Pᵀ dO, dP = dO Vᵀ, dS = P ∘ (dP − D + dlse),
dQ += scale · dS K, dK += scale · dSᵀ Q by BLAS — five products to the forward's two, so
forward + backward ≈ 3.5× the forward at one rate. Work items are (batch, key head) pairs, each
owning its dK, dV rows and its query heads' dQ rows (no locks, no per-thread copies: beyond dq,
dk, dv it holds two (`BLOCK_Q`, `BLOCK_K`) tiles a thread); with fewer pairs than threads the
query tiles split into runs whose keys do not overlap every other run, even runs then odd.

It is compiled by set-up (`python -m qkv.attention.kernels.build`) and only *loaded* here: where
it was not built (no compiler), for float64, a mask that is not one interval per row, or
non-CPU tensors, `supports` says no and the pure-torch spans path answers —
the reference the tests compare the kernel against. `use_kernel(False)` selects that path for
comparison.

Examples:
    >>> import torch, qkv
    >>> from qkv.attention import kernels
    >>> q = k = v = torch.randn(1, 2, 300, 16)
    >>> bm = qkv.create_block_mask(qkv.masks.sliding_window(64, 0), None, None, 300, 300, block_size=32)
    >>> if kernels.supports(q, k, v, bm):                                 # built by make setup
    ...     out, lse = kernels.kernel_forward(q, k, v, bm, scale=0.25)    # (1, 2, 300, 16), (1, 2, 300)
    ...     dq, dk, dv = kernels.kernel_backward(q, k, v, out, torch.ones_like(out), lse, bm, scale=0.25)
"""

from __future__ import annotations

import contextlib
import importlib.util
import warnings
import weakref

import torch

from qkv.attention.block_mask import Band, BlockMask, Combined, Document
from qkv.attention.blockwise import check_block_mask, Layout, propagate_nan_rows, differentiable

# Query rows per tile and keys per chunk of a tile's span. Measured (fp32, d = 64, H = 4, window
# 512, N = 16k, one thread of a loaded 2-core AMD EPYC, rounds interleaved, ms): 32/1024 192,
# 64/1024 181, 64/512 192, 96/1024 192, 128/1024 202 (the spans path 219). Small tiles waste
# little of the band (a tile of T rows visits w + T keys per row where w + 1 take part); below
# 64 rows the two GEMMs per tile lose more than that.
BLOCK_Q = 64
BLOCK_K = 1024  # a window of 512 + a tile of 64 in one chunk: no rescaling of O
# The backward's keys per chunk (a span cut into equal chunks of at most this many): measured
# (fp32, d = 64, H = 4, N = 16k, one thread of a loaded 2-core AMD EPYC, interleaved, median ms):
# documents of 2,048: 256 1310-1376, 512 1328-1544, 1024 1483-1700 (the spans backward
# 1521-1623) — a chunk's P, dS, K, V, dK, dV stay in the 1 MiB L2; a window of 512: 256 (3 × 192)
# 370-441, 1024 (one chunk of 576) 365-410, equal within the noise.
BACKWARD_BLOCK_K = 256
# Fewer query rows than this go to the spans path (decoding: its key split keeps the threads busy).
MIN_ROWS = 64

_state = {"module": None, "loaded": False, "enabled": True}


def load():
    """The compiled kernel module, or None when this source was not built for this torch (or its
    library fails its check: one warning, then the pure-torch spans path)."""
    if not _state["loaded"]:
        _state["loaded"] = True
        from qkv.attention.kernels.build import library_path
        path = library_path()
        if path.exists() or path.is_symlink():
            _state["module"] = _import(path)
    return _state["module"]


def _import(path):
    """The extension module at `path`, or None (with one warning line) when it does not load.

    Nothing is mapped into this process that was not verified: a file whose stamp does not hold
    its sha256 (`verified`) is first imported and run by a
    child process (`verify`, which stamps it when it passes):
    a truncated library would otherwise end this process with SIGBUS where the loader touches a
    page past the file's end."""
    from qkv.attention.kernels import build
    if not build.verified(path):
        why = build.verify(path)
        if why is not None:
            _warn(path, why)
            return None
    try:
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    except (ImportError, OSError) as e:  # a torch whose library lacks a symbol the build linked
        _warn(path, str(e).splitlines()[0] if str(e) else type(e).__name__)
        return None


def _warn(path, why: str) -> None:
    warnings.warn(f"qkv's C++ kernel {path} does not load ({why}); the pure-torch spans path runs "
                  f"(rebuild it: python -m qkv.attention.kernels.build)", stacklevel=4)


def available() -> bool:
    """Whether the kernel is built (and not switched off by `use_kernel`)."""
    return _state["enabled"] and load() is not None


@contextlib.contextmanager
def use_kernel(enabled: bool):
    """`with use_kernel(False):` runs the pure-torch spans path where the kernel would answer."""
    before = _state["enabled"]
    _state["enabled"] = bool(enabled)
    try:
        yield
    finally:
        _state["enabled"] = before


# -- the mask as one key interval per row ---------------------------------------------------------
_INTERVALS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def intervals(bm: BlockMask) -> tuple[torch.Tensor, torch.Tensor] | None:
    """`(lo, hi)`, each (B', t) int64 (B' = 1 or the mask's batch): row i keeps keys
    `[lo_i, hi_i)` (local indices, possibly outside [0, s): the kernel clamps) — or None when
    `bm`'s mask is not one interval per row. Cached per block mask."""
    if bm in _INTERVALS:
        return _INTERVALS[bm]
    got = None
    if bm.tiles is None:
        q = torch.arange(bm.t, dtype=torch.int64) + bm.q_offset  # global query positions (t,)
        got = _mod_intervals(bm.mask_mod, q)
        if got is not None:
            got = tuple(x.sub(bm.k_offset).reshape(-1, bm.t).contiguous() for x in got)
    _INTERVALS[bm] = got
    return got


def _mod_intervals(mod, q: torch.Tensor):
    """Global key interval per global query `q` of a mask_mod, or None (not an interval mask)."""
    if isinstance(mod, Band):
        p = q + mod._offset()
        lo = p - mod.left if mod.left is not None else torch.full_like(q, -(1 << 62))
        hi = p + mod.right + 1 if mod.right is not None else torch.full_like(q, 1 << 62)
        return lo, hi
    if isinstance(mod, Document) and mod.kv_ids is None:
        return _document_intervals(mod.ids, q)
    if isinstance(mod, Combined) and mod.op == "and":
        parts = [_mod_intervals(p, q) for p in mod.parts]
        if any(p is None for p in parts):
            return None
        lo, hi = parts[0]
        for plo, phi in parts[1:]:
            lo, hi = torch.maximum(lo, plo), torch.minimum(hi, phi)  # broadcasting (B', t)
        return lo, hi
    return None


def _document_intervals(ids: torch.Tensor, q: torch.Tensor):
    """Row i's document as the key interval [first, last + 1) — None unless every document's
    tokens are contiguous (packing) in every batch row."""
    ids = ids.reshape(-1, ids.shape[-1]).long()  # (B', N)
    n = ids.shape[-1]
    new = torch.ones_like(ids, dtype=torch.bool)
    new[:, 1:] = ids[:, 1:] != ids[:, :-1]  # a run of one id starts here
    for row, starts in zip(ids, new):
        if int(starts.sum()) != int(row.unique().numel()):
            return None  # some document comes back after another: its keys are not one interval
    pos = torch.arange(n).expand_as(ids)  # (B', N)
    first = torch.where(new, pos, 0).cummax(-1).values  # (B', N) where each token's run starts
    starts_after = torch.where(new, pos, n)[:, 1:]  # (B', N − 1) token i + 1's position if a run starts there
    starts_after = torch.cat([starts_after, torch.full((ids.shape[0], 1), n)], -1)  # (B', N)
    end = starts_after.flip(-1).cummin(-1).values.flip(-1)  # (B', N) the next run's start, or N
    return first[:, q], end[:, q]


def _has_window(mod) -> bool:
    """Whether the mask bounds each row's keys on both sides by a band (a sliding window, alone or
    intersected): where the kernel was measured faster than the spans path (window 512, 16k,
    interleaved on a loaded 2-core AMD EPYC: 1.17× with one thread, 2.2× with two; 1.07× at 64k).
    Documents alone run as full blocks, where torch's kernel per span was as fast (documents of
    2,048 at 16k: 0.95-1.08×, at 64k 0.94×), so their forward alone stays on the spans path
    (under autograd both passes are the kernel's: see `attention`)."""
    if isinstance(mod, Band):
        return mod.left is not None and mod.right is not None
    return isinstance(mod, Combined) and mod.op == "and" and any(_has_window(p) for p in mod.parts)


# -- the forward --------------------------------------------------------------------------------
def can_run(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
            block_mask: BlockMask) -> bool:
    """Whether the kernel can answer this call: built and enabled (`use_kernel`), float32
    CPU (q, k, v) of one head size, shaped (b, h, ·, d) or (h, ·, d) with b, h and h_kv > 0, at
    least `MIN_ROWS` query rows, an interval mask (`intervals`).

    NaN in → NaN out, as on the spans path: a row that sees a key holding a NaN gives NaN (its
    score's exp is NaN); a NaN value may also reach a row of the same tile that does not see it
    (0 · NaN in P · V, as in torch's kernel)."""
    return (available() and query.device.type == "cpu" and query.dtype == torch.float32
            and key.dtype == value.dtype == torch.float32 and query.ndim in (3, 4)
            and key.ndim == value.ndim == query.ndim
            and query.shape[-1] == key.shape[-1] == value.shape[-1] > 0
            and (query.ndim == 3 or query.shape[0] > 0) and query.shape[-3] > 0 and key.shape[-3] > 0
            and query.shape[-2] >= MIN_ROWS and key.shape[-2] > 0
            and intervals(block_mask) is not None)


def supports(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
             block_mask: BlockMask) -> bool:
    """Whether the blockwise backend runs this call by the kernel (else by the spans path): it
    can (`can_run`) and was measured faster there — a window (`_has_window`)."""
    return _has_window(block_mask.mask_mod) and can_run(query, key, value, block_mask)


# -- what the kernel hands BLAS -----------------------------------------------------------------
_LD_MAX = 2**31 - 1  # BLAS's leading dimensions are 32-bit ints


def _blas_rows(x: torch.Tensor) -> torch.Tensor:
    """`x` (b, h, n, d) if each (n, d) matrix is one BLAS can read in place — last dim
    contiguous, row stride (its leading dimension) at least d and below 2³¹, so rows neither
    repeat (an `expand` along n: stride 0) nor overlap — else a row-major copy. Heads and
    batches may share memory (an `expand` over h): the kernel only reads them.

    BLAS refuses a leading dimension below the row length with a line on stdout ("Intel oneMKL
    ERROR: Parameter 8 was incorrect") and skips the product, leaving the output tile as it was:
    the kernel's `check_inputs` refuses such a tensor, and this copy keeps one from arriving
    there (autograd hands the backward an expanded `dout` for `out.sum(dim=2)`)."""
    d = x.shape[-1]
    if x.stride(-1) == 1 and d <= x.stride(-2) <= _LD_MAX:
        return x
    # not x.contiguous(): it keeps whatever stride a dimension of size 1 has (0 included)
    return x.clone(memory_format=torch.contiguous_format)


def kernel_forward(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   block_mask: BlockMask, *, scale: float,
                   enable_gqa: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """`(out (..., h, t, d), lse (..., h, t))` by the C++ kernel — the contract of
    `qkv.attention.spans.spans_forward` (call `can_run` first)."""
    lay = Layout(query, key, enable_gqa)
    check_block_mask(block_mask, lay)
    lo, hi = intervals(block_mask)
    q4, k4, v4 = (_blas_rows(x if x.ndim == 4 else x.unsqueeze(0)) for x in (query, key, value))  # (b, h, n, d)
    out, lse = load().interval_forward(q4, k4, v4, lo, hi, float(scale), BLOCK_Q, BLOCK_K)
    shape5 = (lay.b, lay.h_kv, lay.g, lay.t)
    propagate_nan_rows(query, lay, out.view(*shape5, lay.d), lse.view(shape5))
    return out.view(query.shape), lse.view(query.shape[:-1])


def kernel_backward(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    out: torch.Tensor, dout: torch.Tensor, lse: torch.Tensor,
                    block_mask: BlockMask, *, scale: float, enable_gqa: bool = False,
                    dlse: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`(dq, dk, dv)` shaped like query, key, value by the C++ kernel — the contract of
    `qkv.attention.spans.spans_backward` (call `can_run` first): FlashAttention-2's
    backward from the saved `out` and `lse` of `kernel_forward` (an lse from another forward
    is the log-sum-exp of scores another gemm rounded: P = exp(S − lse) is then off by a few ulp
    of |S| relative, see `attention`), `dlse` (..., h, t) the gradient reaching lse or None.
    A row with no key (lse −inf) gets dq 0 and adds nothing.

    Memory beyond dq, dk, dv: two (BLOCK_Q, BACKWARD_BLOCK_K) tiles a thread; q, k, v, out and
    dout are read in place (any strides with the last dim contiguous), lse and dlse as (b, h, t)."""
    lay = Layout(query, key, enable_gqa)
    check_block_mask(block_mask, lay)
    lo, hi = intervals(block_mask)
    q4, k4, v4, o4, do4 = (_blas_rows(x if x.ndim == 4 else x.unsqueeze(0))
                           for x in (query, key, value, out, dout))  # (b, h, n, d)
    rows = q4.shape[:-1]  # (b, h, t)
    lse3 = lse.reshape(rows).float().contiguous()  # (b, h, t)
    dlse3 = lse3.new_empty(0) if dlse is None else dlse.reshape(rows).float().contiguous()  # (b, h, t)
    dq, dk, dv = load().interval_backward(q4, k4, v4, o4, do4, lse3, dlse3, lo, hi, float(scale),
                                          BLOCK_Q, BACKWARD_BLOCK_K)
    return dq.view(query.shape), dk.view(key.shape), dv.view(value.shape)


def kernel_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     block_mask: BlockMask, *, scale: float,
                     enable_gqa: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Differentiable: the kernel's forward and backward (from the saved lse)."""
    return differentiable((kernel_forward, kernel_backward), query, key, value, block_mask,
                          scale=float(scale), enable_gqa=bool(enable_gqa))


def attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              block_mask: BlockMask, *, scale: float,
              enable_gqa: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Differentiable attention by the kernel where it runs and was measured faster, else by the
    spans path (`qkv.attention.spans.spans_attention`; also under `use_kernel(False)`).

    Under autograd both passes are the kernel's for every interval mask (`can_run`): its
    backward was measured faster (documents of 2,048 at 16k, one thread: 1.1-1.2× the spans
    backward), and it must read the lse of its own forward. The backward recomputes
    P = exp(S − lse) with S from its own sgemm; an lse from torch's kernel (the spans forward)
    is the log-sum-exp of scores rounded by another gemm, a few ulp of |S| apart, and
    exp(S − lse) turns that into a relative error of P of a few ulp of |S| — at |S| ≈ 50, coherent
    across rows whose queries are equal, dv was 3.5e-4 off where the plain float32 path is
    7.9e-6 (issue 40, `benchmarks/fuzz_kernel.py --seed 11 --only 13`). A forward alone (no
    gradient wanted) runs the kernel for a window (`supports`) and the spans path for documents,
    where torch's kernel per span was as fast (`_has_window`)."""
    from qkv.attention import spans
    if not can_run(query, key, value, block_mask):
        return spans.spans_attention(query, key, value, block_mask, scale=scale, enable_gqa=enable_gqa)
    wants_grad = torch.is_grad_enabled() and any(x.requires_grad for x in (query, key, value))
    if not wants_grad and not _has_window(block_mask.mask_mod):
        return spans.spans_forward(query, key, value, block_mask, scale=float(scale),
                                   enable_gqa=bool(enable_gqa))
    return differentiable((kernel_forward, kernel_backward), query, key, value, block_mask,
                          scale=float(scale), enable_gqa=bool(enable_gqa))
