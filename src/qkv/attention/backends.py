"""Attention backends, registered by name behind one signature, and the `"auto"` rule.

Every backend takes already-validated tensors and a mask *description* and returns the output
`(..., t, dv)`:

```text
backend(query, key, value, *, mask: AttentionMask, bias, dropout_p, scale, enable_gqa) -> Tensor
```

`mask` ([`AttentionMask`][qkv.attention.attention_mask.AttentionMask]) says causal / window /
padding / packed sequences / a dense tensor; `bias` is a float score bias (ALiBi) or None. A backend
chooses what to materialise:

* `"reference"` — `qkv.attention.reference.reference_attention`, the readable math; it
  materialises the whole mask.
* `"fused"` — `torch.nn.functional.scaled_dot_product_attention` (PyTorch's flash /
  memory-efficient / math kernels). Plain top-left causality goes to it as `is_causal=True` so
  its causal kernel runs; packed sequences are laid out in a padded grid (see
  [`VarLen`][qkv.attention.attention_mask.VarLen]) so each runs with its own keys only; everything
  else is materialised into one mask.
* `"blockwise"` — the non-empty blocks of a [`BlockMask`][qkv.attention.block_mask.BlockMask] only
  (structure only: no dense mask, bias or dropout); O(N) memory, exact, differentiable, and it
  gives the log-sum-exp. It runs `qkv.attention.spans` (torch's fused CPU kernel once per
  span, merged by lse) where that can answer, else `qkv.attention.blockwise` (the readable
  pure-torch online softmax): for `softcap=`, a value head size ≠ the query's, or non-CPU
  tensors (`qkv.attention.spans.supports`).
  Inside spans, a window's forward and both passes of an interval mask under autograd (the
  kernel's backward reads its own forward's lse) run qkv's C++ kernel where
  set-up built it (`qkv.attention.kernels.attention`; `kernels.use_kernel(False)` selects
  the pure-torch spans path).
* `"auto"` — the dispatch rule, in `choose_backend` and nowhere else.

Each backend declares what it can do when it registers (`Capabilities`: the log-sum-exp
`(..., h, t)` for `return_lse=True` and the sinks merged from it, `softcap`, a tensor mask,
a score bias, dropout, dv ≠ d, device types); the public functions check a call against them
and the tests are parametrised over the registry (`backends_with`):

```text
backend      lse  softcap  tensor mask  bias  dropout  dv ≠ d  devices
reference    yes  yes      yes          yes   yes      yes     any
blockwise    yes  yes      no           no    no       yes     any
fused        no   no       yes          yes   yes      yes     any
```
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Callable, Protocol

import torch
import torch.nn.functional as F

from qkv.attention.block_mask import band_sides, block_mask_for
from qkv.attention.blockwise import blockwise_attention, compute_dtype
from qkv.attention.attention_mask import AttentionMask, combine
from qkv.attention import kernels
from qkv.attention.flash_cpu import any_nan, nan_key_rows
from qkv.attention.reference import reference_attention
from qkv.attention.spans import supports as spans_supports

# torch 2.5 made SDPA return zeros for all-masked rows (before: NaN) and added enable_gqa.
_TORCH_2_5 = tuple(int(p) for p in torch.__version__.split(".")[:2]) >= (2, 5)


class Backend(Protocol):
    def __call__(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        *,
        mask: AttentionMask,
        bias: torch.Tensor | None,
        dropout_p: float,
        scale: float,
        enable_gqa: bool,
    ) -> torch.Tensor: ...


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do, declared once at `register_backend`; calls are checked
    against it (`refuses`) and tests select backends by it (`backends_with`)."""

    lse: bool = False  # return_lse=True gives (output, lse); sinks are merged from the lse
    softcap: bool = False  # Gemma 2's logit cap inside its scores (an lse backend's argument)
    dense_mask: bool = True  # a tensor attn_mask (bool or float)
    bias: bool = True  # a float score bias (ALiBi, T5)
    dropout: bool = True  # dropout_p > 0 on the weights
    dv_differs: bool = True  # a value head size dv ≠ the query's d
    devices: tuple[str, ...] | None = None  # the device types it runs on; None = any

    @property
    def sinks(self) -> bool:
        """Learned sinks (gpt-oss) are merged from the lse after the backend ran."""
        return self.lse

    def refuses(self, *, lse: bool = False, softcap: bool = False, dense_mask: bool = False,
                bias: bool = False, dropout: bool = False, dv_differs: bool = False,
                device: str | None = None) -> list[str]:
        """What a call needs that this backend cannot do (empty: it can run the call)."""
        asked = dict(lse=lse, softcap=softcap, dense_mask=dense_mask, bias=bias, dropout=dropout,
                     dv_differs=dv_differs)
        missing = [WORDS[name] for name, wanted in asked.items() if wanted and not getattr(self, name)]
        if device is not None and self.devices is not None and device not in self.devices:
            missing.append(f"device {device!r}")
        return missing


WORDS = dict(lse="the log-sum-exp", softcap="softcap=", dense_mask="a tensor attn_mask",
             bias="a score bias", dropout="dropout", dv_differs="dv ≠ d")  # for messages


@dataclass(frozen=True, eq=False)
class RegisteredBackend:
    """A registry row: the backend, its `(output, lse)` variant (lse backends) and what it can do.
    Called like the backend itself."""

    name: str
    fn: Backend
    with_lse: Callable | None
    capabilities: Capabilities

    def __call__(self, *args, **kwargs) -> torch.Tensor:
        return self.fn(*args, **kwargs)


BACKENDS: dict[str, RegisteredBackend] = {}


def register_backend(name: str, *, with_lse: Callable | None = None,
                     **capabilities) -> Callable[[Backend], Backend]:
    """Decorator: make a backend selectable as `backend=name`, with what it can do.

    `with_lse`: the same backend returning `(output, lse)` (lse (..., h, t) float32; float64
    for float64 inputs) and taking `softcap=` — the backend then serves `return_lse=True`
    and sinks. `capabilities`: the fields of `Capabilities` other than `lse` (a new
    backend says what it cannot do: `bias=False`, `devices=("cpu",)` …).

    A name is registered once: registering it again raises `ValueError` (a silent replacement
    would change every caller's numbers). `"auto"` is reserved for the dispatch rule.

    Examples:
        >>> @register_backend("mine", bias=False, dropout=False)   # doctest: +SKIP
        ... def mine(query, key, value, *, mask, bias, dropout_p, scale, enable_gqa): ...
    """
    known = {f.name for f in fields(Capabilities)} - {"lse"}
    unknown = set(capabilities) - known
    if unknown:
        raise ValueError(f"register_backend({name!r}): unknown capabilities {sorted(unknown)}; "
                         f"known: {sorted(known)}")
    declared = Capabilities(lse=with_lse is not None, **capabilities)

    def add(fn: Backend) -> Backend:
        if name == "auto" or name in BACKENDS:
            raise ValueError(f"attention backend {name!r} is already registered "
                             f"(registered: {['auto', *BACKENDS]})")
        BACKENDS[name] = RegisteredBackend(name, fn, with_lse, declared)
        return fn

    return add


def backends_with(**needs) -> list[str]:
    """The registered backends that can run a call needing `needs` (the arguments of
    `Capabilities.refuses`), in registration order: `backends_with(lse=True)` →
    `["reference", "blockwise"]`."""
    return [name for name, b in BACKENDS.items() if not b.capabilities.refuses(**needs)]


def backend_for(name: str, **needs) -> RegisteredBackend:
    """The registry row `name` after checking it can run the call: ValueError naming the
    backend, what it lacks and the backends that have it."""
    row = BACKENDS.get(name)
    if row is None:
        raise ValueError(f"unknown backend {name!r}; choose from {['auto', *BACKENDS]}")
    missing = row.capabilities.refuses(**needs)
    if missing:
        wanted = {k: v for k, v in needs.items() if v}
        raise ValueError(f"backend {name!r} cannot do {', '.join(missing)}; backends that can: "
                         f"{backends_with(**wanted)}")
    return row


def repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """(..., h_kv, s, d) → (..., h_kv·groups, s, d): each key/value head serves `groups` query heads."""
    return x if groups == 1 else x.repeat_interleave(groups, dim=-3)


def gqa_groups(query: torch.Tensor, key: torch.Tensor, enable_gqa: bool) -> int:
    """How many query heads share one key/value head (1 without GQA or without a head dim)."""
    return query.shape[-3] // key.shape[-3] if enable_gqa and query.ndim >= 3 else 1


def reference_with_lse(query, key, value, *, mask, bias, dropout_p, scale, enable_gqa, softcap=None):
    """The reference path's `(output, lse)`; lse (..., h, t) in float32 (float64 inputs: float64).
    `softcap`: Gemma 2's logit cap (see `reference_attention`)."""
    groups = gqa_groups(query, key, enable_gqa)
    dense = mask.materialize(query.shape[-2], key.shape[-2], rank=query.ndim, device=query.device)
    trace = reference_attention(query, repeat_kv(key, groups), repeat_kv(value, groups), dense,
                                scale=scale, dropout_p=dropout_p, bias=bias, softcap=softcap)
    lse = trace.lse.to(compute_dtype(query.dtype))
    return trace.output, lse.expand(*trace.output.shape[:-1])


@register_backend("reference", with_lse=reference_with_lse, softcap=True)
def reference_backend(query, key, value, *, mask, bias, dropout_p, scale, enable_gqa):
    return reference_with_lse(query, key, value, mask=mask, bias=bias, dropout_p=dropout_p,
                              scale=scale, enable_gqa=enable_gqa)[0]


def blockwise_with_lse(query, key, value, *, mask, bias, dropout_p, scale, enable_gqa, softcap=None):
    """The blockwise backend's `(output, lse)` (see `qkv.attention.blockwise`)."""
    if query.numel() == 0 or key.numel() == 0:  # nothing to tile (no heads, rows, keys or dims)
        return reference_with_lse(query, key, value, mask=mask, bias=bias, dropout_p=dropout_p,
                                  scale=scale, enable_gqa=enable_gqa, softcap=softcap)
    groups = gqa_groups(query, key, enable_gqa)
    t, s = query.shape[-2], key.shape[-2]
    batch = math.prod(query.shape[:-3]) if query.ndim >= 3 else 1
    heads = query.shape[-3] if query.ndim >= 3 else 1
    block = block_mask_for(mask, batch, heads, t, s, device=query.device)
    if spans_supports(query, key, value, softcap):  # with qkv's C++ kernel where built and faster
        return kernels.attention(query, key, value, block, scale=scale, enable_gqa=groups > 1)
    return blockwise_attention(query, key, value, block, scale=scale, enable_gqa=groups > 1,
                               softcap=softcap)


@register_backend("blockwise", with_lse=blockwise_with_lse, softcap=True, dense_mask=False,
                  bias=False, dropout=False)
def blockwise_backend(query, key, value, *, mask, bias, dropout_p, scale, enable_gqa):
    return blockwise_with_lse(query, key, value, mask=mask, bias=bias, dropout_p=dropout_p,
                              scale=scale, enable_gqa=enable_gqa)[0]


@register_backend("fused")
def fused_backend(query, key, value, *, mask, bias, dropout_p, scale, enable_gqa):
    out = _fused(query, key, value, mask=mask, bias=bias, dropout_p=dropout_p, scale=scale,
                 enable_gqa=enable_gqa)
    return nan_rows(query, _nan_keys(query, key, out, mask=mask, bias=bias))


def nan_rows(query: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """NaN in → NaN out: a query row holding a NaN gives a NaN output row (qkv's policy on every
    backend; torch's CPU kernel would give zeros there and hide the NaN)."""
    bad = query.isnan().any(-1, keepdim=True)  # (..., t, 1)
    if torch.compiler.is_compiling():  # traced: no branch on the numbers (a graph break)
        return out.masked_fill(bad, float("nan"))
    return out.masked_fill(bad, float("nan")) if bool(bad.any()) else out


def _nan_keys(query, key, out, *, mask: AttentionMask, bias):
    """NaN in → NaN out for keys: a row that sees a key holding a NaN gives a NaN row, even where
    torch's CPU kernel gives 0 (a row whose only keys hold a NaN). One check of the keys; only
    when one holds a NaN is the mask asked which rows see it (materialised, as `_fused` did,
    except for torch's causal kernel).

    The kernel's only way to lose a NaN key is to treat a row whose keys all hold NaN as a row
    with no key: its output row is exact zeros. Any other row that sees a NaN key sums a NaN and
    is NaN already. So the keys are read only when some output row is all zeros: in KV-cache
    decoding (t = 1 against a long cache) reading them cost as much as the attention itself.
    Traced (`torch.compile`) the rule runs without those checks: a branch on the numbers
    would break the graph.
    """
    if out.numel() == 0 or not torch.compiler.is_compiling() and (
            not bool((out == 0).all(-1).any()) or not any_nan(key)):
        return out
    bad = key.isnan().any(-1)  # (..., h_kv, s)
    t, s = query.shape[-2], key.shape[-2]
    keep = None
    causal = _torch_causal(mask, bias, t, s)
    if not causal:
        dense = combine(bias, mask.materialize(t, s, rank=query.ndim, device=query.device))
        keep = dense if dense is None or dense.dtype == torch.bool else ~torch.isneginf(dense)
    seen = nan_key_rows(bad, t, heads=query.shape[-3] if query.ndim >= 3 else None, causal=causal,
                        keep=keep)  # (..., h, t)
    return out.masked_fill(seen.unsqueeze(-1), float("nan"))


def causal_only(mask: AttentionMask) -> bool:
    """Causal and nothing else — no window, key padding, packed sequences, tensor or block mask —
    in either alignment. The one "plain causal" test: torch's kernel (`_torch_causal`) and
    the `"auto"` rule's causal row ask it."""
    return (mask.causal and mask.window is None and mask.key_padding is None and mask.varlen is None
            and mask.dense is None and mask.block is None)


def _torch_causal(mask: AttentionMask, bias, t: int, s: int) -> bool:
    """Whether torch's `is_causal=True` is the whole mask: causal only, no bias, the diagonal
    top-left (bottom-right with t == s is the same thing), so torch's own causal kernel runs."""
    return bias is None and causal_only(mask) and (mask.alignment == "top_left" or t == s)


def _fused(query, key, value, *, mask, bias, dropout_p, scale, enable_gqa):
    if mask.varlen is not None:
        return _fused_varlen(query, key, value, mask=mask, dropout_p=dropout_p, scale=scale,
                             enable_gqa=enable_gqa)
    t, s = query.shape[-2], key.shape[-2]
    torch_causal = _torch_causal(mask, bias, t, s)
    dense = None
    if not torch_causal:
        dense = combine(bias, mask.materialize(t, s, rank=query.ndim, device=query.device))
    if dense is not None and dense.dtype != torch.bool and dense.dtype != query.dtype:
        dense = dense.to(query.dtype)
    if not _TORCH_2_5 and dense is not None:
        return reference_backend(query, key, value, mask=mask, bias=bias, dropout_p=dropout_p,
                                 scale=scale, enable_gqa=enable_gqa)
    return _torch_sdpa(query, key, value, dense, dropout_p=dropout_p, is_causal=torch_causal,
                       scale=scale, enable_gqa=enable_gqa)


def _torch_sdpa(query, key, value, attn_mask, *, dropout_p, is_causal, scale, enable_gqa):
    groups = gqa_groups(query, key, enable_gqa)
    if groups == 1:
        enable_gqa = False  # nothing to repeat; also keeps torch's fastest path for 2-D inputs
    elif not _TORCH_2_5:
        key, value, enable_gqa = repeat_kv(key, groups), repeat_kv(value, groups), False
    gqa = dict(enable_gqa=True) if enable_gqa else {}
    return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask,
                                          dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                                          **gqa)


def _fused_varlen(query, key, value, *, mask: AttentionMask, dropout_p, scale, enable_gqa):
    """Packed sequences: scatter into an (n, max_len) grid, attend per sequence, gather back.

    query (..., N, d) → grid (n, ..., max_len, d): each sequence a batch row of its own, its
    padding excluded as keys (padded query rows are computed and dropped). The grid costs
    O(n · max_len) memory, not O(N²).
    """
    vl = mask.varlen

    def to_grid(x: torch.Tensor) -> torch.Tensor:
        rows = x.movedim(-2, 0)  # (N, ..., d)
        # zeros, not empty: padded rows must be finite (0 · NaN would leak through the softmax)
        grid = rows.new_zeros(len(vl.lengths) * vl.max_len, *rows.shape[1:])
        grid.index_copy_(0, vl.index, rows)  # (n · max_len, ..., d)
        return grid.view(len(vl.lengths), vl.max_len, *rows.shape[1:]).movedim(1, -2)  # (n, ..., max_len, d)

    q, k, v = to_grid(query), to_grid(key), to_grid(value)
    real = vl.real.view(len(vl.lengths), *[1] * (q.ndim - 2), vl.max_len)  # (n, 1…, 1, max_len)
    structure = AttentionMask(causal=mask.causal, alignment=mask.alignment, window=mask.window)
    keep = combine(real, structure.materialize(vl.max_len, vl.max_len, device=query.device))
    out = _torch_sdpa(q, k, v, keep, dropout_p=dropout_p, is_causal=False, scale=scale,
                      enable_gqa=enable_gqa)  # (n, ..., max_len, dv)
    out = out.movedim(-2, 1).reshape(-1, *out.shape[1:-2], out.shape[-1])  # (n · max_len, ..., dv)
    return out.index_select(0, vl.index).movedim(0, -2)  # (..., N, dv)


def choose_backend(query: torch.Tensor, key: torch.Tensor, mask: AttentionMask | None = None, *,
                   bias: torch.Tensor | None = None, dropout_p: float = 0.0,
                   return_lse: bool = False) -> str:
    """The `"auto"` rule — this table and nothing else (first matching row wins):

    ```text
    case                                              backend      path inside it
    ------------------------------------------------  -----------  ----------------------------
    empty q or k (t, s, b, h, h_kv or d = 0)          reference    (kernels' behaviour varied)
    traced by torch.compile: return_lse / fused       reference /  (the blockwise plan is Python
                                                      fused         over the mask's blocks)
    block_mask= or return_lse=True, structure only    blockwise    spans (softcap: pure torch)
      … with a dense mask, a bias or dropout          reference
    window, s ≥ BLOCKWISE_MIN_KEYS, band ≤ half a row blockwise    spans: one call for the band
    packed sequences, longest ≥ BLOCKWISE_MIN_DOCUMENT blockwise   spans: one call per length
    causal only (either alignment), b·h < threads     blockwise    spans: balanced causal levels
    everything else                                   fused        torch's SDPA (is_causal kernel)
    ```

    Measured (`benchmarks/long.py`, fp32, d = 64, 16k tokens; RESULTS.md, issue 21 and 10):
    torch's fused kernel is as fast as or faster than the explicit math for every size, dtype and
    mask kind it can run, and exact (`benchmarks/attention.py`). A window visiting at most half
    of each row runs 25–45× faster by spans than SDPA over a materialised (t × s) mask. Packed
    documents of 2,048 run by spans 3–10× faster than the padded grid (whose kernel expands the key
    mask to (n, h, L, L)). Plain causal: torch's kernel splits (batch, head, query block) in
    contiguous chunks per thread, so with fewer heads than threads its first thread gets the
    cheap rows; spans' causal levels give every call equal units (1.4× torch at h = 1 on 2
    threads); with as many heads as threads, or on one thread, torch's kernel is as fast or
    faster (0.7–1.0×), so it keeps them. Threads are torch's (`torch.get_num_threads()`).
    """
    t, s = query.shape[-2], key.shape[-2]
    if query.numel() == 0 or key.numel() == 0:
        return "reference"
    if torch.compiler.is_compiling():
        return "reference" if return_lse else "fused"
    mask = mask if mask is not None else AttentionMask()
    structure_only = bias is None and not dropout_p and mask.dense is None
    if mask.block is not None or return_lse:
        return "blockwise" if structure_only else "reference"
    if structure_only and mask.varlen is None and _band_is_sparse(t, s, mask):
        return "blockwise"
    if structure_only and mask.varlen is not None and mask.varlen.max_len >= BLOCKWISE_MIN_DOCUMENT:
        return "blockwise"  # the padded grid holds (n, h, max_len, max_len) mask floats
    if structure_only and causal_only(mask) and query.ndim >= 3:
        lanes = math.prod(query.shape[:-2])  # b · h: torch's kernel's unit of balance
        if lanes < torch.get_num_threads() and t >= CAUSAL_SPANS_MIN_LENGTH:
            return "blockwise"
    return "fused"


# Measured in benchmarks/long.py (fp32, one thread, window 512 at N = 16k): the fused kernel
# with the materialised mask runs 19.8 GFLOP/s over the whole (t × s) matrix, blockwise ~21 over
# the scores it visits — about the same cost per score, plus per-block overhead — so it wins
# when the band it visits is at most half of each row, on rows long enough (5× at N = 4k).
BLOCKWISE_MIN_KEYS = 1024
BLOCKWISE_MAX_FRACTION = 0.5
# Packed documents of 2,048 tokens: blockwise 2× (N = 4k) to 3.6× (N = 16k) faster than the
# padded grid, whose torch kernel expands the grid's key mask to (n, h, L, L) (1.3 GB at 16k).
BLOCKWISE_MIN_DOCUMENT = 2048
# Plain causal by spans only on rows long enough for its log₂(t/128) calls to be balanced work
# (measured at 16k; below a few blocks torch's kernel has nothing to balance).
CAUSAL_SPANS_MIN_LENGTH = 2048


def _band_is_sparse(t: int, s: int, mask: AttentionMask) -> bool:
    """Whether a window leaves each query row at most `BLOCKWISE_MAX_FRACTION` of its keys."""
    if mask.window is None or s < BLOCKWISE_MIN_KEYS:
        return False
    left, right = band_sides(mask.causal, mask.window)
    if left is None or right is None:
        return False
    visited = left + right + 1 + 2 * 128  # the band, plus the partial blocks at its edges
    return visited <= BLOCKWISE_MAX_FRACTION * s
