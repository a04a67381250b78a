"""Every backend against an fp64 reference, with tolerances derived rather than guessed.

The rule is flash-attention's: a backend run in a low precision may be at most twice as far from
the fp64 answer as the plain implementation run in that same precision, plus 2 ulp of the answer
(``tests/tolerance.py``); four times for torch's fused kernel (``tolerance.FUSED_FACTOR``). The fp64 answer comes from :func:`plain_attention`,
written here independently of ``qkv``: ``softmax(q·kᵀ·scale + mask)·v`` with zeros for rows that
have no key. Also here: ``gradcheck`` in fp64, and rows whose keys are all masked.
"""

from __future__ import annotations

import math

import pytest
import torch

import qkv
from qkv.attention import reference_attention
from qkv.attention.backends import backends_with
from tolerance import FUSED_FACTOR, assert_agree, assert_within

# every registered backend that takes any mask, bias and dropout (its declared capabilities)
BACKENDS = (*backends_with(dense_mask=True, bias=True, dropout=True), "auto")


def plain_attention(q, k, v, mask=None, scale=None, gqa=False):
    """softmax(q kᵀ · scale + mask) v in the inputs' dtype; mask: None, bool (True = keep), float.

    Grouped-query heads are mapped by index (query head i reads key head i // groups), and a row
    with no key left gives zeros.
    """
    if gqa:
        groups = q.shape[-3] // k.shape[-3]
        index = torch.arange(q.shape[-3]) // groups
        k, v = k.index_select(-3, index), v.index_select(-3, index)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q @ k.transpose(-2, -1)) * scale  # (..., t, s)
    if mask is not None:
        s = s.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else s + mask.to(s.dtype)
    w = torch.softmax(s, dim=-1)
    w = torch.where(torch.isneginf(s).all(-1, keepdim=True), torch.zeros_like(w), w)
    return w @ v


def causal_keep(t, s, offset=0, left=None, right=0):
    """The (t, s) bool mask from its definition: query i sits at p_i = i + offset and keeps key j
    when p_i - left <= j <= p_i + right (None = unbounded)."""
    keep = torch.zeros(t, s, dtype=torch.bool)
    for i in range(t):
        p = i + offset
        for j in range(s):
            keep[i, j] = (left is None or j >= p - left) and (right is None or j <= p + right)
    return keep


def _case(name, gen):
    """(q, k, v, sdpa kwargs, mask for the plain implementation, gqa) for a named mask kind."""
    b, h, t, s, d = 2, 4, 37, 53, 32
    hkv = 2 if name == "gqa" else h
    q = torch.randn(b, h, t, d, generator=gen)
    k = torch.randn(b, hkv, s, d, generator=gen)
    v = torch.randn(b, hkv, s, d, generator=gen)
    if name == "none" or name == "gqa":
        return q, k, v, {"enable_gqa": name == "gqa"}, None
    if name == "bool":
        keep = torch.rand(b, 1, t, s, generator=gen) > 0.3
        return q, k, v, {"attn_mask": keep}, keep
    if name == "float":
        bias = torch.randn(b, h, t, s, generator=gen)
        return q, k, v, {"attn_mask": bias}, bias
    if name == "causal_top_left":
        return q, k, v, {"is_causal": True}, causal_keep(t, s)
    if name == "causal_bottom_right":
        kw = {"is_causal": True, "causal_alignment": "bottom_right"}
        return q, k, v, kw, causal_keep(t, s, offset=s - t)
    if name == "window":
        return q, k, v, {"window": (5, 3)}, causal_keep(t, s, left=5, right=3)
    if name == "scale":
        return q, k, v, {"scale": 0.3}, None
    raise AssertionError(name)


MASK_KINDS = ("none", "bool", "float", "causal_top_left", "causal_bottom_right", "window", "gqa",
              "scale")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("kind", MASK_KINDS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_error_at_most_twice_the_plain_implementations(backend, kind, dtype):
    gen = torch.Generator().manual_seed(MASK_KINDS.index(kind) + (dtype == torch.bfloat16))
    q, k, v, kwargs, mask = _case(kind, gen)
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)  # the inputs every run shares, rounded once
    gqa, scale = kwargs.get("enable_gqa", False), kwargs.get("scale")
    ref = plain_attention(q.double(), k.double(), v.double(), mask, scale, gqa)
    plain_mask = mask.to(dtype) if mask is not None and mask.is_floating_point() else mask
    plain = plain_attention(q, k, v, plain_mask, scale, gqa)

    out = qkv.scaled_dot_product_attention(q, k, v, backend=backend, **kwargs)

    assert out.dtype == dtype and out.shape == ref.shape
    assert_within(out, ref, plain, factor=2.0 if backend == "reference" else FUSED_FACTOR)


@pytest.mark.parametrize("backend", BACKENDS)
def test_fp64_inputs_match_the_plain_fp64_implementation(backend):
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(3, 2, n, 16, generator=gen, dtype=torch.float64) for n in (9, 13, 13))
    keep = torch.rand(9, 13, generator=gen) > 0.5
    out = qkv.scaled_dot_product_attention(q, k, v, attn_mask=keep, backend=backend)
    low = plain_attention(q.float(), k.float(), v.float(), keep)
    # both answers round (×2), a fused kernel twice as much (``FUSED_FACTOR``): 4 or 8
    assert_agree(out, plain_attention(q, k, v, keep), low,
                 factor=4.0 if backend == "reference" else 2 * FUSED_FACTOR)


def test_reference_attention_keeps_low_precision_arithmetic_in_fp32():
    q = k = v = torch.randn(1, 2, 5, 8).to(torch.bfloat16)
    trace = reference_attention(q, k, v, None, scale=0.5)
    assert trace.output.dtype == torch.bfloat16
    assert trace.weights.dtype == trace.scores.dtype == torch.float32


# -- rows with no key at all ---------------------------------------------------------------------

def _all_masked_inputs(kind):
    """Inputs where query rows 0 and 3 (of 5) have every key masked out."""
    gen = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(2, 3, n, 8, generator=gen, requires_grad=True) for n in (5, 6, 6))
    keep = torch.rand(2, 3, 5, 6, generator=gen) > 0.2
    keep[:, :, [0, 3]] = False
    if kind == "bool":
        return q, k, v, {"attn_mask": keep}
    if kind == "float":
        return q, k, v, {"attn_mask": torch.zeros(keep.shape).masked_fill(~keep, -math.inf)}
    if kind == "causal_bottom_right":  # t > s: the first t - s rows sit before every key
        q = torch.randn(2, 3, 8, 8, generator=gen, requires_grad=True)
        return q, k, v, {"is_causal": True, "causal_alignment": "bottom_right"}
    if kind == "window":  # window (0, 2): rows 6 and 7 of 8 look at keys 6.. of which there are none
        q = torch.randn(2, 3, 8, 8, generator=gen, requires_grad=True)
        return q, k, v, {"window": (0, 2)}
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["bool", "float", "causal_bottom_right", "window"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_rows_with_every_key_masked_give_zeros_and_finite_gradients(backend, kind):
    q, k, v, kwargs = _all_masked_inputs(kind)
    out = qkv.scaled_dot_product_attention(q, k, v, backend=backend, **kwargs)
    empty = {"causal_bottom_right": [0, 1], "window": [6, 7]}.get(kind, [0, 3])

    assert not out.isnan().any()
    assert torch.equal(out[:, :, empty], torch.zeros_like(out[:, :, empty]))
    assert out[:, :, 4].abs().sum() > 0  # the other rows are real attention outputs
    out.square().sum().backward()
    for x in (q, k, v):
        assert x.grad.isfinite().all()
    assert torch.equal(q.grad[:, :, empty], torch.zeros_like(q.grad[:, :, empty]))


# -- gradcheck in fp64 ---------------------------------------------------------------------------

GRAD_CASES = {
    "plain": (3, 3, {}),
    "bool_mask": (3, 3, {"attn_mask": torch.tensor([[1, 0, 1, 1], [0, 1, 1, 0], [1, 1, 1, 1]],
                                                    dtype=torch.bool)}),
    "float_mask": (3, 3, {"attn_mask": torch.linspace(-1, 1, 12, dtype=torch.float64).view(3, 4)}),
    "causal_bottom_right": (3, 3, {"is_causal": True, "causal_alignment": "bottom_right"}),
    "window": (3, 3, {"window": (1, 0)}),
    "gqa_causal": (4, 2, {"enable_gqa": True, "is_causal": True}),
}


@pytest.mark.parametrize("case", sorted(GRAD_CASES))
@pytest.mark.parametrize("backend", backends_with(dense_mask=True, bias=True, dropout=True))
def test_gradcheck_fp64(backend, case):
    h, hkv, kwargs = GRAD_CASES[case]
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(1, h, 3, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(1, hkv, 4, 4, generator=gen, dtype=torch.float64, requires_grad=True)
            for _ in range(2))

    def f(q, k, v):
        return qkv.scaled_dot_product_attention(q, k, v, backend=backend, **kwargs)

    assert torch.autograd.gradcheck(f, (q, k, v))
