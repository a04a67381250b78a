"""The public functions: a drop-in for torch's SDPA, the trace, and argument checking.

Peers: ``torch.nn.functional.scaled_dot_product_attention`` for the same arguments, and the
intermediates re-derived here from their definitions for :func:`qkv.attention_trace`.

Tolerances: where qkv calls torch's kernel with the same arguments, or repeats the very
operation it is compared with, results are equal (``torch.equal``); otherwise
:func:`tolerance.assert_within` against torch's SDPA run in fp64.
"""

from __future__ import annotations

import doctest
import math

import pytest
import torch
import torch.nn.functional as F

import qkv
import qkv.attention.backends
import qkv.attention.functional
import qkv.attention.attention_mask
import qkv.attention.trace
from tolerance import FUSED_FACTOR, assert_within, bound, max_err, softmax_sum_tolerance

# every registered backend that takes any mask, bias and dropout (its declared capabilities)
BACKENDS = (*qkv.attention.backends.backends_with(dense_mask=True, bias=True, dropout=True), "auto")


def _double(kwargs):
    return {n: x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x
            for n, x in kwargs.items()}


def _qkv(batch, h, t, s, d, *, hkv=None, dv=None, seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    hkv = h if hkv is None else hkv
    q = torch.randn(*batch, h, t, d, generator=gen, dtype=dtype)
    k = torch.randn(*batch, hkv, s, d, generator=gen, dtype=dtype)
    v = torch.randn(*batch, hkv, s, dv or d, generator=gen, dtype=dtype)
    return q, k, v


# -- the same results as torch's SDPA ------------------------------------------------------------

def _sdpa_args(kind, t, s, batch, h, gen):
    """Keyword arguments accepted by both functions, meaning the same thing in both."""
    if kind == "none":
        return {}
    if kind == "bool":
        return {"attn_mask": torch.rand(t, s, generator=gen) > 0.4}
    if kind == "float":
        return {"attn_mask": torch.randn(*batch, h, t, s, generator=gen)}
    if kind == "causal":
        return {"is_causal": True}
    if kind == "scale":
        return {"scale": 0.05}
    if kind == "gqa":
        return {"enable_gqa": True, "is_causal": True}
    raise AssertionError(kind)


# a rank-2 tensor has no head dimension to group, so no "gqa" there
SDPA_CASES = [(kind, rank) for kind in ("none", "bool", "float", "causal", "scale", "gqa")
              for rank in (2, 3, 4, 5) if (kind, rank) != ("gqa", 2)]


@pytest.mark.parametrize("kind, rank", SDPA_CASES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_same_as_torch_sdpa(backend, kind, rank):
    batch = (2, 3, 1)[: max(rank - 3, 0)]
    h, hkv = (4, 2) if kind == "gqa" else (3, 3)
    t, s = 7, 11
    q, k, v = _qkv(batch, h, t, s, 16, hkv=hkv, dv=5, seed=rank)
    if rank == 2:
        q, k, v = q[0], k[0], v[0]
    kwargs = _sdpa_args(kind, t, s, batch, h, torch.Generator().manual_seed(1))
    if kind == "float" and rank == 2:
        kwargs["attn_mask"] = kwargs["attn_mask"].reshape(-1, t, s)[0]

    expected = F.scaled_dot_product_attention(q, k, v, dropout_p=0.0, **kwargs)
    out = qkv.scaled_dot_product_attention(q, k, v, dropout_p=0.0, backend=backend, **kwargs)

    assert out.shape == expected.shape == (*q.shape[:-1], 5)
    if backend == "reference":  # the truth: torch's SDPA in fp64; the plain path: in fp32
        truth = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), dropout_p=0.0,
                                               **_double(kwargs))
        assert_within(out, truth, expected)
    else:  # the same kernel, called with the same arguments
        assert torch.equal(out, expected)


@pytest.mark.parametrize("backend", BACKENDS)
def test_same_as_torch_sdpa_in_bf16(backend):
    q, k, v = _qkv((2,), 4, 33, 33, 32, seed=5, dtype=torch.bfloat16)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    out = qkv.scaled_dot_product_attention(q, k, v, is_causal=True, backend=backend)
    if backend == "reference":  # its own fp32 arithmetic, rounded to bf16 once at the end
        truth = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
        assert_within(out, truth, expected)
    else:  # the same kernel, called with the same arguments
        assert torch.equal(out, expected)


def test_positional_arguments_follow_torchs_order():
    q, k, v = _qkv((1,), 2, 5, 6, 8)
    mask = torch.rand(5, 6) > 0.3
    args = (q, k, v, mask, 0.0, False)  # torch takes scale and enable_gqa by keyword only
    # exact: "auto" calls torch's kernel with these very arguments
    assert torch.equal(qkv.scaled_dot_product_attention(*args, scale=0.2),
                       F.scaled_dot_product_attention(*args, scale=0.2))


@pytest.mark.parametrize("backend", BACKENDS)
def test_enable_gqa_on_rank_2_inputs_is_plain_attention(backend):
    q, k, v = (x[0, 0] for x in _qkv((1,), 1, 5, 6, 8, seed=4))
    out = qkv.scaled_dot_product_attention(q, k, v, enable_gqa=True, backend=backend)
    plain = F.scaled_dot_product_attention(q, k, v)
    if backend == "reference":
        assert_within(out, F.scaled_dot_product_attention(q.double(), k.double(), v.double()), plain)
    else:  # exact: the same kernel, with nothing to group
        assert torch.equal(out, plain)


# -- the trace -----------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["bool", "float", "window_gqa"])
def test_trace_fields_follow_their_definitions(kind):
    q, k, v = _qkv((2,), 4, 6, 9, 8, hkv=2 if kind == "window_gqa" else 4, seed=2)
    gen = torch.Generator().manual_seed(4)
    if kind == "bool":
        keep = torch.rand(2, 4, 6, 9, generator=gen) > 0.4
        keep[0, 1, 3] = False  # a row with no key
        kwargs = {"attn_mask": keep}
    elif kind == "float":
        bias = torch.randn(6, 9, generator=gen)
        bias[2, ::2] = -math.inf
        keep = ~torch.isneginf(bias).expand(2, 4, 6, 9)
        kwargs = {"attn_mask": bias}
    else:
        # window (1, 1) around p_i = i + (s - t) = i + 3, from the definition
        i, j = torch.arange(6)[:, None], torch.arange(9)[None, :]
        keep = ((j - (i + 3)).abs() <= 1).expand(2, 4, 6, 9)
        kwargs = {"window": (1, 1), "causal_alignment": "bottom_right", "enable_gqa": True}

    tr = qkv.attention_trace(q, k, v, scale=0.7, **kwargs)

    head_of = torch.arange(4) // 2 if kind == "window_gqa" else torch.arange(4)  # query head → kv head
    k_full, v_full = k[:, head_of], v[:, head_of]
    # Each field is the one operation of its definition on the previous field, so each is
    # compared exactly: the same operation on the same tensors gives the same bits.
    assert torch.equal(tr.key, k_full) and torch.equal(tr.value, v_full)
    assert torch.equal(tr.scores, q @ k_full.transpose(-2, -1))
    assert tr.scale == 0.7
    assert torch.equal(tr.scaled, tr.scores * 0.7)
    assert torch.isneginf(tr.masked[~keep]).all()
    expected_masked = tr.scaled + kwargs["attn_mask"] if kind == "float" else tr.scaled
    assert torch.equal(tr.masked[keep], expected_masked[keep])
    assert torch.equal(tr.scaled + tr.additive(), tr.masked)
    assert tr.bias is None
    empty = ~keep.any(-1)  # (b, h, t)
    assert (tr.weights.sum(-1)[empty] == 0).all()
    assert ((tr.weights.sum(-1)[~empty] - 1).abs() <= softmax_sum_tolerance(9, torch.float32)).all()
    assert (tr.weights[~keep] == 0).all()
    assert torch.equal(tr.lse, torch.logsumexp(tr.masked, dim=-1))
    assert torch.equal(tr.output, tr.weights @ v_full)
    truth = qkv.attention_trace(q.double(), k.double(), v.double(), scale=0.7, **_double(kwargs))
    for backend in BACKENDS:
        out = qkv.scaled_dot_product_attention(q, k, v, scale=0.7, backend=backend, **kwargs)
        if backend == "reference":  # exact: the trace is the reference backend's computation
            assert torch.equal(out, tr.output)
        else:  # the plain path: the reference one, in fp32
            assert_within(out, truth.output, tr.output, factor=FUSED_FACTOR, what=backend)


def test_trace_output_is_exactly_the_reference_backends():
    q, k, v = _qkv((3,), 2, 5, 5, 8, seed=9)
    tr = qkv.attention_trace(q, k, v, is_causal=True)
    out = qkv.scaled_dot_product_attention(q, k, v, is_causal=True, backend="reference")
    assert torch.equal(tr.output, out)


def test_select_rows_keeps_rows_and_whole_keys():
    q, k, v = _qkv((2,), 3, 7, 10, 4, seed=3)
    tr = qkv.attention_trace(q, k, v, is_causal=True, causal_alignment="bottom_right")
    for rows, index in ((torch.tensor([6, 0, 2]), [6, 0, 2]), (slice(1, 4), [1, 2, 3]), (5, [5])):
        sub = tr.select_rows(rows)
        for name in ("query", "scores", "scaled", "masked", "weights", "output"):
            assert torch.equal(getattr(sub, name), getattr(tr, name)[..., index, :]), name
        assert torch.equal(sub.lse, tr.lse[..., index])
        assert sub.key is tr.key and sub.value is tr.value and sub.scale == tr.scale
    assert tr.select_rows(slice(None)).weights.shape == (2, 3, 7, 10)


def test_trace_detach_drops_autograd_but_keeps_values():
    q, k, v = (x.requires_grad_() for x in _qkv((1,), 2, 3, 3, 4))
    tr = qkv.attention_trace(q, k, v)
    assert tr.output.requires_grad
    det = tr.detach()
    assert not det.output.requires_grad and torch.equal(det.weights, tr.weights)


def test_trace_refuses_other_backends():
    q, k, v = _qkv((1,), 1, 2, 2, 4)
    with pytest.raises(ValueError, match="backend='fused'"):
        qkv.attention_trace(q, k, v, backend="fused")


# -- argument checking ---------------------------------------------------------------------------

def _bad_calls():
    q, k, v = _qkv((2,), 4, 5, 6, 8)
    ok = dict(query=q, key=k, value=v)
    yield "rank<2", dict(ok, query=torch.randn(8)), r"query must have shape \(\.\.\., length, dim\), got \(8,\)"
    yield "ranks differ", dict(ok, key=k[0]), r"same rank.*query \(2, 4, 5, 8\), key \(4, 6, 8\)"
    yield "not a tensor", dict(ok, value=[1.0]), "value must be a torch.Tensor, got list"
    yield "int dtype", dict(ok, key=k.long()), "key must be a floating-point tensor, got dtype torch.int64"
    yield "dtypes differ", dict(ok, value=v.double()), "share a dtype.*torch.float64"
    yield "batch", dict(ok, key=torch.randn(3, 4, 6, 8), value=torch.randn(3, 4, 6, 8)), \
        r"same batch dims.*query \(2, 4, 5, 8\) and key \(3, 4, 6, 8\)"
    yield "heads", dict(ok, key=torch.randn(2, 2, 6, 8), value=torch.randn(2, 2, 6, 8)), \
        r"query has 4 heads but key/value have 2.*enable_gqa"
    yield "gqa not dividing", dict(ok, key=torch.randn(2, 3, 6, 8), value=torch.randn(2, 3, 6, 8),
                                   enable_gqa=True), r"query heads \(4\).*key/value heads \(3\)"
    yield "k/v length", dict(ok, value=torch.randn(2, 4, 7, 8)), \
        r"key and value must agree.*key \(2, 4, 6, 8\) and value \(2, 4, 7, 8\)"
    yield "q/k dim", dict(ok, key=torch.randn(2, 4, 6, 3), value=torch.randn(2, 4, 6, 3)), \
        r"same last dim d.*query \(2, 4, 5, 8\) and key \(2, 4, 6, 3\)"
    yield "mask shape", dict(ok, attn_mask=torch.ones(5, 7, dtype=torch.bool)), \
        r"attn_mask of shape \(5, 7\) does not broadcast.*\(2, 4, 5, 6\)"
    yield "mask batch", dict(ok, attn_mask=torch.ones(3, 1, 5, 6)), r"attn_mask of shape \(3, 1, 5, 6\)"
    yield "mask dtype", dict(ok, attn_mask=torch.ones(5, 6, dtype=torch.int64)), \
        "attn_mask must be bool or floating point, got dtype torch.int64"
    yield "mask and causal", dict(ok, attn_mask=torch.ones(5, 6, dtype=torch.bool), is_causal=True), \
        "either attn_mask or is_causal"
    yield "backend", dict(ok, backend="flash3"), r"unknown backend 'flash3'.*reference.*fused"
    yield "window left", dict(ok, window=(-1, 0)), "window left size must be an int >= 0 or None, got -1"
    yield "window right", dict(ok, window=(None, -2)), "window right size.*got -2"
    yield "window float", dict(ok, window=(1.5, 0)), "window left size.*got 1.5"
    yield "window arity", dict(ok, window=(1,)), r"window must be a pair \(left, right\), got \(1,\)"
    yield "alignment", dict(ok, causal_alignment="center"), \
        r"causal_alignment must be one of \('top_left', 'bottom_right'\), got 'center'"
    yield "dropout high", dict(ok, dropout_p=1.0), r"dropout_p must be in \[0, 1\), got 1.0"
    yield "dropout low", dict(ok, dropout_p=-0.1), r"dropout_p must be in \[0, 1\), got -0.1"
    yield "scale", dict(ok, scale=math.inf), "scale must be a finite number, got inf"


BAD_CALLS = list(_bad_calls())


@pytest.mark.parametrize("kwargs, message", [c[1:] for c in BAD_CALLS], ids=[c[0] for c in BAD_CALLS])
@pytest.mark.parametrize("fn", [qkv.scaled_dot_product_attention, qkv.attention_trace],
                         ids=["sdpa", "trace"])
def test_bad_arguments_raise_value_errors_naming_them(fn, kwargs, message):
    if fn is qkv.attention_trace and kwargs.get("backend") == "flash3":
        message = "backend='flash3'"
    with pytest.raises(ValueError, match=message):
        fn(**kwargs)


# -- training-mode dropout: only that gradients flow -----------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_dropout_in_training_lets_finite_gradients_flow(backend):
    q, k, v = (x.requires_grad_() for x in _qkv((2,), 2, 9, 9, 8, seed=11))
    torch.manual_seed(0)
    out = qkv.scaled_dot_product_attention(q, k, v, dropout_p=0.3, is_causal=True, backend=backend)
    # dropout acted: out is further from the dropout-free answer than any rounding could take it
    with torch.no_grad():
        truth = qkv.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
        plain = qkv.scaled_dot_product_attention(q, k, v, is_causal=True, backend="reference")
    assert max_err(out, truth) > bound(truth, plain, factor=FUSED_FACTOR)
    out.square().sum().backward()
    for x in (q, k, v):
        assert x.grad.isfinite().all() and x.grad.abs().sum() > 0


# -- empty sequences and the docstrings ------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_key_sequence_gives_zeros(backend):
    q, k, v = _qkv((1,), 2, 3, 0, 4)
    out = qkv.scaled_dot_product_attention(q, k, v, backend=backend)
    assert torch.equal(out, torch.zeros(1, 2, 3, 4))


@pytest.mark.parametrize("module", [qkv.attention.functional, qkv.attention.attention_mask,
                                    qkv.attention.trace, qkv.attention.backends])
def test_docstring_examples_run(module):
    result = doctest.testmod(module, extraglobs={"torch": torch}, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0


def test_scale_zero_is_the_mean_of_the_visible_values_on_every_backend():
    # (issue 40's fuzzer) torch's kernels scaled the masked −inf too: −inf · 0 = NaN in every row
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 96, 8, generator=g, dtype=torch.float64) for _ in range(3))
    want = v.cumsum(-2) / torch.arange(1, 97, dtype=torch.float64)[:, None]  # (1, 2, 96, 8)
    bm = qkv.create_block_mask(qkv.masks.causal(), None, None, 96, 96)
    calls = {f"is_causal, {b}": dict(is_causal=True, backend=b) for b in ("auto", "fused", "reference")}
    calls |= {f"block_mask, {b}": dict(block_mask=bm, backend=b) for b in ("auto", "blockwise")}
    tol = 96 * torch.finfo(torch.float32).eps * float(v.abs().max())  # float32 sums of ≤ 96 terms
    for name, kw in calls.items():
        out = qkv.scaled_dot_product_attention(q.float(), k.float(), v.float(), scale=0.0, **kw)
        assert (out.double() - want).abs().max() <= tol, name
