"""MultiHeadAttention against its peer ``torch.nn.MultiheadAttention`` (same weights), against a
hand-written fp64 composition (GQA, MQA), its trace, its masks, and its argument checks.

Mask meanings differ between the two: qkv's bool True = takes part, torch's True = masked out,
so every bool mask handed to torch here is inverted.
"""

from __future__ import annotations

import doctest
import math

import pytest
import torch
from torch import nn

import qkv.modules.multihead
from qkv.modules import ALiBi, MultiHeadAttention, RotaryEmbedding

E, H = 12, 3


def _torch_mha(*, batch_first, cross=False, bias=True, seed=0):
    torch.manual_seed(seed)
    kw = dict(kdim=7, vdim=5) if cross else {}
    m = nn.MultiheadAttention(E, H, batch_first=batch_first, bias=bias, **kw).double().eval()
    with torch.no_grad():  # torch zero-initialises the biases; random ones test that they are copied
        for p in m.parameters():
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

    for average in (True, False):
        want, want_w = _run_torch(m, q, k, v, need_weights=True, average_attn_weights=average,
                                  **theirs)
        got, got_w = mha(q, k, v, need_weights=True, average_attn_weights=average, **ours)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(got_w, want_w)
    # without weights the fused path runs; it must give the same output
    want, _ = _run_torch(m, q, k, v, need_weights=False, **theirs)
    got, none = mha(q, k, v, **ours)
    assert none is None
    torch.testing.assert_close(got, want)


def test_from_torch_without_bias_and_in_fp32():
    torch.manual_seed(3)
    m = nn.MultiheadAttention(E, H, batch_first=True, bias=False).eval()
    mha = MultiHeadAttention.from_torch(m)
    assert mha.q_proj.bias is None and mha.q_proj.weight.dtype == torch.float32
    x = torch.randn(3, 6, E)
    mask = torch.ones(6, 6, dtype=torch.bool).triu(1)  # torch: True above the diagonal = hidden
    want, _ = m(x, x, x, attn_mask=mask, need_weights=False)
    got, _ = mha(x, is_causal=True)
    torch.testing.assert_close(got, want)


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
    got, _ = mha(x, is_causal=True)
    torch.testing.assert_close(got, want)
    got, got_w = mha(x, is_causal=True, need_weights=True, average_attn_weights=False)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_w, want_w)


def test_self_attention_without_positions_is_permutation_equivariant():
    torch.manual_seed(5)
    mha = MultiHeadAttention(16, 4, num_kv_heads=2).double()
    x = torch.randn(2, 11, 16, dtype=torch.float64)
    perm = torch.randperm(11)
    torch.testing.assert_close(mha(x[:, perm])[0], mha(x)[0][:, perm])
    # rotary positions break it, as they should
    mha.rotary = RotaryEmbedding(4)
    assert not torch.allclose(mha(x[:, perm])[0], mha(x)[0][:, perm])


def test_alibi_bias_reaches_the_scores():
    torch.manual_seed(6)
    mha = MultiHeadAttention(16, 4, alibi=ALiBi(4)).double()
    x = torch.randn(1, 6, 16, dtype=torch.float64)
    _, _, trace = mha(x, is_causal=True, trace_rows=slice(None))
    i, j = torch.arange(6)[:, None], torch.arange(6)[None, :]
    want = trace.attention.scaled - ALiBi.slopes_for(4).double().view(4, 1, 1) * (i - j).abs()
    keep = (j <= i).expand(1, 4, 6, 6)
    torch.testing.assert_close(trace.attention.masked[keep], want.expand(1, 4, 6, 6)[keep])
    assert torch.isneginf(trace.attention.masked[~keep]).all()


# -- the trace --------------------------------------------------------------------------------------

def test_trace_rows_record_what_the_forward_computed():
    torch.manual_seed(7)
    mha = MultiHeadAttention(12, 3, kdim=7, vdim=5).double().eval()
    q, k, v = _inputs(True)
    pad = torch.tensor([[True] * 7, [True] * 4 + [False] * 3])
    rows = torch.tensor([4, 1])
    plain_out, heads_w = mha(q, k, v, key_padding_mask=pad, need_weights=True,
                             average_attn_weights=False)
    out, w, trace = mha(q, k, v, key_padding_mask=pad, trace_rows=rows)

    torch.testing.assert_close(out, plain_out)
    assert w is None
    assert torch.equal(trace.rows, rows)
    assert torch.equal(trace.query_input, q[:, rows])
    assert torch.equal(trace.key_input, k) and torch.equal(trace.value_input, v)
    att = trace.attention
    assert att.weights.shape == (2, 3, 2, 7) and not att.weights.requires_grad
    torch.testing.assert_close(att.weights, heads_w[:, :, rows])
    # the per-head outputs, concatenated and mixed by out_proj, are the module's output rows
    merged = att.output.transpose(1, 2).reshape(2, 2, 12)
    torch.testing.assert_close(mha.out_proj(merged), out[:, rows])
    # queries are the projected inputs, split into heads
    torch.testing.assert_close(att.query, mha.q_proj(q[:, rows]).view(2, 2, 3, 4).transpose(1, 2))


def test_trace_of_all_rows():
    mha = MultiHeadAttention(8, 2)
    x = torch.randn(1, 4, 8)
    _, _, trace = mha(x, trace_rows=slice(None))
    assert trace.rows.tolist() == [0, 1, 2, 3] and trace.attention.weights.shape == (1, 2, 4, 4)


# -- training-mode dropout: gradients flow ---------------------------------------------------------

@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("backend", ["reference", "fused", "auto"])
def test_dropout_in_training_lets_finite_gradients_flow(backend, need_weights):
    torch.manual_seed(8)
    mha = MultiHeadAttention(16, 4, num_kv_heads=2, dropout=0.25, backend=backend).train()
    x = torch.randn(2, 7, 16, requires_grad=True)
    out, _ = mha(x, is_causal=True, need_weights=need_weights)
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
    got, _ = mha(x, attn_mask=keep, is_causal=True, need_weights=need_weights)
    want, _ = mha(x, attn_mask=keep & torch.ones(5, 5, dtype=torch.bool).tril())
    torch.testing.assert_close(got, want)


def test_docstring_examples_run():
    assert doctest.testmod(qkv.modules.multihead, extraglobs={"torch": torch}).failed == 0
