"""The public attention functions: a drop-in for torch's SDPA, and the traced version.

Examples:
    >>> import torch, qkv
    >>> q = k = v = torch.randn(2, 4, 7, 16)              # (b, h, t, d)
    >>> out = qkv.scaled_dot_product_attention(q, k, v, is_causal=True)
    >>> out.shape
    torch.Size([2, 4, 7, 16])

**NaN in → NaN out**: a query row holding a NaN gives a NaN output row (and lse) on every
backend; torch's own kernel would give zeros. So does a row that attends a key holding a NaN
(torch's CPU kernel gives 0 where those are the row's only keys), and a NaN in a value reaches
every row that attends it. Rows the mask hides every NaN from may be NaN too (the reference
backend makes the whole head NaN; the others may, for rows that share a kernel block of keys
with the NaN).
"""

from __future__ import annotations

import math
import numbers

import torch

from qkv.attention.backends import BACKENDS, RegisteredBackend, backend_for, backends_with, \
    choose_backend, gqa_groups, repeat_kv
from qkv.attention.block_mask import BlockMask, block_mask_for, check_position
from qkv.attention.attention_mask import ALIGNMENTS, AttentionMask, combine
from qkv.attention.reference import reference_attention
from qkv.attention.sinks import check_sinks, merge_sinks
from qkv.attention.trace import AttentionTrace


def _shape(x: torch.Tensor) -> str:
    return str(tuple(x.shape))


def _broadcasts_to(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    """Whether `shape` broadcasts to exactly `target`. Plain Python on purpose:
    `torch.broadcast_shapes` costs ~40 µs a call on CPU, as much as a whole small attention."""
    if len(shape) > len(target):
        return False
    return all(a == 1 or a == b for a, b in zip(reversed(shape), reversed(target)))


def _check_inputs(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, window,
                  causal_alignment, key_padding_mask=None, mask=None, bias=None):
    """Validate the public arguments; return the scale to use. Errors name argument and values.

    Every call pays for this, so shapes are read once into tuples (each `x.shape` is a call
    into torch) and nothing slower than tuple arithmetic runs unless an argument is wrong.
    """
    for name, x in (("query", query), ("key", key), ("value", value)):
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if not x.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    check_flag("is_causal", is_causal)
    check_flag("enable_gqa", enable_gqa)
    qs, ks, vs = tuple(query.shape), tuple(key.shape), tuple(value.shape)
    for name, shape in (("query", qs), ("key", ks), ("value", vs)):
        if len(shape) < 2:
            raise ValueError(f"{name} must have shape (..., length, dim), got {shape}")
    if not (len(qs) == len(ks) == len(vs)):
        raise ValueError(
            f"query, key and value must have the same rank, got query {qs}, key {ks}, value {vs}"
        )
    if not (query.dtype == key.dtype == value.dtype):
        raise ValueError(
            f"query, key and value must share a dtype, got {query.dtype}, {key.dtype}, {value.dtype}"
        )
    _check_devices(query, key=key, value=value, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                   bias=bias, mask=mask)
    if query.is_meta:  # every tensor is then on meta: no numbers, a kernel would fail deep inside
        raise ValueError(f"query, key and value are meta tensors (shapes only, no data: query "
                         f"{qs}); materialise them first (e.g. module.to_empty(device='cpu'))")
    if qs[-1] != ks[-1]:
        raise ValueError(f"query and key must have the same last dim d, got query {qs} and key {ks}")
    if ks[:-1] != vs[:-1]:
        raise ValueError(f"key and value must agree on (..., s), got key {ks} and value {vs}")
    if qs[:-3] != ks[:-3]:
        raise ValueError(f"query and key must have the same batch dims, got query {qs} and key {ks}")
    if len(qs) >= 3:
        hq, hkv = qs[-3], ks[-3]
        if enable_gqa:
            if hkv == 0 or hq % hkv:
                raise ValueError(
                    f"with enable_gqa, query heads ({hq}) must be a multiple of key/value heads ({hkv})"
                )
        elif hq != hkv:
            raise ValueError(
                f"query has {hq} heads but key/value have {hkv}; pass enable_gqa=True for "
                f"grouped-query attention (query {qs}, key {ks})"
            )
    if attn_mask is not None:
        _check_attn_mask(attn_mask, is_causal, qs, ks)
    _check_extras(qs, ks, key_padding_mask, mask, bias, given=(
        attn_mask is not None or is_causal or window is not None or causal_alignment != "top_left"
        or key_padding_mask is not None))
    if not (_is_number(dropout_p) and 0.0 <= float(dropout_p) < 1.0):
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p!r}")
    if window is not None:
        if not (isinstance(window, (tuple, list)) and len(window) == 2):
            raise ValueError(f"window must be a pair (left, right), got {window!r}")
        for side, w in zip(("left", "right"), window):
            check_position(f"window {side} size", w, none=True)
    if causal_alignment not in ALIGNMENTS:
        raise ValueError(f"causal_alignment must be one of {ALIGNMENTS}, got {causal_alignment!r}")
    return resolve_scale(scale, qs[-1])


def _check_attn_mask(attn_mask, is_causal, qs: tuple[int, ...], ks: tuple[int, ...]) -> None:
    """torch's `attn_mask`: a bool or float tensor broadcasting to the scores (..., t, s), and
    not together with `is_causal` (qs, ks: the query's and key's shapes)."""
    if not isinstance(attn_mask, torch.Tensor):
        raise ValueError(f"attn_mask must be a torch.Tensor or None, got {type(attn_mask).__name__}")
    if attn_mask.dtype != torch.bool and not attn_mask.is_floating_point():
        raise ValueError(f"attn_mask must be bool or floating point, got dtype {attn_mask.dtype}")
    if attn_mask.ndim < 2:
        raise ValueError(f"attn_mask must have at least 2 dims (..., t, s), got shape "
                         f"{_shape(attn_mask)}")
    if is_causal:
        raise ValueError("pass either attn_mask or is_causal=True, not both "
                         "(fold the causal structure into attn_mask, or use window=)")
    scores_shape = (*qs[:-1], ks[-2])
    if not _broadcasts_to(tuple(attn_mask.shape), scores_shape):
        raise ValueError(
            f"attn_mask of shape {_shape(attn_mask)} does not broadcast to the scores' shape "
            f"{scores_shape} (..., t, s)"
        )


def resolve_scale(scale, d: int) -> float:
    """The scale to use: `scale` as a float, or 1/√d for None (1 for d = 0). The one check of
    a scale argument (every backend, ring and Ulysses attention): a real number that is finite —
    a NaN or infinite scale would turn every score into NaN or ±inf.

    Raises:
        ValueError: naming `scale` and the value (a string, a bool, NaN, ±inf, 10**400).
    """
    if scale is None:
        return 1.0 / math.sqrt(d) if d else 1.0
    try:
        value = float(scale) if _is_number(scale) else math.nan
    except OverflowError:  # an int beyond float's range, 10**400
        value = math.inf
    if not math.isfinite(value):
        raise ValueError(f"scale must be a finite number, got {scale!r}")
    return value


def check_softcap(softcap) -> float | None:
    """`softcap` as a float (None stays None): ValueError unless a finite number > 0."""
    if softcap is None:
        return None
    try:
        value = float(softcap) if _is_number(softcap) else math.nan
    except OverflowError:  # 10**400
        value = math.inf
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"softcap must be a finite number > 0 or None, got {softcap!r}")
    return value


def check_flag(name: str, x) -> bool:
    """A yes/no argument: True or False (0/1 and numpy's bools too); ValueError for anything
    else — `enable_gqa="no"` is truthy and would silently mean True."""
    if isinstance(x, torch.Tensor) or x not in (True, False):
        raise ValueError(f"{name} must be True or False, got {x!r}")
    return bool(x)


def _is_number(x) -> bool:
    """A real number (int, float, numpy or 0-d tensor scalar), not a bool, str or None."""
    if isinstance(x, torch.Tensor):
        return x.numel() == 1 and not x.dtype.is_complex and x.dtype != torch.bool
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _check_devices(query: torch.Tensor, **others) -> None:
    """Every tensor on the query's device: a `ValueError` naming the argument, never a kernel's
    RuntimeError or (the reference path across devices) uninitialised numbers."""
    for name, x in others.items():
        if isinstance(x, AttentionMask):
            parts = {"dense": x.dense, "key_padding": x.key_padding,
                     "varlen": x.varlen.cu_seqlens if x.varlen is not None else None,
                     "block": x.block.kinds if isinstance(x.block, BlockMask) else None}
            for field, y in parts.items():
                if isinstance(y, torch.Tensor) and y.device != query.device:
                    raise ValueError(f"{name}.{field} is on device {y.device} but query is on "
                                     f"{query.device}; put every tensor on one device")
        elif isinstance(x, BlockMask):
            if x.kinds.device != query.device:
                raise ValueError(f"{name} is on device {x.kinds.device} but query is on "
                                 f"{query.device}; build it with device={query.device!s}")
        elif isinstance(x, torch.Tensor) and x.device != query.device:
            raise ValueError(f"{name} is on device {x.device} but query is on {query.device}; "
                             f"put every tensor on one device")


def _check_block_mask(query, key, block_mask, *, given: bool) -> None:
    """`block_mask` fits the call and stands alone (other masks fold into it: `and_masks`)."""
    if not isinstance(block_mask, BlockMask):
        raise ValueError(f"block_mask must be a BlockMask from qkv.create_block_mask, got "
                         f"{type(block_mask).__name__}")
    if given:
        raise ValueError("pass either block_mask= or attn_mask / is_causal / window / "
                         "causal_alignment / key_padding_mask / mask, not both (combine structure "
                         "into the block mask: qkv.masks.and_masks(...))")
    _check_devices(query, block_mask=block_mask)
    batch = math.prod(query.shape[:-3]) if query.ndim >= 3 else 1
    heads = query.shape[-3] if query.ndim >= 3 else 1
    block_mask.check(batch, heads, query.shape[-2], key.shape[-2])


def _check_extras(qs, ks, key_padding_mask, mask, bias, *, given: bool) -> None:
    """The arguments torch's SDPA does not have: key_padding_mask, mask, bias."""
    t, s = qs[-2], ks[-2]
    if key_padding_mask is not None:
        want = (*qs[:-3], s)
        if not isinstance(key_padding_mask, torch.Tensor) or key_padding_mask.dtype != torch.bool \
                or tuple(key_padding_mask.shape) != want:
            got = tuple(key_padding_mask.shape) if isinstance(key_padding_mask, torch.Tensor) else key_padding_mask
            raise ValueError(f"key_padding_mask must be a bool tensor of shape (..., s) = {want} "
                             f"(True = real key), got {got}")
    if mask is not None:
        if not isinstance(mask, AttentionMask):
            raise ValueError(f"mask must be a qkv.attention.AttentionMask, got {type(mask).__name__}")
        if given:
            raise ValueError("pass either mask=AttentionMask(...) or attn_mask / is_causal / window / "
                             "causal_alignment / key_padding_mask, not both")
        if mask.alignment not in ALIGNMENTS:
            raise ValueError(f"mask.alignment must be one of {ALIGNMENTS}, got {mask.alignment!r}")
        if mask.varlen is not None:
            n = mask.varlen.total
            if t != n or s != n:
                raise ValueError(f"packed sequences (mask.varlen) of {n} tokens need t = s = {n}, "
                                 f"got t={t}, s={s}")
            if mask.dense is not None or mask.key_padding is not None or bias is not None:
                raise ValueError("packed sequences (mask.varlen) take no dense mask, key padding or "
                                 "bias (each sequence sees only its own keys already)")
    if bias is not None:
        if not isinstance(bias, torch.Tensor) or not bias.is_floating_point():
            raise ValueError(f"bias must be a floating-point tensor, got "
                             f"{getattr(bias, 'dtype', type(bias).__name__)}")
        if not _broadcasts_to(tuple(bias.shape), (*qs[:-1], s)):
            raise ValueError(f"bias of shape {_shape(bias)} does not broadcast to the scores' shape "
                             f"{(*qs[:-1], s)} (..., t, s)")


def _describe(attn_mask, is_causal, window, causal_alignment, key_padding_mask, mask) -> AttentionMask:
    """The public arguments as one [`AttentionMask`][qkv.attention.attention_mask.AttentionMask]
description."""
    if mask is not None:
        return mask
    return AttentionMask(causal=bool(is_causal), alignment=causal_alignment,
                         window=tuple(window) if window is not None else None,
                         key_padding=key_padding_mask, dense=attn_mask)


def _prepare(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, window,
             causal_alignment, key_padding_mask, mask, bias, block_mask) -> tuple[float, AttentionMask]:
    """The public arguments checked (`_check_inputs`) and read as (the scale, one
    [`AttentionMask`][qkv.attention.attention_mask.AttentionMask] holding every mask argument, a
    block mask included)."""
    scale = _check_inputs(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                          window, causal_alignment, key_padding_mask, mask, bias)
    description = _describe(attn_mask, is_causal, window, causal_alignment, key_padding_mask, mask)
    if block_mask is not None:
        _check_block_mask(query, key, block_mask, given=not description.empty)
        description = description.with_(block=block_mask)
    elif description.block is not None:  # mask=AttentionMask(block=...), as models pass it
        _check_block_mask(query, key, description.block,
                          given=not description.with_(block=None).empty)
    return scale, description


def scaled_dot_product_attention(
    # torch's arguments, in torch's order
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
    attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0, is_causal: bool = False,
    scale: float | None = None, enable_gqa: bool = False, *,
    # qkv's: the mask as structure, a score bias, which backend, the lse, softcap and sinks
    window: tuple[int | None, int | None] | None = None, causal_alignment: str = "top_left",
    key_padding_mask: torch.Tensor | None = None, mask: AttentionMask | None = None,
    bias: torch.Tensor | None = None, backend: str = "auto", block_mask: BlockMask | None = None,
    return_lse: bool = False, softcap: float | None = None, sinks: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """`softmax(q·kᵀ · scale + mask) · v` — a drop-in for torch's SDPA, plus what it lacks.

    Args:
        query: (..., h, t, d). key: (..., h_kv, s, d). value: (..., h_kv, s, dv).
            Without `enable_gqa`, h_kv must equal h; any rank >= 2 works.
        attn_mask: bool (True = the key takes part) or float (added to the scaled scores),
            broadcastable to (..., h, t, s). Same meaning as torch's.
        dropout_p: dropout probability on the weights (pass 0.0 in evaluation).
        is_causal: query i may attend to keys up to its own position (see `causal_alignment`).
        scale: multiplies q·kᵀ; default 1/√d (0 is exact: NaN only where q·k is NaN or ±inf).
        enable_gqa: grouped-query / multi-query attention: h must be a multiple of h_kv.
        window: `(left, right)` sliding window: query i attends keys p_i−left … p_i+right
            (`None` on a side = unbounded). Combines with `is_causal` and `attn_mask`.
        causal_alignment: where the diagonal lies when t ≠ s:

            ```text
            "top_left" (torch's)        "bottom_right" (decoding with a KV cache)
            t=2, s=4                    t=2, s=4
                k0 k1 k2 k3                 k0 k1 k2 k3
            q0   1  0  0  0             q0   1  1  1  0
            q1   1  1  0  0             q1   1  1  1  1
            ```

        key_padding_mask: (..., s) bool, True for real keys (`...` = the batch dims in front
            of the heads, e.g. (b, s)): padding as a description, not a (t, s) tensor.
        mask: a prebuilt [`AttentionMask`][qkv.attention.attention_mask.AttentionMask] instead
            of the five mask arguments above (causal, window, padding, packed `VarLen`).
        bias: a float score bias (ALiBi) broadcastable to (..., h, t, s), added to the scaled
            scores; unlike a float `attn_mask` the trace keeps it apart from the mask.
        backend: `"auto"` (`choose_backend`), or a registered name (`"reference"`, `"fused"`,
            `"blockwise"`) that can do what the call asks.
        block_mask: a [`BlockMask`][qkv.attention.block_mask.BlockMask] from
            [`qkv.create_block_mask`][qkv.create_block_mask] (any `mask_mod`; [`qkv.masks`][qkv.masks]
            has the built-ins) for this call's (b, h, t, s), instead of the mask arguments above:
            the blockwise backend visits only its non-empty blocks (O(N) memory).
        return_lse: also return the log-sum-exp of each row's masked, scaled scores.
        softcap: logit soft-capping (Gemma 2): scaled scores become `softcap·tanh(s/softcap)`
            before bias and mask, on an lse backend (torch's kernel has no cap).
        sinks: (h,) learned sink logits (gpt-oss): each adds `exp(sink_h)` to its head's
            softmax denominator and nothing to the output; merged from the lse
            (`qkv.attention.sinks`), and the returned lse includes them.

    Returns:
        (..., h, t, dv); with `return_lse` `(output, lse)`, lse (..., h, t) float32 (float64 for
        float64 inputs), `−inf` for a row with no key, whose output is zeros, never NaN.

    Examples:
        >>> import torch, qkv
        >>> q, k, v = torch.randn(1, 8, 3, 16), torch.randn(1, 2, 10, 16), torch.randn(1, 2, 10, 16)
        >>> qkv.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True,
        ...     causal_alignment="bottom_right", window=(4, 0)).shape
        torch.Size([1, 8, 3, 16])
    """
    scale, description = _prepare(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                                  window, causal_alignment, key_padding_mask, mask, bias, block_mask)
    query, scale = _zero_scale(query, scale)
    if softcap is not None or sinks is not None:
        return _capped_or_sunk(query, key, value, description, bias, float(dropout_p), scale,
                               bool(enable_gqa), backend, bool(return_lse), softcap, sinks)
    row = _backend(backend, query, key, value, description, bias, float(dropout_p),
                   lse=bool(return_lse))
    given = dict(mask=description, bias=bias, dropout_p=float(dropout_p), scale=scale,
                 enable_gqa=bool(enable_gqa))
    return row.with_lse(query, key, value, **given) if return_lse else row.fn(query, key, value, **given)


def _zero_scale(query: torch.Tensor, scale: float) -> tuple[torch.Tensor, float]:
    """(query, scale) as the kernels run them: at scale 0, 0 · q at scale 1 — torch's kernels scale
    the masked −inf too (−inf · 0 = NaN), while the scores 0 · (q·k) are NaN only where q·k is."""
    return (query * 0.0, 1.0) if scale == 0.0 else (query, scale)


def _backend(name, query, key, value, description, bias, dropout_p, *, lse: bool,
             softcap: bool = False, why: str = "return_lse=True needs") -> RegisteredBackend:
    """The registry row that runs the call: `"auto"`'s choice, or the named backend checked
    against what the call needs (its declared `Capabilities`)."""
    if name == "auto":
        return BACKENDS[choose_backend(query, key, description, bias=bias, dropout_p=dropout_p,
                                       return_lse=lse)]
    row = BACKENDS.get(name)
    if row is not None and lse and not row.capabilities.lse:
        raise ValueError(f"{why} a backend that gives the log-sum-exp "
                         f"({backends_with(lse=True)}), got backend={name!r}")
    return backend_for(name, softcap=softcap, dense_mask=description.dense is not None,
                       bias=bias is not None, dropout=bool(dropout_p),
                       dv_differs=value.shape[-1] != query.shape[-1], device=query.device.type)


def _capped_or_sunk(query, key, value, description, bias, dropout_p, scale, enable_gqa, backend,
                    return_lse, softcap, sinks):
    """softcap= / sinks=: an lse backend (the cap lives inside its scores), then the sinks merged."""
    softcap = check_softcap(softcap)
    if sinks is not None:
        check_sinks(sinks, tuple(query.shape))
        _check_devices(query, sinks=sinks)
    row = _backend(backend, query, key, value, description, bias, dropout_p, lse=True,
                   softcap=softcap is not None, why="softcap= and sinks= need")
    out, lse = row.with_lse(query, key, value, mask=description, bias=bias, dropout_p=dropout_p,
                            scale=scale, enable_gqa=enable_gqa, softcap=softcap)
    if sinks is not None:
        out, lse = merge_sinks(out, lse, sinks)
    return (out, lse) if return_lse else out


def attention_trace(
    # torch's SDPA arguments, in torch's order
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
    attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0, is_causal: bool = False,
    scale: float | None = None, enable_gqa: bool = False, *,
    # scaled_dot_product_attention's own, then which query rows to trace
    window: tuple[int | None, int | None] | None = None, causal_alignment: str = "top_left",
    key_padding_mask: torch.Tensor | None = None, mask: AttentionMask | None = None,
    bias: torch.Tensor | None = None, backend: str = "reference", block_mask: BlockMask | None = None,
    rows: torch.Tensor | list[int] | slice | None = None, softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> AttentionTrace:
    """Attention with every intermediate kept: scores, scaled, masked, weights, output, lse.

    Same arguments and shapes as
    [`scaled_dot_product_attention`][qkv.attention.functional.scaled_dot_product_attention]. The
    trace is computed by the reference path (the only one that has the intermediates), so `backend`
    may only be `"reference"` (or `"auto"`, which means it here). `trace.output` is the attention
    output; key and value in the trace are repeated to the query's head count under `enable_gqa`.

    `rows` (query positions): trace only those rows, (..., r, s) numbers instead of
    (..., t, s) — the mask is drawn for those rows alone (through the block mask's
    description), so one token of a 64k-token text costs O(s) per head. Each row's numbers are
    the ones the full trace would hold for it (rows of attention are independent).

    `softcap`, `sinks`: as in
    [`scaled_dot_product_attention`][qkv.attention.functional.scaled_dot_product_attention] (the
    trace keeps both).

    Examples:
        >>> import torch, qkv
        >>> q = k = v = torch.randn(1, 1, 4, 8)
        >>> tr = qkv.attention_trace(q, k, v, is_causal=True)
        >>> tr.weights[0, 0, 0].tolist()    # the first token can only see itself
        [1.0, 0.0, 0.0, 0.0]
    """
    scale, description = _prepare(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                                  window, causal_alignment, key_padding_mask, mask, bias, block_mask)
    if backend not in ("reference", "auto"):
        raise ValueError(f"attention_trace computes with the 'reference' backend, got backend={backend!r}")
    return checked_trace(query, key, value, mask=description, bias=bias, scale=scale,
                         dropout_p=float(dropout_p), enable_gqa=enable_gqa, rows=rows,
                         softcap=softcap, sinks=sinks)


def checked_trace(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *,
                  mask: AttentionMask, bias: torch.Tensor | None, scale: float, dropout_p: float,
                  enable_gqa: bool, rows=None, softcap: float | None = None,
                  sinks: torch.Tensor | None = None) -> AttentionTrace:
    """`attention_trace` on arguments already checked — by `attention_trace` itself, or by the
    `scaled_dot_product_attention` call that ran on the same ones (`traced_attention`'s traced
    rows: the inputs are not checked twice) — with one `mask` description and `scale` a float."""
    groups = gqa_groups(query, key, enable_gqa)
    extras = dict(softcap=check_softcap(softcap), sinks=sinks)
    if sinks is not None:
        check_sinks(sinks, tuple(query.shape))
    if rows is not None:
        return _trace_rows(query, key, value, mask, bias, rows, scale, dropout_p, groups, extras)
    dense = mask.materialize(query.shape[-2], key.shape[-2], rank=query.ndim, device=query.device)
    return reference_attention(query, repeat_kv(key, groups), repeat_kv(value, groups), dense,
                               scale=scale, dropout_p=dropout_p, bias=bias, **extras)


# A short text's rows read their mask off the whole (t, s) mask: drawing it costs less than
# describing it by blocks up to this many cells (~0.6 ms a layer saved at t = s = 9, one thread
# of a 2-core AMD EPYC).
DENSE_ROWS = 1 << 16


def _trace_rows(query, key, value, description, bias, rows, scale, dropout_p, groups,
                extras) -> AttentionTrace:
    """The reference trace of some query rows, with the mask drawn for those rows only."""
    t, s = query.shape[-2], key.shape[-2]
    if isinstance(rows, slice):
        index = torch.arange(t, device=query.device)[rows]  # in range by construction
    else:
        index = torch.as_tensor(rows, device=query.device)
        # a few positions, checked in Python after one read (not a min, a max and a remainder)
        listed = index.tolist() if index.ndim == 1 and not index.is_floating_point() \
            and index.dtype != torch.bool else None
        if listed is None or (listed and (min(listed) < -t or max(listed) >= t)):
            raise ValueError(f"rows must be query positions in [-{t}, {t}), got {rows!r}")
        if listed and min(listed) < 0:
            index = index % t

    def row_part(x):  # a (..., t|1, s) tensor on the chosen rows
        return x if x is None or x.shape[-2] == 1 else x.index_select(-2, index)

    keep = None
    structure = description if description.dense is None else description.with_(dense=None)
    if not structure.empty and structure.block is None and t * s <= DENSE_ROWS:
        keep = structure.materialize(t, s, rank=query.ndim, device=query.device, rows=index)  # the rows' only
    elif not structure.empty:
        batch = math.prod(query.shape[:-3]) if query.ndim >= 3 else 1
        heads = query.shape[-3] if query.ndim >= 3 else 1
        keep = block_mask_for(structure, batch, heads, t, s, device=query.device).rows_mask(
            index, device=query.device)  # (B', H', r, s)
        lead = query.shape[:-3] if query.ndim >= 3 else ()
        keep = keep.reshape(*lead, *keep.shape[1:]) if keep.shape[0] != 1 else \
            keep.reshape(keep.shape[4 - min(query.ndim, 4):])  # broadcast over the batch dims
    dense = combine(row_part(description.dense), keep)
    return reference_attention(query.index_select(-2, index), repeat_kv(key, groups),
                               repeat_kv(value, groups), dense, scale=scale, dropout_p=dropout_p,
                               bias=row_part(bias), **extras)
