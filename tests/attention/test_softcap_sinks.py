"""softcap= (Gemma 2) and sinks= (gpt-oss) on every lse backend, against a float64 truth written
out here: scores·scale → c·tanh(·/c) → mask → softmax over [keys, sink] → drop the sink column."""

from __future__ import annotations

import pytest
import torch

import qkv
from qkv.attention.block_mask import block_mask_for
from qkv.attention.attention_mask import AttentionMask
from qkv.attention.backends import backends_with
from tolerance import assert_within, bound, max_err


def naive(q, k, v, *, scale, softcap=None, sinks=None, window=None, causal=True):
    """The definition, one line a step; GQA by repeating k/v."""
    g = q.shape[-3] // k.shape[-3]
    k, v = k.repeat_interleave(g, -3), v.repeat_interleave(g, -3)
    s = (q @ k.transpose(-1, -2)) * scale
    if softcap is not None:
        s = torch.tanh(s / softcap) * softcap
    t, n = q.shape[-2], k.shape[-2]
    i, j = torch.arange(t)[:, None] + (n - t), torch.arange(n)[None]
    keep = torch.ones(t, n, dtype=torch.bool)
    if causal:
        keep &= j <= i
    if window is not None:
        keep &= j >= i - window
    s = s.masked_fill(~keep, float("-inf"))
    if sinks is not None:
        sink = sinks.to(s.dtype).view(-1, 1, 1).expand(*s.shape[:-1], 1)
        s = torch.cat([s, sink], -1)
    w = torch.softmax(s, -1)[..., :n]
    return w @ v, w


CASES = [  # (h, h_kv, t, s, d, dv, window, softcap, sinks, scale)
    (4, 2, 37, 37, 16, 16, None, 5.0, False, 0.3),
    (4, 4, 37, 37, 16, 8, 9, None, True, 0.25),
    (6, 2, 130, 300, 8, 12, 70, 2.0, True, 1.0),
    (2, 1, 1, 53, 16, 16, None, 1.5, True, None),
]


@pytest.mark.parametrize("backend", backends_with(lse=True, softcap=True))
@pytest.mark.parametrize("case", CASES)
def test_forward_and_weights_match_float64(backend, case):
    h, hkv, t, s, d, dv, window, cap, with_sinks, scale = case
    torch.manual_seed(0)
    q, k, v = torch.randn(2, h, t, d) * 2, torch.randn(2, hkv, s, d) * 2, torch.randn(2, hkv, s, dv)
    sinks = torch.randn(h) if with_sinks else None
    sc = scale if scale is not None else d ** -0.5
    ref, w_ref = naive(q.double(), k.double(), v.double(), scale=sc, softcap=cap,
                       sinks=sinks.double() if sinks is not None else None, window=window)
    plain, w_plain = naive(q, k, v, scale=sc, softcap=cap, sinks=sinks, window=window)
    out, lse = qkv.scaled_dot_product_attention(
        q, k, v, is_causal=True, causal_alignment="bottom_right", enable_gqa=True, scale=scale,
        window=(window, 0) if window is not None else None, softcap=cap, sinks=sinks,
        backend=backend, return_lse=True)
    assert_within(out, ref, plain, what=f"{backend} output")
    mask = AttentionMask(causal=True, alignment="bottom_right",
                         window=(window, 0) if window is not None else None)
    bm = block_mask_for(mask, 2, h, t, s, device="cpu")
    w = qkv.attention_weights(q, k, lse, block_mask=bm, scale=sc, enable_gqa=True, softcap=cap)
    # exp(s − lse) carries the rounding of s and of lse (a few ulp of their magnitudes) as a
    # relative error on each weight, where softmax's own is ~1 ulp of the weight: that is the
    # floor added to the derived bound
    scores = (q.double() @ k.double().repeat_interleave(h // hkv, -3).transpose(-1, -2)) * sc
    extra = 4 * torch.finfo(torch.float32).eps * (float(scores.abs().max()) + float(lse.abs().max()))
    assert max_err(w, w_ref) <= bound(w_ref, w_plain) + extra, f"{backend} weights"
    if with_sinks:  # what the keys did not take went to the sink: Σ_j w_ij = 1 − exp(sink − lse')
        share = 1 - (sinks.view(-1, 1) - lse).exp()
        torch.testing.assert_close(w.sum(-1), share, rtol=0, atol=1e-5)


def test_auto_and_no_extras_unchanged():
    torch.manual_seed(1)
    q = k = v = torch.randn(1, 2, 20, 8)
    out = qkv.scaled_dot_product_attention(q, k, v, is_causal=True, softcap=3.0, sinks=torch.zeros(2))
    ref, _ = naive(q.double(), k.double(), v.double(), scale=8 ** -0.5, softcap=3.0,
                   sinks=torch.zeros(2, dtype=torch.float64))
    plain, _ = naive(q, k, v, scale=8 ** -0.5, softcap=3.0, sinks=torch.zeros(2))
    assert_within(out, ref, plain)
    # a −inf sink is no sink, an enormous cap is no cap: same numbers as without them
    base = qkv.scaled_dot_product_attention(q, k, v, is_causal=True, backend="reference")
    same = qkv.scaled_dot_product_attention(q, k, v, is_causal=True, backend="reference",
                                            sinks=torch.full((2,), float("-inf")))
    assert torch.equal(base, same)


@pytest.mark.parametrize("cap,with_sinks", [(4.0, False), (None, True), (2.0, True)])
def test_blockwise_backward_matches_float64(cap, with_sinks):
    torch.manual_seed(2)
    h, hkv, t, d = 4, 2, 150, 8
    q, k, v = (torch.randn(1, n, t, d, dtype=torch.float64, requires_grad=True) for n in (h, hkv, hkv))
    sinks = torch.randn(h, dtype=torch.float64, requires_grad=True) if with_sinks else None
    grad = torch.randn(1, h, t, d, dtype=torch.float64)
    out = qkv.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True, window=(40, 0),
                                           softcap=cap, sinks=sinks, backend="blockwise")
    got = torch.autograd.grad(out, [q, k, v] + ([sinks] if with_sinks else []), grad)
    ref_out, _ = naive(q, k, v, scale=d ** -0.5, softcap=cap, sinks=sinks, window=40)
    want = torch.autograd.grad(ref_out, [q, k, v] + ([sinks] if with_sinks else []), grad)
    for name, a, b in zip("q k v sinks".split(), got, want):
        # both float64, different summation orders: a few hundred roundings of O(1) terms
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10, msg=f"d{name}")


@pytest.mark.parametrize("kw,msg", [
    (dict(softcap=0.0), "softcap must be a finite number > 0"),
    (dict(softcap=float("inf")), "softcap must be a finite number > 0"),
    (dict(sinks=torch.zeros(3)), r"sinks must be a floating-point tensor of shape \(h,\) = \(2,\)"),
    (dict(sinks=torch.zeros(2, dtype=torch.long)), "sinks must be a floating-point"),
    (dict(softcap=1.0, backend="fused"), "softcap= and sinks= need a backend"),
])
def test_bad_softcap_and_sinks(kw, msg):
    q = torch.randn(1, 2, 4, 8)
    with pytest.raises(ValueError, match=msg):
        qkv.scaled_dot_product_attention(q, q, q, **kw)


@pytest.mark.parametrize("kw,msg", [
    (dict(softcap=-1.0), "softcap must be a finite number > 0"),
    (dict(bias=torch.zeros(3, 3)), r"bias must be a floating-point tensor broadcastable to \(..., h, t, s\)"),
    (dict(bias=torch.zeros(4, 4, dtype=torch.long)), "bias must be a floating-point"),
])
def test_bad_attention_weights_extras(kw, msg):
    q = torch.randn(1, 2, 4, 8)
    with pytest.raises(ValueError, match=msg):
        qkv.attention_weights(q, q, torch.zeros(1, 2, 4), **kw)


def test_attention_weights_bias_is_added():
    """A score bias (T5's position bias) enters the weights as it entered the forward."""
    torch.manual_seed(3)
    q, k, v = (torch.randn(1, 2, 6, 8, dtype=torch.float64) for _ in range(3))
    bias = torch.randn(1, 2, 6, 6, dtype=torch.float64)
    _, lse = qkv.scaled_dot_product_attention(q, k, v, bias=bias, return_lse=True)
    w = qkv.attention_weights(q, k, lse, bias=bias)
    want = torch.softmax(q @ k.transpose(-1, -2) / 8 ** 0.5 + bias, -1)
    torch.testing.assert_close(w, want, rtol=1e-12, atol=1e-14)  # float64, a few roundings


def test_blockwise_backward_dv_scale_softcap_sinks_match_float64():
    """The backward with everything at once: value head dim ≠ query/key head dim, a scale other
    than 1/√d (Gemma's query_pre_attn_scalar), soft-capping, sinks, GQA, a window, t ≠ s."""
    torch.manual_seed(4)
    h, hkv, t, s, d, dv, scale = 4, 2, 97, 131, 8, 12, 0.37
    q = torch.randn(1, h, t, d, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, hkv, s, d, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, hkv, s, dv, dtype=torch.float64, requires_grad=True)
    sinks = torch.randn(h, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(1, h, t, dv, dtype=torch.float64)
    out = qkv.scaled_dot_product_attention(q, k, v, is_causal=True, causal_alignment="bottom_right",
                                           enable_gqa=True, window=(30, 0), scale=scale, softcap=2.5,
                                           sinks=sinks, backend="blockwise")
    got = torch.autograd.grad(out, [q, k, v, sinks], grad)
    ref_out, _ = naive(q, k, v, scale=scale, softcap=2.5, sinks=sinks, window=30)
    want = torch.autograd.grad(ref_out, [q, k, v, sinks], grad)
    for name, a, b in zip("q k v sinks".split(), got, want):
        # both float64, different summation orders: a few hundred roundings of O(1) terms
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10, msg=f"d{name}")
