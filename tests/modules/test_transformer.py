"""TransformerLayer: pre-/post-norm against a hand-written composition of its own parts, and
against PyTorch's ``TransformerEncoderLayer`` / ``TransformerDecoderLayer`` holding the same
weights (eval mode, dropout 0) — a strong peer: a different code base doing the same arithmetic."""

from __future__ import annotations

import doctest

import pytest
import torch
from torch import nn

import qkv.modules.transformer
from qkv.modules import FeedForward, MultiHeadAttention, TransformerLayer

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
        return layer.self_attn(h, is_causal=True, key_padding_mask=pad)[0]

    def ca(h):
        return layer.cross_attn(h, memory)[0]

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
    got = layer(x, memory=memory, is_causal=True, key_padding_mask=pad)
    torch.testing.assert_close(got, _by_hand(layer, x, memory, pad))


def test_build_wires_the_requested_parts():
    layer = TransformerLayer.build(E, H, FF, cross_attention=True, num_kv_heads=1, norm_eps=1e-12,
                                   activation="relu", bias=False)
    assert layer.self_attn.num_kv_heads == layer.cross_attn.num_kv_heads == 1
    assert layer.norm1.eps == layer.norm2.eps == layer.norm3.eps == 1e-12
    assert isinstance(layer.feed_forward.act, nn.ReLU) and layer.feed_forward.fc1.bias is None
    assert layer.feed_forward.fc1.out_features == FF
    assert TransformerLayer.build(E, H, FF).norm2 is None


# -- against torch's layers ------------------------------------------------------------------------

def _from_torch_encoder(t: nn.TransformerEncoderLayer, activation: str) -> TransformerLayer:
    ff = FeedForward(E, FF, activation=activation)
    ff.fc1.load_state_dict(t.linear1.state_dict())
    ff.fc2.load_state_dict(t.linear2.state_dict())
    layer = TransformerLayer(MultiHeadAttention.from_torch(t.self_attn), ff, norm_first=t.norm_first,
                             norm_eps=t.norm1.eps)
    layer.norm1.load_state_dict(t.norm1.state_dict())
    layer.norm3.load_state_dict(t.norm2.state_dict())  # torch's norm2 is the feed-forward's norm
    return layer.to(t.linear1.weight.dtype).eval()


@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("norm_first", [False, True], ids=["post_norm", "pre_norm"])
@pytest.mark.parametrize("batch_first", [True, False], ids=["batch_first", "seq_first"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_equals_torch_transformer_encoder_layer(batch_first, norm_first, activation, dtype):
    torch.manual_seed(2)
    peer = nn.TransformerEncoderLayer(E, H, FF, dropout=0.0, activation=activation,
                                      batch_first=batch_first, norm_first=norm_first,
                                      layer_norm_eps=1e-6)
    peer = _randomise(peer, 3).to(dtype).eval()
    layer = _from_torch_encoder(peer, activation)
    x = torch.randn(3, 9, E, dtype=dtype)
    pad = torch.ones(3, 9, dtype=torch.bool)
    pad[1, 6:] = False
    causal = torch.ones(9, 9, dtype=torch.bool).triu(1)  # torch's bool: True = masked out

    def peer_run(**kwargs):
        if batch_first:
            return peer(x, **kwargs)
        return peer(x.transpose(0, 1), **kwargs).transpose(0, 1)

    with torch.no_grad():  # also lets torch take its fused "fast path" where it can
        want_plain = peer_run()
        want_masked = peer_run(src_mask=causal, src_key_padding_mask=~pad, is_causal=True)
        got_plain = layer(x)
        got_masked = layer(x, is_causal=True, key_padding_mask=pad)
    torch.testing.assert_close(got_plain, want_plain)
    # torch's fast path leaves padded query rows unspecified; compare the real tokens
    torch.testing.assert_close(got_masked[pad], want_masked[pad])


@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("norm_first", [False, True], ids=["post_norm", "pre_norm"])
def test_equals_torch_transformer_decoder_layer(norm_first, activation):
    torch.manual_seed(4)
    peer = nn.TransformerDecoderLayer(E, H, FF, dropout=0.0, activation=activation, batch_first=True,
                                      norm_first=norm_first)
    peer = _randomise(peer, 5).double().eval()
    ff = FeedForward(E, FF, activation=activation)
    ff.fc1.load_state_dict(peer.linear1.state_dict())
    ff.fc2.load_state_dict(peer.linear2.state_dict())
    layer = TransformerLayer(MultiHeadAttention.from_torch(peer.self_attn), ff,
                             cross_attn=MultiHeadAttention.from_torch(peer.multihead_attn),
                             norm_first=norm_first)
    for name in ("norm1", "norm2", "norm3"):  # the same three norms in the same places
        getattr(layer, name).load_state_dict(getattr(peer, name).state_dict())
    layer = layer.double().eval()
    x = torch.randn(2, 6, E, dtype=torch.float64)
    memory = torch.randn(2, 8, E, dtype=torch.float64)
    memory_real = torch.ones(2, 8, dtype=torch.bool)
    memory_real[0, 5:] = False
    causal = nn.Transformer.generate_square_subsequent_mask(6, dtype=torch.float64)

    want = peer(x, memory, tgt_mask=causal, tgt_is_causal=True,
                memory_key_padding_mask=~memory_real)
    got = layer(x, memory=memory, is_causal=True, memory_key_padding_mask=memory_real)
    torch.testing.assert_close(got, want)


# -- traces, errors, training ----------------------------------------------------------------------

def test_trace_rows_return_both_attentions_and_the_same_output():
    torch.manual_seed(6)
    layer = TransformerLayer.build(E, H, FF, cross_attention=True).double().eval()
    x = torch.randn(2, 5, E, dtype=torch.float64)
    memory = torch.randn(2, 3, E, dtype=torch.float64)
    plain = layer(x, memory=memory, is_causal=True)
    out, trace = layer(x, memory=memory, is_causal=True, trace_rows=torch.tensor([0, 4]))
    torch.testing.assert_close(out, plain)
    assert trace.self_attn.attention.weights.shape == (2, H, 2, 5)
    assert trace.cross_attn.attention.weights.shape == (2, H, 2, 3)
    # row 0 may only see itself under causality
    assert (trace.self_attn.attention.weights[:, :, 0, 1:] == 0).all()
    # post-norm: the self-attention read the layer's input itself
    assert torch.equal(trace.self_attn.query_input, x[:, [0, 4]])
    encoder = TransformerLayer.build(E, H, FF)
    assert encoder(x.float(), trace_rows=slice(None))[1].cross_attn is None


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
    out = layer(x, memory=memory, is_causal=True)
    assert not torch.allclose(out, layer.eval()(x, memory=memory, is_causal=True))
    out.square().sum().backward()
    for tensor in (x, memory):
        assert tensor.grad.isfinite().all() and tensor.grad.abs().sum() > 0
    for name, p in layer.named_parameters():
        assert p.grad is not None and p.grad.isfinite().all(), name


def test_docstring_examples_run():
    assert doctest.testmod(qkv.modules.transformer, extraglobs={"torch": torch}).failed == 0
