"""The named backends and the ``"auto"`` rule, and a property test over random shapes and masks.

The property test draws shapes (odd lengths, t ≠ s, grouped heads, any number of batch dims) and
every mask kind, builds the expected mask here from its definition (``p_i = i + offset``, offset
``s - t`` for bottom-right), and requires each backend's fp32 answer to be at most twice as far
from the fp64 plain answer as the plain implementation run in fp32, plus 2 ulp
(:func:`tolerance.assert_within`) — four times for torch's fused kernel, whose exp and
normalisation round twice as much (``tolerance.FUSED_FACTOR``); in fp64,
:func:`tolerance.assert_agree`.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import qkv
from qkv.attention import BACKENDS, AttentionMask, choose_backend, register_backend
from qkv.attention.backends import backend_for, backends_with
from tolerance import FUSED_FACTOR, assert_agree, assert_within

# every registered backend that takes any mask, bias and dropout (its declared capabilities)
NAMES = (*backends_with(dense_mask=True, bias=True, dropout=True), "auto")


def plain_attention(q, k, v, keep=None, bias=None, scale=None, groups=1):
    """softmax(q kᵀ · scale + bias, keys outside ``keep`` removed) v; zeros for empty rows."""
    if groups > 1:
        index = torch.arange(q.shape[-3]) // groups
        k, v = k.index_select(-3, index), v.index_select(-3, index)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q @ k.transpose(-2, -1)) * scale
    if bias is not None:
        s = s + bias.to(s.dtype)
    if keep is not None:
        s = s.masked_fill(~keep, -math.inf)
    w = torch.softmax(s, dim=-1)
    w = torch.where(torch.isneginf(s).all(-1, keepdim=True), torch.zeros_like(w), w)
    return w @ v


def structure_from_definition(t, s, left, right, offset):
    keep = torch.zeros(t, s, dtype=torch.bool)
    for i in range(t):
        p = i + offset
        for j in range(s):
            keep[i, j] = (left is None or p - left <= j) and (right is None or j <= p + right)
    return keep


def _factor(backend: str) -> float:
    """flash-attention's 2, or 4 for torch's fused kernel ("auto" picks it for non-empty inputs).

    In fp64 (``assert_agree``: ×2 as both answers round) it doubles likewise: 4, or 8 fused.
    """
    return 2.0 if backend == "reference" else FUSED_FACTOR


# -- the registry and the dispatch rule -----------------------------------------------------------

def test_the_documented_backends_are_registered():
    assert {"reference", "fused", "blockwise"} <= set(BACKENDS)


def test_auto_picks_fused_and_reference_only_for_empty_sequences():
    x = torch.randn(1, 2, 3, 4)
    assert choose_backend(x, x) == "fused"
    assert choose_backend(x[..., :0, :], x) == "reference"
    assert choose_backend(x, x[..., :0, :]) == "reference"


def test_a_registered_backend_is_called_with_validated_arguments():
    seen = {}

    @register_backend("test-recorder")
    def recorder(query, key, value, **kwargs):
        seen.update(kwargs)
        return torch.full((*query.shape[:-1], value.shape[-1]), 7.0)

    try:
        q = torch.randn(2, 4, 5, 16)
        out = qkv.scaled_dot_product_attention(q, q, q, window=[3, None], backend="test-recorder")
    finally:
        del BACKENDS["test-recorder"]
    assert torch.equal(out, torch.full((2, 4, 5, 16), 7.0))
    mask = seen.pop("mask")  # the structure arrives as a description, not a (t, s) tensor
    assert isinstance(mask, AttentionMask)
    assert (mask.causal, mask.alignment, mask.window, mask.dense, mask.key_padding, mask.varlen) == (
        False, "top_left", (3, None), None, None, None)
    assert seen == dict(bias=None, dropout_p=0.0, scale=0.25, enable_gqa=False)


def test_registering_a_name_twice_raises_and_keeps_the_first():
    first = BACKENDS["fused"]
    with pytest.raises(ValueError, match="'fused' is already registered"):
        register_backend("fused")(lambda *a, **k: None)
    with pytest.raises(ValueError, match="'auto' is already registered"):
        register_backend("auto")(lambda *a, **k: None)
    assert BACKENDS["fused"] is first


# what each backend can do, declared at registration: every claim exercised, every gap refused
CALLS = {  # capability: the arguments of a call that needs it (q, k, v: (1, 2, 6, 8), v dv = 8)
    "lse": dict(return_lse=True),
    "softcap": dict(softcap=5.0),
    "dense_mask": dict(attn_mask=torch.ones(6, 6, dtype=torch.bool).tril()),
    "bias": dict(bias=torch.randn(6, 6)),
    "dropout": dict(dropout_p=0.5),
    "dv_differs": dict(value=torch.randn(1, 2, 6, 5)),
}


@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize("capability", list(CALLS))
def test_a_backend_does_what_it_declares_and_refuses_the_rest(backend, capability):
    torch.manual_seed(0)
    q = k = torch.randn(1, 2, 6, 8)
    kwargs = dict(CALLS[capability])
    v = kwargs.pop("value", torch.randn(1, 2, 6, 8))
    declared = getattr(BACKENDS[backend].capabilities, capability)
    if not declared:
        with pytest.raises(ValueError, match=f"backend '{backend}'|got backend='{backend}'"):
            qkv.scaled_dot_product_attention(q, k, v, backend=backend, **kwargs)
        return
    got = qkv.scaled_dot_product_attention(q, k, v, backend=backend, **kwargs)
    out = got[0] if isinstance(got, tuple) else got
    assert out.shape == (1, 2, 6, v.shape[-1]) and out.isfinite().all()
    if capability not in ("dropout",):  # the reference path gives the same numbers
        ref = qkv.scaled_dot_product_attention(q.double(), k.double(), v.double(), backend="reference",
                                               **{n: x.double() if torch.is_tensor(x) and x.is_floating_point() else x
                                                  for n, x in kwargs.items()})
        ref = ref[0] if isinstance(ref, tuple) else ref
        assert (out.double() - ref).abs().max() < 1e-5


def test_backends_with_reads_the_declarations():
    assert backends_with(lse=True) == [n for n, b in BACKENDS.items() if b.capabilities.lse]
    assert "blockwise" in backends_with(lse=True, softcap=True)
    assert "blockwise" not in backends_with(bias=True) and "fused" not in backends_with(lse=True)
    assert all(b.capabilities.sinks == b.capabilities.lse for b in BACKENDS.values())
    with pytest.raises(ValueError, match=r"unknown backend 'nope'"):
        backend_for("nope")


def test_registering_an_unknown_capability_is_refused():
    with pytest.raises(ValueError, match=r"register_backend\('x'\): unknown capabilities \['flash'\]"):
        register_backend("x", flash=True)
    assert "x" not in BACKENDS


def test_a_backend_declaring_devices_is_refused_elsewhere():
    @register_backend("test-gpu-only", devices=("cuda",))
    def gpu_only(query, key, value, **kwargs):
        raise AssertionError("not reached")

    try:
        q = torch.randn(1, 1, 3, 4)
        with pytest.raises(ValueError, match=r"backend 'test-gpu-only' cannot do device 'cpu'; "
                                             r"backends that can: \['reference', 'blockwise', 'fused'"):
            qkv.scaled_dot_product_attention(q, q, q, backend="test-gpu-only")
    finally:
        del BACKENDS["test-gpu-only"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_backends_agree_with_each_other(dtype):
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 6, n, 24, generator=gen, dtype=dtype) for n in (19, 31, 31))
    k, v = k[:, :2], v[:, :2]
    kwargs = dict(enable_gqa=True, is_causal=True, window=(7, None), causal_alignment="bottom_right")
    outs = {b: qkv.scaled_dot_product_attention(q, k, v, backend=b, **kwargs) for b in NAMES}
    keep = structure_from_definition(19, 31, 7, 0, 31 - 19)
    if dtype == torch.float32:  # each backend against the fp64 plain answer, the plain fp32 run
        ref = plain_attention(q.double(), k.double(), v.double(), keep, groups=3)
        plain = plain_attention(q, k, v, keep, groups=3)
        for name, out in outs.items():
            assert_within(out, ref, plain, factor=_factor(name), what=name)
    else:  # fp64: with each other, to float64's rounding
        low = plain_attention(q.float(), k.float(), v.float(), keep, groups=3)
        for name in ("fused", "auto"):
            assert_agree(outs[name], outs["reference"], low, factor=2 * _factor(name), what=name)


# -- the property test ------------------------------------------------------------------------------

LENGTHS = st.one_of(st.sampled_from([1, 2, 7, 31, 64, 113]), st.integers(1, 40))
SIDE = st.one_of(st.none(), st.integers(0, 6))
MASK_KINDS = ["none", "bool", "float", "causal_top_left", "causal_bottom_right", "window",
              "window+bool", "window+float", "causal+window"]


@st.composite
def attention_problems(draw):
    batch = tuple(draw(st.lists(st.integers(1, 2), max_size=2)))
    h_kv = draw(st.sampled_from([1, 2]))
    groups = draw(st.sampled_from([1, 1, 2, 3]))
    t, s = draw(LENGTHS), draw(LENGTHS)
    d, dv = draw(st.sampled_from([1, 8, 16, 40])), draw(st.sampled_from([4, 16]))
    kind = draw(st.sampled_from(MASK_KINDS))
    alignment = draw(st.sampled_from(["top_left", "bottom_right"]))
    window = (draw(SIDE), draw(SIDE))
    # a user mask broadcast from (t, s), from (s,) per batch (padding), or full
    mask_shape = draw(st.sampled_from([(t, s), (*batch, 1, 1, s), (*batch, h_kv * groups, t, s)]))
    seed = draw(st.integers(0, 2**16))
    return batch, h_kv, groups, t, s, d, dv, kind, alignment, window, mask_shape, seed


def _build(problem):
    """(q, k, v, kwargs for qkv, keep and bias for the plain implementation, groups) in fp64."""
    batch, h_kv, groups, t, s, d, dv, kind, alignment, window, mask_shape, seed = problem
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(*batch, h_kv * groups, t, d, generator=gen, dtype=torch.float64)
    k = torch.randn(*batch, h_kv, s, d, generator=gen, dtype=torch.float64)
    v = torch.randn(*batch, h_kv, s, dv, generator=gen, dtype=torch.float64)
    kwargs = {"enable_gqa": groups > 1}
    keep, bias = None, None
    if "bool" in kind:
        keep = torch.rand(mask_shape, generator=gen) > 0.25
        kwargs["attn_mask"] = keep
    if "float" in kind:
        bias = torch.randn(mask_shape, generator=gen, dtype=torch.float64)
        bias = bias.masked_fill(torch.rand(mask_shape, generator=gen) < 0.2, -math.inf)
        kwargs["attn_mask"] = bias
    left, right = None, None
    if kind.startswith("causal"):
        kwargs["is_causal"], right = True, 0
    if kind == "causal_bottom_right":
        kwargs["causal_alignment"] = "bottom_right"
    if "window" in kind:
        kwargs["window"], kwargs["causal_alignment"] = window, alignment
        left = window[0]
        right = window[1] if right is None else 0  # causality already closed it (sides are >= 0)
    offset = s - t if kwargs.get("causal_alignment") == "bottom_right" else 0
    if left is not None or right is not None:
        structure = structure_from_definition(t, s, left, right, offset)
        keep = structure if keep is None else keep & structure
    return q, k, v, kwargs, keep, bias, groups


@settings(max_examples=50, deadline=None)
@given(attention_problems())
def test_every_backend_is_close_to_the_fp64_reference(problem):
    q, k, v, kwargs, keep, bias, groups = _build(problem)
    ref = plain_attention(q, k, v, keep, bias, groups=groups)
    q32, k32, v32 = q.float(), k.float(), v.float()
    bias32 = bias.float() if bias is not None else None
    plain = plain_attention(q32, k32, v32, keep, bias32, groups=groups)
    kwargs32 = dict(kwargs, attn_mask=bias32) if bias is not None else kwargs

    for name in NAMES:
        out = qkv.scaled_dot_product_attention(q32, k32, v32, backend=name, **kwargs32)
        assert out.shape == ref.shape and not out.isnan().any()
        assert_within(out, ref, plain, factor=_factor(name), what=name)
        # and in fp64 the backends are the plain implementation, to float64's rounding
        out64 = qkv.scaled_dot_product_attention(q, k, v, backend=name, **kwargs)
        assert_agree(out64, ref, plain, factor=2 * _factor(name), what=f"{name} in fp64")
    if "attn_mask" not in kwargs:  # blockwise takes structure only (flash-attention's factor 2)
        out = qkv.scaled_dot_product_attention(q32, k32, v32, backend="blockwise", **kwargs32)
        assert_within(out, ref, plain, what="blockwise")
        out64 = qkv.scaled_dot_product_attention(q, k, v, backend="blockwise", **kwargs)
        assert_agree(out64, ref, plain, factor=4.0, what="blockwise in fp64")


# -- NaN and devices (issue 9: one behaviour on every backend) -----------------------------------

ALL_BACKENDS = (*BACKENDS, "auto")  # the registry, whatever each can do


@pytest.mark.parametrize("backend", ALL_BACKENDS)
@pytest.mark.parametrize("kwargs", [{}, dict(is_causal=True), dict(window=(3, 0), is_causal=True),
                                    dict(key_padding_mask=torch.tensor([[True] * 6 + [False] * 2])),
                                    dict(is_causal=True, causal_alignment="bottom_right")])
def test_nan_in_a_query_gives_nan_in_that_row_on_every_backend(backend, kwargs):
    """NaN in → NaN out (qkv's policy, documented in scaled_dot_product_attention): torch's CPU
    kernel alone would give zeros for the row and hide the NaN from ``embed``."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8, 4, generator=gen) for _ in range(3))
    bad = q.clone()
    bad[0, 1, 5, 2] = float("nan")
    out = qkv.scaled_dot_product_attention(bad, k, v, backend=backend, **kwargs)
    clean = qkv.scaled_dot_product_attention(q, k, v, backend=backend, **kwargs)
    assert torch.isnan(out[0, 1, 5]).all()
    others = torch.ones(1, 2, 8, dtype=torch.bool)
    others[0, 1, 5] = False
    assert torch.equal(out[others], clean[others])  # the other rows are untouched
    trace = qkv.attention_trace(bad, k, v, **kwargs)
    assert torch.isnan(trace.output[0, 1, 5]).all()
    if backend in backends_with(lse=True):
        _, lse = qkv.scaled_dot_product_attention(bad, k, v, backend=backend, return_lse=True, **kwargs)
        assert torch.isnan(lse[0, 1, 5]) and not torch.isnan(lse[others]).any()


def _nan_run(backend, q, k, v, kwargs):
    """(out, lse or None) of one backend; "blockwise-torch" is the blockwise backend's readable
    pure-torch path (tests/attention/test_blockwise.py's ``impl="torch"``), "blockwise" its spans
    path (what the backend runs on CPU)."""
    if backend == "blockwise-torch":
        from qkv.attention.block_mask import block_mask_for
        from qkv.attention.blockwise import blockwise_forward

        mask = AttentionMask(causal=kwargs.get("is_causal", False), window=kwargs.get("window"))
        bm = block_mask_for(mask, q.shape[0], q.shape[1], q.shape[-2], k.shape[-2])
        return blockwise_forward(q, k, v, bm, scale=q.shape[-1] ** -0.5, enable_gqa=True)
    if backend == "fused":
        return qkv.scaled_dot_product_attention(q, k, v, backend=backend, enable_gqa=True, **kwargs), None
    return qkv.scaled_dot_product_attention(q, k, v, backend=backend, enable_gqa=True,
                                            return_lse=True, **kwargs)


NAN_MASKS = {"none": ({}, lambda i, j: True), "causal": (dict(is_causal=True), lambda i, j: j <= i),
             "window": (dict(is_causal=True, window=(37, 0)), lambda i, j: i - 37 <= j <= i)}


@pytest.mark.parametrize("backend", [*BACKENDS, "blockwise-torch"])
@pytest.mark.parametrize("masking", list(NAN_MASKS))
@pytest.mark.parametrize("where", ["key", "value"])
@pytest.mark.parametrize("t", [12, 133])
def test_nan_in_a_key_or_value_reaches_every_row_that_attends_it(backend, masking, where, t):
    """NaN in → NaN out for keys and values: every row that attends a key holding a NaN gives a
    NaN output row (and lse); a NaN value reaches the rows that attend it. The reference path is
    the truth (it makes the whole head NaN). Rows the mask hides every NaN from give what the
    same backend gives without the NaNs, or NaN (as the reference does).

    Where torch's CPU kernel alone gave 0 (as if the row had no key): a row whose only keys in
    one kernel call hold a NaN, when that call has few keys — key 0 for row 0 under causal
    masks at t = 12 (fused and spans), key 128 for row 128 at t = 133 (spans' last diagonal call
    has 5 keys: row 128 came out finite, merged with its other keys)."""
    kwargs, sees = NAN_MASKS[masking]
    groups = 2  # GQA: query heads 2h, 2h + 1 read key head h
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(1, 4, t, 8, generator=gen)
    k, v = (torch.randn(1, 2, t, 8, generator=gen) for _ in range(2))
    bad = {"key": k, "value": v}[where].clone()
    poisoned = [(0, 0, 0), (1, 128 if t > 128 else t - 3, 5)]  # (key head, position, feature)
    for head, j, c in poisoned:
        bad[0, head, j, c] = float("nan")
    k_in, v_in = (bad, v) if where == "key" else (k, bad)
    out, lse = _nan_run(backend, q, k_in, v_in, kwargs)
    clean, clean_lse = _nan_run(backend, q, k, v, kwargs)
    keep = torch.tensor([[sees(i, j) for j in range(t)] for i in range(t)])  # (t, s)
    hit = torch.zeros(4, t, 8, dtype=torch.bool)  # (h, t, dv): entries the NaNs must reach
    for head, j, c in poisoned:
        for h in range(head * groups, (head + 1) * groups):
            if where == "key":
                hit[h] |= keep[:, j, None]  # the whole row of every query that sees key j
            else:
                hit[h, :, c] |= keep[:, j]  # feature c of every query that attends value j
    assert hit[0, 0].any() or where == "value"  # row 0's only key (causal) is NaN
    o = out[0]
    assert o[hit].isnan().all(), (backend, masking, where, (~o[hit].isnan()).nonzero()[:5])
    free, ref = o[~hit], clean[0][~hit]  # entries no NaN must reach
    assert bool((free.isnan() | (free == ref)).all()), (backend, masking, where)
    if lse is not None:
        lse_hit = hit.any(-1) if where == "key" else torch.zeros(4, t, dtype=torch.bool)
        assert lse[0][lse_hit].isnan().all()
        free = lse[0][~lse_hit]
        assert (free.isnan() | (free == clean_lse[0][~lse_hit])).all()
        if where == "value":
            assert not lse.isnan().any()  # values never reach the log-sum-exp


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_tensors_on_another_device_are_a_value_error_on_every_backend(backend):
    q = torch.randn(1, 2, 4, 8)
    other = torch.empty(1, 2, 4, 8, device="meta")
    for args, kwargs, name in (((q, other, q), {}, "key"), ((q, q, other), {}, "value"),
                               ((other, q, q), {}, "key"),
                               ((q, q, q), dict(attn_mask=torch.ones(4, 4, dtype=torch.bool,
                                                                    device="meta")), "attn_mask"),
                               ((q, q, q), dict(bias=torch.zeros(4, 4, device="meta")), "bias")):
        with pytest.raises(ValueError, match=f"{name} is on device meta but query is on cpu|"
                                             f"{name} is on device cpu but query is on meta"):
            qkv.scaled_dot_product_attention(*args, backend=backend, **kwargs)
    mask = AttentionMask(key_padding=torch.ones(1, 4, dtype=torch.bool, device="meta"))
    with pytest.raises(ValueError, match="mask.key_padding is on device meta"):
        qkv.scaled_dot_product_attention(q, q, q, mask=mask, backend=backend)
    with pytest.raises(ValueError, match="key is on device meta"):
        qkv.attention_trace(q, other, q)
