"""TransformerLayer: pre-/post-norm against a hand-written composition of its own parts, and
against PyTorch's ``TransformerEncoderLayer`` / ``TransformerDecoderLayer`` holding the same
weights (eval mode, dropout 0) — a strong peer: a different code base doing the same arithmetic.
Also the parts a builder may choose: RMSNorm and a gated (SwiGLU) feed-forward.

Tolerances (``tests/tolerance.py``): in fp64, :func:`assert_agree` (4× the float32 run's error,
rescaled to float64); in fp32, :func:`assert_within` against the peer run in fp64.
"""

from __future__ import annotations

import doctest

import pytest
import torch
from torch import nn

import qkv.modules.transformer
from qkv.attention import AttentionMask
from qkv.modules import FeedForward, GatedFeedForward, LayerOutput, MultiHeadAttention, TransformerLayer
from tolerance import FUSED_FACTOR, assert_agree, assert_within, bound, max_err, twin

E, H, FF = 16, 4, 40


def _randomise(module, seed):
    """Random weights everywhere (LayerNorm too), so a wrongly wired part cannot hide."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(p + 0.3 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return module


# -- against a hand-written composition ------------------------------------------------------------

def _by_hand(layer, x, memory, pad):
    """The equations of the module docstring, written out with the layer's own parts."""
    def sa(h):
        return layer.self_attn(h, is_causal=True, key_padding_mask=pad).output

    def ca(h):
        return layer.cross_attn(h, memory).output

    ff = layer.feed_forward
    if layer.norm_first:
        x = x + sa(layer.norm1(x))
        if memory is not None:
            x = x + ca(layer.norm2(x))
        return x + ff(layer.norm3(x))
    x = layer.norm1(x + sa(x))
    if memory is not None:
        x = layer.norm2(x + ca(x))
    return layer.norm3(x + ff(x))


@pytest.mark.parametrize("cross", [False, True], ids=["encoder", "decoder"])
@pytest.mark.parametrize("norm_first", [False, True], ids=["post_norm", "pre_norm"])
def test_layer_equals_the_composition_of_its_parts(norm_first, cross):
    torch.manual_seed(0)
    layer = _randomise(TransformerLayer.build(E, H, FF, norm_first=norm_first, cross_attention=cross,
                                              num_kv_heads=2), 1).double().eval()
    x = torch.randn(2, 7, E, dtype=torch.float64)
    memory = torch.randn(2, 5, E, dtype=torch.float64) if cross else None
    pad = torch.tensor([[True] * 7, [True] * 5 + [False] * 2])
    out = layer(x, memory=memory, is_causal=True, key_padding_mask=pad)
    assert isinstance(out, LayerOutput) and out.trace is None
    low = _by_hand(twin(layer, torch.float32), x.float(), memory.float() if cross else None, pad)
    assert_agree(out.hidden, _by_hand(layer, x, memory, pad), low)
    # the mask as a description (what a stack passes down) is the same call, exactly
    described = layer(x, memory=memory, mask=AttentionMask(causal=True, key_padding=pad))
    assert torch.equal(described.hidden, out.hidden)


def test_build_wires_the_requested_parts():
    layer = TransformerLayer.build(E, H, FF, cross_attention=True, num_kv_heads=1, norm_eps=1e-12,
                                   activation="relu", bias=False)
    assert layer.self_attn.num_kv_heads == layer.cross_attn.num_kv_heads == 1
    assert layer.norm1.eps == layer.norm2.eps == layer.norm3.eps == 1e-12
    assert isinstance(layer.feed_forward.act, nn.ReLU) and layer.feed_forward.fc1.bias is None
    assert layer.feed_forward.fc1.out_features == FF
    assert TransformerLayer.build(E, H, FF).norm2 is None


# -- the parts a builder chooses: RMSNorm, a gated feed-forward ---------------------------------------

def _rms_norm_by_hand(norm, x):
    """x / sqrt(mean(x²) + eps) · γ (Zhang & Sennrich, 2019), over the last dim."""
    return x / torch.sqrt(x.square().mean(-1, keepdim=True) + norm.eps) * norm.weight


def _llama_block_by_hand(layer, x):
    """Pre-norm with RMSNorm and SwiGLU, written out: x + attn(rms(x)), then + down(silu(gate)·up)."""
    x = x + layer.self_attn(_rms_norm_by_hand(layer.norm1, x), is_causal=True).output
    h = _rms_norm_by_hand(layer.norm3, x)
    ff = layer.feed_forward
    gate, up = h @ ff.gate.weight.T, h @ ff.up.weight.T
    return x + (gate * torch.sigmoid(gate) * up) @ ff.down.weight.T


def test_build_with_rms_norm_and_a_gated_feed_forward():
    layer = TransformerLayer.build(E, H, FF, norm="rms", gated=True, activation="silu", norm_first=True,
                                   norm_eps=1e-6, bias=False, num_kv_heads=2)
    for norm in (layer.norm1, layer.norm3):
        assert isinstance(norm, nn.RMSNorm) and norm.eps == 1e-6
    ff = layer.feed_forward
    assert isinstance(ff, GatedFeedForward) and isinstance(ff.act, nn.SiLU)
    assert (ff.gate.out_features, ff.up.out_features, ff.down.in_features) == (FF, FF, FF)
    assert ff.gate.bias is None and layer.self_attn.q_proj.bias is None
    layer = _randomise(layer, 8).double().eval()
    x = torch.randn(2, 9, E, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    want = _llama_block_by_hand(layer, x)
    low = _llama_block_by_hand(twin(layer, torch.float32), x.float())
    assert_agree(layer(x, is_causal=True).hidden, want, low)


def test_bad_parts_are_refused():
    with pytest.raises(ValueError, match=r"unknown norm 'batch'; choose from \['layer', 'rms'\]"):
        TransformerLayer.build(E, H, FF, norm="batch")
    parts = TransformerLayer.build(E, H, FF, cross_attention=True)
    with pytest.raises(ValueError, match="cross_attn and norm2 come together"):
        TransformerLayer(parts.self_attn, parts.feed_forward, parts.norm1, parts.norm3,
                         cross_attn=parts.cross_attn)
    with pytest.raises(ValueError, match="cross_attn and norm2 come together"):
        TransformerLayer(parts.self_attn, parts.feed_forward, parts.norm1, parts.norm3,
                         norm2=parts.norm2)


# -- against torch's layers ------------------------------------------------------------------------

def _from_torch_encoder(t: nn.TransformerEncoderLayer, activation: str) -> TransformerLayer:
    dtype = t.linear1.weight.dtype  # parts made in the peer's dtype: copies round nothing
    ff = FeedForward(E, FF, activation=activation).to(dtype)
    ff.fc1.load_state_dict(t.linear1.state_dict())
    ff.fc2.load_state_dict(t.linear2.state_dict())
    norm1 = nn.LayerNorm(E, eps=t.norm1.eps, dtype=dtype)
    norm3 = nn.LayerNorm(E, eps=t.norm2.eps, dtype=dtype)
    norm1.load_state_dict(t.norm1.state_dict())
    norm3.load_state_dict(t.norm2.state_dict())  # torch's norm2 is the feed-forward's norm
    layer = TransformerLayer(MultiHeadAttention.from_torch(t.self_attn), ff, norm1, norm3,
                             norm_first=t.norm_first)
    return layer.eval()


@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("norm_first", [False, True], ids=["post_norm", "pre_norm"])
@pytest.mark.parametrize("batch_first", [True, False], ids=["batch_first", "seq_first"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_equals_torch_transformer_encoder_layer(batch_first, norm_first, activation, dtype):
    torch.manual_seed(2)
    peer = nn.TransformerEncoderLayer(E, H, FF, dropout=0.0, activation=activation,
                                      batch_first=batch_first, norm_first=norm_first,
                                      layer_norm_eps=1e-6)
    peer = _randomise(peer.to(dtype), 3).eval()  # weights drawn in the tested dtype
    layer = _from_torch_encoder(peer, activation)
    x = torch.randn(3, 9, E, dtype=dtype)
    pad = torch.ones(3, 9, dtype=torch.bool)
    pad[1, 6:] = False
    causal = torch.ones(9, 9, dtype=torch.bool).triu(1)  # torch's bool: True = masked out

    def peer_run(module, x, **kwargs):
        if batch_first:
            return module(x, **kwargs)
        return module(x.transpose(0, 1), **kwargs).transpose(0, 1)

    masked = dict(src_mask=causal, src_key_padding_mask=~pad, is_causal=True)
    # fp32: the truth is the peer in fp64, the plain path the peer in fp32 (its fast path);
    # fp64: the peer's float32 run measures the rounding
    other = twin(peer, torch.float64 if dtype == torch.float32 else torch.float32)
    with torch.no_grad():  # also lets torch take its fused "fast path" where it can
        want_plain = peer_run(peer, x)
        want_masked = peer_run(peer, x, **masked)
        other_plain = peer_run(other, x.to(other.linear1.weight.dtype))
        other_masked = peer_run(other, x.to(other.linear1.weight.dtype), **masked)
        got_plain = layer(x).hidden
        got_masked = layer(x, is_causal=True, key_padding_mask=pad).hidden
    # torch's fast path leaves padded query rows unspecified; compare the real tokens
    if dtype == torch.float32:
        assert_within(got_plain, other_plain, want_plain, what="unmasked")
        assert_within(got_masked[pad], other_masked[pad], want_masked[pad], what="masked")
    else:
        assert_agree(got_plain, want_plain, other_plain, what="unmasked")
        assert_agree(got_masked[pad], want_masked[pad], other_masked[pad], what="masked")


@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("norm_first", [False, True], ids=["post_norm", "pre_norm"])
def test_equals_torch_transformer_decoder_layer(norm_first, activation):
    torch.manual_seed(4)
    peer = nn.TransformerDecoderLayer(E, H, FF, dropout=0.0, activation=activation, batch_first=True,
                                      norm_first=norm_first)
    peer = _randomise(peer.double(), 5).eval()  # float64 weights, not widened float32 ones
    ff = FeedForward(E, FF, activation=activation).double()  # float64 before copying: exact
    ff.fc1.load_state_dict(peer.linear1.state_dict())
    ff.fc2.load_state_dict(peer.linear2.state_dict())
    norms = [nn.LayerNorm(E, dtype=torch.float64) for _ in range(3)]
    for norm, name in zip(norms, ("norm1", "norm2", "norm3")):  # the same three in the same places
        norm.load_state_dict(getattr(peer, name).state_dict())
    layer = TransformerLayer(MultiHeadAttention.from_torch(peer.self_attn), ff, norms[0], norms[2],
                             cross_attn=MultiHeadAttention.from_torch(peer.multihead_attn),
                             norm2=norms[1], norm_first=norm_first)
    layer = layer.eval()
    x = torch.randn(2, 6, E, dtype=torch.float64)
    memory = torch.randn(2, 8, E, dtype=torch.float64)
    memory_real = torch.ones(2, 8, dtype=torch.bool)
    memory_real[0, 5:] = False
    causal = nn.Transformer.generate_square_subsequent_mask(6, dtype=torch.float64)

    kwargs = dict(tgt_is_causal=True, memory_key_padding_mask=~memory_real)
    want = peer(x, memory, tgt_mask=causal, **kwargs)
    low = twin(peer, torch.float32)(x.float(), memory.float(), tgt_mask=causal.float(), **kwargs)
    got = layer(x, memory=memory, is_causal=True, memory_key_padding_mask=memory_real).hidden
    assert_agree(got, want, low)
    described = layer(x, memory=memory, mask=AttentionMask(causal=True),
                      memory_mask=AttentionMask(key_padding=memory_real)).hidden
    assert torch.equal(described, got)  # exact: the same description, built by the caller


# -- traces, errors, training ----------------------------------------------------------------------

def test_trace_rows_return_both_attentions_and_the_same_output():
    torch.manual_seed(6)
    layer = TransformerLayer.build(E, H, FF, cross_attention=True).double().eval()
    x = torch.randn(2, 5, E, dtype=torch.float64)
    memory = torch.randn(2, 3, E, dtype=torch.float64)
    plain = layer(x, memory=memory, is_causal=True).hidden  # the fused attention
    low = twin(layer, torch.float32)(x.float(), memory=memory.float(), is_causal=True).hidden
    traced = layer(x, memory=memory, is_causal=True, trace_rows=torch.tensor([0, 4]))
    out, trace = traced.hidden, traced.trace
    assert_agree(out, plain, low)  # the traced (reference) attention: equal up to rounding
    assert trace.self_attn.attention.weights.shape == (2, H, 2, 5)
    assert trace.cross_attn.attention.weights.shape == (2, H, 2, 3)
    # row 0 may only see itself under causality
    assert (trace.self_attn.attention.weights[:, :, 0, 1:] == 0).all()
    # post-norm: the self-attention read the layer's input itself
    assert torch.equal(trace.self_attn.query_input, x[:, [0, 4]])
    encoder = TransformerLayer.build(E, H, FF)
    assert encoder(x.float(), trace_rows=slice(None)).trace.cross_attn is None
    assert encoder(x.float()).trace is None


@pytest.mark.parametrize("cross, memory", [(False, True), (True, False)])
def test_memory_must_match_cross_attention(cross, memory):
    layer = TransformerLayer.build(E, H, FF, cross_attention=cross)
    with pytest.raises(ValueError, match="memory must be given exactly when the layer has cross"):
        layer(torch.randn(1, 3, E), memory=torch.randn(1, 2, E) if memory else None)


@pytest.mark.parametrize("backend", ["reference", "fused", "auto"])
def test_dropout_in_training_lets_finite_gradients_flow(backend):
    torch.manual_seed(7)
    layer = TransformerLayer.build(E, H, FF, cross_attention=True, dropout=0.2, norm_first=True,
                                   backend=backend).train()
    layer.cross_attn.backend = backend
    x = torch.randn(2, 6, E, requires_grad=True)
    memory = torch.randn(2, 4, E, requires_grad=True)
    out = layer(x, memory=memory, is_causal=True).hidden
    # dropout acted: out is further from the dropout-free answer (the layer in eval mode, in
    # fp64) than rounding could take it (the eval-mode fp32 forward, with the fused factor)
    with torch.no_grad():
        truth = twin(layer, torch.float64).eval()(x.double(), memory=memory.double(), is_causal=True)
        plain = twin(layer, torch.float32).eval()(x, memory=memory, is_causal=True)
    assert max_err(out, truth.hidden) > bound(truth.hidden, plain.hidden, factor=FUSED_FACTOR)
    out.square().sum().backward()
    for tensor in (x, memory):
        assert tensor.grad.isfinite().all() and tensor.grad.abs().sum() > 0
    for name, p in layer.named_parameters():
        assert p.grad is not None and p.grad.isfinite().all(), name


def test_docstring_examples_run():
    assert doctest.testmod(qkv.modules.transformer, extraglobs={"torch": torch}).failed == 0
