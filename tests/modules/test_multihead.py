"""MultiHeadAttention against its peer ``torch.nn.MultiheadAttention`` (same weights), against a
hand-written fp64 composition (GQA, MQA), its trace, its masks, and its argument checks.

Mask meanings differ between the two: qkv's bool True = takes part, torch's True = masked out,
so every bool mask handed to torch here is inverted.

Tolerances (``tests/tolerance.py``): fp64 comparisons use :func:`assert_agree` — the two fp64
answers may differ by 4× the peer's float32 error rescaled to float64's unit roundoff; fp32
ones use :func:`assert_within` against the peer run in fp64.
"""

from __future__ import annotations

import doctest
import math

import pytest
import torch
from torch import nn

import qkv.modules.multihead
from qkv.attention import AttentionMask
from qkv.modules import ALiBi, AttentionOutput, MultiHeadAttention, RotaryEmbedding
from tolerance import FUSED_FACTOR, agree_bound, assert_agree, assert_within, max_err, twin

E, H = 12, 3


def _torch_mha(*, batch_first, cross=False, bias=True, seed=0):
    torch.manual_seed(seed)
    kw = dict(kdim=7, vdim=5) if cross else {}
    m = nn.MultiheadAttention(E, H, batch_first=batch_first, bias=bias, **kw).double().eval()
    with torch.no_grad():  # torch zero-initialises the biases; random ones test that they are copied
        for p in m.parameters():  # float64 values, not float32 ones widened: copies must keep them
            p.add_(0.1 * torch.randn_like(p))
    return m


def _inputs(cross, b=2, t=5, s=7, seed=1):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(b, t, E, generator=gen, dtype=torch.float64)
    if not cross:
        return x, x, x
    return (x, torch.randn(b, s, 7, generator=gen, dtype=torch.float64),
            torch.randn(b, s, 5, generator=gen, dtype=torch.float64))


def _run_torch(m, q, k, v, **kwargs):
    """Call torch's module with batch-first tensors, whatever its layout."""
    if m.batch_first:
        return m(q, k, v, **kwargs)
    out, w = m(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), **kwargs)
    return out.transpose(0, 1), w


MASKS = ["none", "attn_bool", "attn_float", "padding", "attn_and_padding", "attn_3d"]


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("cross", [False, True], ids=["self", "cross"])
@pytest.mark.parametrize("batch_first", [True, False], ids=["batch_first", "seq_first"])
def test_from_torch_gives_the_same_outputs_and_weights(batch_first, cross, mask):
    m = _torch_mha(batch_first=batch_first, cross=cross)
    mha = MultiHeadAttention.from_torch(m).eval()
    q, k, v = _inputs(cross)
    b, t, s = q.shape[0], q.shape[1], k.shape[1]
    gen = torch.Generator().manual_seed(2)
    keep = torch.rand(t, s, generator=gen) > 0.3
    keep[:, 0] = True  # every row keeps a key: torch gives NaN for rows with none
    lengths = torch.tensor([s, s - 2])
    pad_keep = torch.arange(s) < lengths[:, None]  # (b, s) True for real tokens
    ours, theirs = {}, {}
    if mask in ("attn_bool", "attn_and_padding"):
        ours["attn_mask"], theirs["attn_mask"] = keep, ~keep
    if mask == "attn_float":
        bias = torch.randn(t, s, generator=gen, dtype=torch.float64)
        ours["attn_mask"] = theirs["attn_mask"] = bias
    if mask == "attn_3d":
        per_head = torch.rand(b * H, t, s, generator=gen) > 0.3
        per_head[..., 0] = True
        ours["attn_mask"], theirs["attn_mask"] = per_head, ~per_head
    if mask in ("padding", "attn_and_padding"):
        ours["key_padding_mask"], theirs["key_padding_mask"] = pad_keep, ~pad_keep

    low = twin(m, torch.float32)  # the peer in float32: how much rounding this costs
    low_kw = {n: x.float() if x.is_floating_point() else x for n, x in theirs.items()}
    for average in (True, False):
        want, want_w = _run_torch(m, q, k, v, need_weights=True, average_attn_weights=average,
                                  **theirs)
        low_out, low_w = _run_torch(low, q.float(), k.float(), v.float(), need_weights=True,
                                    average_attn_weights=average, **low_kw)
        res = mha(q, k, v, need_weights=True, average_attn_weights=average, **ours)
        assert isinstance(res, AttentionOutput) and res.trace is None
        assert_agree(res.output, want, low_out, what="output")
        assert_agree(res.weights, want_w, low_w, what="weights")
    # without weights the fused path runs; it must give the same output
    want, _ = _run_torch(m, q, k, v, need_weights=False, **theirs)
    low_out, _ = _run_torch(low, q.float(), k.float(), v.float(), need_weights=False, **low_kw)
    res = mha(q, k, v, **ours)
    assert res.weights is None and res.trace is None
    assert_agree(res.output, want, low_out, what="fused output")


def test_from_torch_without_bias_and_in_fp32():
    torch.manual_seed(3)
    m = nn.MultiheadAttention(E, H, batch_first=True, bias=False).eval()
    mha = MultiHeadAttention.from_torch(m)
    assert mha.q_proj.bias is None and mha.q_proj.weight.dtype == torch.float32
    x = torch.randn(3, 6, E)
    mask = torch.ones(6, 6, dtype=torch.bool).triu(1)  # torch: True above the diagonal = hidden
    plain, _ = m(x, x, x, attn_mask=mask, need_weights=False)
    x64 = x.double()
    ref, _ = twin(m, torch.float64)(x64, x64, x64, attn_mask=mask, need_weights=False)
    assert_within(mha(x, is_causal=True).output, ref, plain)


def test_from_torch_keeps_float64_weights():
    m = nn.MultiheadAttention(E, H, batch_first=True).double()
    with torch.no_grad():
        m.in_proj_weight.copy_(torch.randn(3 * E, E, dtype=torch.float64))  # not float32 values
    mha = MultiHeadAttention.from_torch(m)
    assert mha.q_proj.weight.dtype == torch.float64
    assert torch.equal(mha.q_proj.weight, m.in_proj_weight[:E])  # a copy: exact


def test_from_torch_refuses_what_it_cannot_copy():
    with pytest.raises(ValueError, match="add_bias_kv"):
        MultiHeadAttention.from_torch(nn.MultiheadAttention(E, H, add_bias_kv=True))


# -- a hand-written fp64 composition (MHA, GQA, MQA) ----------------------------------------------

def _by_hand(mha, x, keep):
    """Project, split, map query head i to key head i // groups, attend, merge, project."""
    b, t, _ = x.shape
    h, hkv, d = mha.num_heads, mha.num_kv_heads, mha.head_dim
    q = mha.q_proj(x).view(b, t, h, d).transpose(1, 2)  # (b, h, t, d)
    k = mha.k_proj(x).view(b, t, hkv, d).transpose(1, 2)  # (b, hkv, t, d)
    v = mha.v_proj(x).view(b, t, hkv, d).transpose(1, 2)
    index = torch.arange(h) // (h // hkv)
    k, v = k[:, index], v[:, index]  # (b, h, t, d)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(d)
    weights = torch.softmax(scores.masked_fill(~keep, -math.inf), dim=-1)
    heads = weights @ v  # (b, h, t, d)
    return mha.out_proj(heads.transpose(1, 2).reshape(b, t, h * d)), weights


@pytest.mark.parametrize("num_kv_heads", [4, 2, 1], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("backend", ["reference", "fused", "auto"])
def test_grouped_heads_equal_a_hand_written_composition(num_kv_heads, backend):
    torch.manual_seed(4)
    mha = MultiHeadAttention(16, 4, num_kv_heads=num_kv_heads, backend=backend).double()
    assert mha.k_proj.out_features == num_kv_heads * 4
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    causal = torch.ones(9, 9, dtype=torch.bool).tril()
    want, want_w = _by_hand(mha, x, causal)
    low, low_w = _by_hand(twin(mha, torch.float32), x.float(), causal)
    # the plain softmax measures the rounding: torch's fused kernel may round twice as much
    factor = 4.0 if backend == "reference" else 2 * FUSED_FACTOR
    assert_agree(mha(x, is_causal=True).output, want, low, factor=factor)
    res = mha(x, is_causal=True, need_weights=True, average_attn_weights=False)  # reference path
    assert_agree(res.output, want, low)
    assert_agree(res.weights, want_w, low_w, what="weights")


def test_self_attention_without_positions_is_permutation_equivariant():
    torch.manual_seed(5)
    mha = MultiHeadAttention(16, 4, num_kv_heads=2).double()
    x = torch.randn(2, 11, 16, dtype=torch.float64)
    perm = torch.randperm(11)
    want = mha(x).output[:, perm]
    low = twin(mha, torch.float32)(x.float()).output[:, perm]
    assert_agree(mha(x[:, perm]).output, want, low)
    # rotary positions break it, as they should: by far more than rounding
    mha.rotary = RotaryEmbedding(4)
    want = mha(x).output[:, perm]
    low = twin(mha, torch.float32)(x.float()).output[:, perm]
    assert max_err(mha(x[:, perm]).output, want) > 1e6 * agree_bound(want, low, dtype=torch.float64)


def test_alibi_bias_reaches_the_scores_apart_from_the_mask():
    torch.manual_seed(6)
    mha = MultiHeadAttention(16, 4, alibi=ALiBi(4)).double()
    x = torch.randn(1, 6, 16, dtype=torch.float64)
    att = mha(x, is_causal=True, trace_rows=slice(None)).trace.attention
    i, j = torch.arange(6)[:, None], torch.arange(6)[None, :]
    # Press et al. (2022), §3: n heads get the geometric sequence starting at 2^(-8/n) with that
    # ratio; for 4 heads 2^-2, 2^-4, 2^-6, 2^-8 — written here from the paper, not from the code.
    # Exact: powers of two times integer distances.
    slopes = torch.tensor([2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8], dtype=torch.float64)
    bias = -slopes.view(4, 1, 1) * (i - j).abs()  # (h, t, s)
    assert torch.equal(att.bias, bias)
    keep = j <= i  # (t, s)
    # the mask broadcasts over (b, h): a trace of chosen rows draws it as (1, 1, t, s)
    assert torch.equal(att.mask.reshape(6, 6), torch.zeros(6, 6, dtype=torch.float64).masked_fill(~keep, -math.inf))
    # exact: masked = (scaled + bias) + mask with mask 0 or −inf, the same additions
    assert torch.equal(att.masked[..., keep], (att.scaled + bias)[..., keep])
    assert torch.isneginf(att.masked[..., ~keep]).all()
    assert torch.equal(att.scaled + att.additive(), att.masked)


@pytest.mark.parametrize("backend", ["reference", "fused"])
def test_alibi_equals_its_bias_given_as_a_float_mask(backend):
    """Keeping ALiBi apart from the mask changed no number: the module with ``alibi`` equals the
    module without it, given ALiBi's bias folded into a float ``attn_mask``."""
    torch.manual_seed(10)
    with_alibi = MultiHeadAttention(16, 4, alibi=ALiBi(4), backend=backend).double()
    plain = MultiHeadAttention(16, 4, backend=backend).double()
    plain.load_state_dict(with_alibi.state_dict())
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    causal = torch.ones(7, 7, dtype=torch.bool).tril()
    folded = ALiBi(4).bias(7, 7).double().masked_fill(~causal, -math.inf)[None]  # (1, h, t, s)
    want = plain(x, attn_mask=folded).output
    low = twin(plain, torch.float32)(x.float(), attn_mask=folded.float()).output
    assert_agree(with_alibi(x, is_causal=True).output, want, low)
    # and with the weights (the traced reference path): the same weights, exactly — the bias
    # and the −inf are added in the same order (scaled + bias, then + mask)
    got = with_alibi(x, is_causal=True, need_weights=True, average_attn_weights=False)
    want = plain(x, attn_mask=folded, need_weights=True, average_attn_weights=False)
    assert_agree(got.output, want.output, low)
    assert torch.equal(got.weights, want.weights)


# -- the trace --------------------------------------------------------------------------------------

def test_trace_rows_record_what_the_forward_computed():
    torch.manual_seed(7)
    mha = MultiHeadAttention(12, 3, kdim=7, vdim=5).double().eval()
    q, k, v = _inputs(True)
    pad = torch.tensor([[True] * 7, [True] * 4 + [False] * 3])
    rows = torch.tensor([4, 1])
    weighed = mha(q, k, v, key_padding_mask=pad, need_weights=True, average_attn_weights=False)
    res = mha(q, k, v, key_padding_mask=pad, trace_rows=rows)

    # the traced rows run the reference path (the trace's own numbers); the other rows run the fast
    # path, so the output agrees with the all-reference forward to rounding, not bit for bit
    low = twin(mha, torch.float32)
    q32, k32, v32 = q.float(), k.float(), v.float()
    low_out = low(q32, k32, v32, key_padding_mask=pad).output
    assert_agree(res.output, weighed.output, low_out, what="output")
    assert res.weights is None
    trace = res.trace
    assert torch.equal(trace.rows, rows)
    assert torch.equal(trace.query_input, q[:, rows])
    assert torch.equal(trace.key_input, k) and torch.equal(trace.value_input, v)
    att = trace.attention
    assert att.weights.shape == (2, 3, 2, 7) and not att.weights.requires_grad
    # a trace of 2 rows multiplies a (2, d) block, the full trace a (7, d) one: equal to rounding
    low_w = low(q32, k32, v32, key_padding_mask=pad, need_weights=True, average_attn_weights=False).weights
    assert_agree(att.weights, weighed.weights[:, :, rows], low_w[:, :, rows], what="weights")
    # the per-head outputs, concatenated and mixed by out_proj, are the module's output rows
    # (out_proj on 2 rows instead of 5: another matrix shape, so equal up to rounding)
    merged = att.output.transpose(1, 2).reshape(2, 2, 12)
    assert_agree(mha.out_proj(merged), res.output[:, rows],
                 low(q32, k32, v32, key_padding_mask=pad).output[:, rows], what="merged heads")
    # queries are the projected inputs, split into heads
    by_hand = mha.q_proj(q[:, rows]).view(2, 2, 3, 4).transpose(1, 2)
    low_q = low.q_proj(q32[:, rows]).view(2, 2, 3, 4).transpose(1, 2)
    assert_agree(att.query, by_hand, low_q, what="queries")


def test_trace_of_all_rows():
    mha = MultiHeadAttention(8, 2)
    x = torch.randn(1, 4, 8)
    trace = mha(x, trace_rows=slice(None)).trace
    assert trace.rows.tolist() == [0, 1, 2, 3] and trace.attention.weights.shape == (1, 2, 4, 4)


# -- training-mode dropout: gradients flow ---------------------------------------------------------

@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("backend", ["reference", "fused", "auto"])
def test_dropout_in_training_lets_finite_gradients_flow(backend, need_weights):
    torch.manual_seed(8)
    mha = MultiHeadAttention(16, 4, num_kv_heads=2, dropout=0.25, backend=backend).train()
    x = torch.randn(2, 7, 16, requires_grad=True)
    out = mha(x, is_causal=True, need_weights=need_weights).output
    out.square().sum().backward()
    assert x.grad.isfinite().all() and x.grad.abs().sum() > 0
    for name, p in mha.named_parameters():
        assert p.grad is not None and p.grad.isfinite().all(), name
    assert mha.q_proj.weight.grad.abs().sum() > 0


# -- argument checking -------------------------------------------------------------------------------

@pytest.mark.parametrize("args, kwargs, message", [
    ((10, 3), {}, r"embed_dim \(10\) must be divisible by num_heads \(3\)"),
    ((12, 4), {"num_kv_heads": 3}, r"num_heads \(4\) must be divisible by num_kv_heads \(3\)"),
    ((12, 0), {}, r"num_heads \(0\)"),
    ((12, 4), {"dropout": 1.0}, r"dropout must be in \[0, 1\), got 1.0"),
    ((12, 4), {"dropout": -0.5}, r"dropout must be in \[0, 1\), got -0.5"),
])
def test_bad_constructor_arguments(args, kwargs, message):
    with pytest.raises(ValueError, match=message):
        MultiHeadAttention(*args, **kwargs)


def test_bad_backend_name_is_named_at_call_time():
    with pytest.raises(ValueError, match="unknown backend 'fast'"):
        MultiHeadAttention(8, 2, backend="fast")(torch.randn(1, 3, 8))


@pytest.mark.parametrize("call, message", [
    (lambda m: m(torch.randn(2, 5, 11)), r"query must have shape \(batch, length, 12\), got \(2, 5, 11\)"),
    (lambda m: m(torch.randn(5, 12)), r"query must have shape \(batch, length, 12\), got \(5, 12\)"),
    (lambda m: m(torch.randn(2, 5, 12), torch.randn(2, 6, 7)), r"key must have shape \(batch, length, 12\)"),
    (lambda m: m(torch.randn(2, 5, 12), torch.randn(3, 6, 12)), r"key \(3, 6, 12\).*must agree on batch"),
    (lambda m: m(torch.randn(2, 5, 12), torch.randn(2, 6, 12), torch.randn(2, 4, 12)),
     r"value \(2, 4, 12\)"),
    (lambda m: m(torch.randn(2, 5, 12), attn_mask=torch.ones(5, 6, dtype=torch.bool)),
     r"attn_mask must be \(t, s\) = \(5, 5\).*got \(5, 6\)"),
    (lambda m: m(torch.randn(2, 5, 12), attn_mask=torch.ones(4, 5, 5, dtype=torch.bool)),
     r"3-D attn_mask must be \(batch\*heads, t, s\) = \(6, 5, 5\), got \(4, 5, 5\)"),
    (lambda m: m(torch.randn(2, 5, 12), key_padding_mask=torch.ones(2, 4, dtype=torch.bool)),
     r"key_padding_mask must be \(batch, s\) = \(2, 5\), got \(2, 4\)"),
], ids=["query width", "query rank", "key width", "batch", "value length", "attn_mask shape",
        "attn_mask 3-D", "key_padding_mask shape"])
def test_bad_forward_arguments(call, message):
    with pytest.raises(ValueError, match=message):
        call(MultiHeadAttention(12, 3))


@pytest.mark.parametrize("need_weights", [False, True])
def test_a_mask_and_is_causal_together_are_intersected(need_weights):
    # unlike the functional API, the module folds causality into the masks it already merges
    torch.manual_seed(9)
    mha = MultiHeadAttention(12, 3).double()
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    keep = torch.rand(5, 5) > 0.4
    keep.fill_diagonal_(True)
    got = mha(x, attn_mask=keep, is_causal=True, need_weights=need_weights)
    want = mha(x, attn_mask=keep & torch.ones(5, 5, dtype=torch.bool).tril(),
               need_weights=need_weights)
    # exact: both reach the same kernel with the same bool mask
    assert torch.equal(got.output, want.output)


def test_docstring_examples_run():
    assert doctest.testmod(qkv.modules.multihead, extraglobs={"torch": torch}).failed == 0


# -- masks as a description ------------------------------------------------------------------------

@pytest.mark.parametrize("need_weights", [False, True])
def test_a_mask_description_equals_the_torch_style_arguments(need_weights):
    torch.manual_seed(11)
    mha = MultiHeadAttention(12, 3).double()
    x = torch.randn(2, 6, 12, dtype=torch.float64)
    pad = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    torch_style = mha(x, is_causal=True, key_padding_mask=pad, need_weights=need_weights)
    described = mha(x, mask=AttentionMask(causal=True, key_padding=pad), need_weights=need_weights)
    # exact: the module turns the torch-style arguments into this very description
    assert torch.equal(described.output, torch_style.output)
    if need_weights:
        assert torch.equal(described.weights, torch_style.weights)


@pytest.mark.parametrize("need_weights", [False, True])
def test_a_float_key_padding_mask_equals_the_bool_one(need_weights):
    torch.manual_seed(12)
    mha = MultiHeadAttention(12, 3).double()
    x = torch.randn(2, 6, 12, dtype=torch.float64)
    keep = torch.tensor([[True] * 6, [True] * 3 + [False] * 3])
    additive = torch.zeros(2, 6, dtype=torch.float64).masked_fill(~keep, -math.inf)
    want = mha(x, key_padding_mask=keep, need_weights=need_weights)
    got = mha(x, key_padding_mask=additive, need_weights=need_weights)
    if need_weights:  # exact: the reference path adds the same 0 / −inf either way
        assert torch.equal(got.output, want.output) and torch.equal(got.weights, want.weights)
    else:  # a float and a bool mask may take different kernels: equal up to rounding
        low = twin(mha, torch.float32)(x.float(), key_padding_mask=keep).output
        assert_agree(got.output, want.output, low)


def test_a_mask_description_with_torch_style_arguments_is_refused():
    mha = MultiHeadAttention(12, 3)
    x = torch.randn(1, 4, 12)
    with pytest.raises(ValueError, match="either mask=AttentionMask.*or attn_mask / key_padding_mask"):
        mha(x, mask=AttentionMask(causal=True), is_causal=True)
    with pytest.raises(ValueError, match="either mask=AttentionMask"):
        mha(x, mask=AttentionMask(), key_padding_mask=torch.ones(1, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="mask must be a qkv.attention.AttentionMask, got Tensor"):
        mha(x, mask=torch.ones(4, 4, dtype=torch.bool))


def test_trace_only_is_the_full_calls_trace_without_the_rest():
    """trace_only=True: the traced rows' numbers are the full call's, no kernel, out_proj or
    heads computed (output (b, 0, E)); a request it cannot hold is refused by name."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4, num_kv_heads=2, rotary=RotaryEmbedding(4)).double()
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    rows = torch.tensor([6, 2])
    whole = mha(x, is_causal=True, trace_rows=rows)
    mha.out_proj = None  # would fail if called
    only = mha(x, is_causal=True, trace_rows=rows, trace_only=True)
    assert only.output.shape == (2, 0, 16) and only.trace.heads is None
    for name in ("query", "key", "value", "scores", "weights", "output", "lse"):
        assert torch.equal(getattr(only.trace.attention, name), getattr(whole.trace.attention, name))
    assert torch.equal(only.trace.rows, whole.trace.rows)
    with pytest.raises(ValueError, match="trace_only"):
        mha(x, is_causal=True, trace_only=True)
