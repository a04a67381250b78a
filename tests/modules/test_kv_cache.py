"""The KV cache, and the property it exists for: cached decoding equals the full causal pass.

Decoding is checked token by token and in uneven chunks (a prefill, then single tokens, then a
chunk), for MHA, GQA and MQA, with rotary positions and with ALiBi, for a bare attention module and
for whole layers (encoder-style and decoder-style with cross-attention). In fp64, so a bug shows
as a difference many orders of magnitude above rounding: the cached and the full pass may differ
by 4× the full pass's float32 error rescaled to float64 (``tests/tolerance.py``,
:func:`assert_agree`).
"""

from __future__ import annotations

import pytest
import torch

from qkv.modules import ALiBi, KVCache, MultiHeadAttention, RotaryEmbedding, TransformerLayer
from tolerance import assert_agree, twin

T = 11
SCHEDULES = {
    "token_by_token": [1] * T,
    "prefill_5_then_1": [5] + [1] * (T - 5),
    "chunks": [3, 1, 4, 1, 2],
}


def _decode(step, x, schedule, cache):
    """Feed x (b, T, E) through ``step(chunk, cache)`` in chunks; return the concatenated outputs."""
    outs, start = [], 0
    for n in schedule:
        outs.append(step(x[:, start : start + n], cache))
        start += n
    assert start == x.shape[1] and len(cache) == x.shape[1]
    return torch.cat(outs, dim=1)


def _mha(kind, num_kv_heads):
    torch.manual_seed(0)
    extra = {"rotary": RotaryEmbedding(4)} if kind == "rotary" else {}
    extra |= {"alibi": ALiBi(4)} if kind == "alibi" else {}
    return MultiHeadAttention(16, 4, num_kv_heads=num_kv_heads, **extra).double().eval()


@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
@pytest.mark.parametrize("kind", ["plain", "rotary", "alibi"])
@pytest.mark.parametrize("num_kv_heads", [4, 2, 1], ids=["mha", "gqa", "mqa"])
def test_cached_attention_equals_the_full_causal_pass(num_kv_heads, kind, schedule):
    mha = _mha(kind, num_kv_heads)
    x = torch.randn(2, T, 16, dtype=torch.float64)
    full = mha(x, is_causal=True).output
    low = twin(mha, torch.float32)(x.float(), is_causal=True).output
    cache = KVCache(2, num_kv_heads, 4, max_len=16, dtype=torch.float64)

    cached = _decode(lambda chunk, c: mha(chunk, is_causal=True, kv_cache=c).output, x,
                     SCHEDULES[schedule], cache)

    assert_agree(cached, full, low)


@pytest.mark.parametrize("backend", ["reference", "fused"])
def test_cached_weights_and_traces_equal_the_full_pass(backend):
    mha = _mha("rotary", 2)
    mha.backend = backend
    x = torch.randn(1, T, 16, dtype=torch.float64)
    full = mha(x, is_causal=True, need_weights=True, trace_rows=slice(None))
    low = twin(mha, torch.float32)(x.float(), is_causal=True, need_weights=True,
                                   trace_rows=slice(None))
    cache = KVCache(1, 2, 4, max_len=T, dtype=torch.float64)
    mha(x[:, :6], is_causal=True, kv_cache=cache)
    res = mha(x[:, 6:], is_causal=True, kv_cache=cache, need_weights=True, trace_rows=slice(None))
    assert_agree(res.weights, full.weights[:, 6:], low.weights[:, 6:], what="weights")
    assert_agree(res.trace.attention.weights, full.trace.attention.weights[..., 6:, :],
                 low.trace.attention.weights[..., 6:, :], what="trace weights")
    assert res.trace.key_input.numel() == 0  # past key inputs live only in the cache, as keys


def test_cached_decoding_with_padding_equals_the_full_pass():
    mha = _mha("alibi", 2)
    x = torch.randn(2, T, 16, dtype=torch.float64)
    real = torch.ones(2, T, dtype=torch.bool)
    real[1, 2:4] = False  # tokens of sequence 1 that no one may attend to
    full = mha(x, is_causal=True, key_padding_mask=real).output
    low = twin(mha, torch.float32)(x.float(), is_causal=True, key_padding_mask=real).output
    cache = KVCache(2, 2, 4, max_len=T, dtype=torch.float64)

    def step(chunk, c):
        s = len(c) + chunk.shape[1]
        return mha(chunk, is_causal=True, kv_cache=c, key_padding_mask=real[:, :s]).output

    cached = _decode(step, x, SCHEDULES["prefill_5_then_1"], cache)
    assert_agree(cached, full, low)


def test_reorder_follows_the_surviving_beams():
    mha = _mha("rotary", 2)
    x = torch.randn(3, T, 16, dtype=torch.float64)
    beams = torch.tensor([2, 0, 0])
    cache = KVCache(3, 2, 4, max_len=T, dtype=torch.float64)
    mha(x[:, :6], is_causal=True, kv_cache=cache)
    cache.reorder(beams)
    assert len(cache) == 6
    continued = mha(x[beams, 6:], is_causal=True, kv_cache=cache).output
    full = mha(x[beams], is_causal=True).output
    low = twin(mha, torch.float32)(x[beams].float(), is_causal=True).output
    assert_agree(continued, full[:, 6:], low[:, 6:])


@pytest.mark.parametrize("schedule", ["token_by_token", "chunks"])
@pytest.mark.parametrize("layer_kind", ["post_norm", "pre_norm_gqa_rotary", "decoder"])
def test_cached_transformer_layer_equals_the_full_pass(layer_kind, schedule):
    torch.manual_seed(1)
    kwargs = {"norm_first": layer_kind != "post_norm"}
    if layer_kind == "pre_norm_gqa_rotary":
        kwargs |= {"num_kv_heads": 2, "rotary": RotaryEmbedding(4)}
    if layer_kind == "decoder":
        kwargs |= {"cross_attention": True}
    layer = TransformerLayer.build(16, 4, 32, **kwargs).double().eval()
    x = torch.randn(2, T, 16, dtype=torch.float64)
    memory = torch.randn(2, 6, 16, dtype=torch.float64) if layer_kind == "decoder" else None
    memory_pad = torch.tensor([[True] * 6, [True] * 4 + [False] * 2]) if memory is not None else None
    full = layer(x, is_causal=True, memory=memory, memory_key_padding_mask=memory_pad).hidden
    low = twin(layer, torch.float32)(x.float(), is_causal=True,
                                     memory=memory.float() if memory is not None else None,
                                     memory_key_padding_mask=memory_pad).hidden
    cache = KVCache(2, layer.self_attn.num_kv_heads, 4, max_len=T, dtype=torch.float64)
    # a decoder also keeps the cross-attention's keys and values of the memory, projected once
    memory_cache = KVCache(2, 4, 4, max_len=6, dtype=torch.float64) if memory is not None else None

    cached = _decode(lambda chunk, c: layer(chunk, is_causal=True, kv_cache=c, memory=memory,
                                            memory_key_padding_mask=memory_pad,
                                            memory_kv_cache=memory_cache).hidden,
                     x, SCHEDULES[schedule], cache)
    assert_agree(cached, full, low)
    if memory_cache is not None:
        assert len(memory_cache) == 6  # filled by the first call, never appended to again


# -- the cache itself ------------------------------------------------------------------------------

def test_update_appends_and_returns_everything_cached():
    cache = KVCache(2, 3, 4, max_len=6, value_dim=5)
    k1, v1 = torch.randn(2, 3, 2, 4), torch.randn(2, 3, 2, 5)
    k2, v2 = torch.randn(2, 3, 3, 4), torch.randn(2, 3, 3, 5)
    cache.update(k1, v1)
    k, v = cache.update(k2, v2)
    assert len(cache) == 5
    assert torch.equal(k, torch.cat([k1, k2], dim=2)) and torch.equal(v, torch.cat([v1, v2], dim=2))
    cache.reset()
    assert len(cache) == 0
    k, _ = cache.update(k2, v2)
    assert torch.equal(k, k2)


def test_cache_keeps_its_dtype():
    cache = KVCache(1, 1, 2, max_len=3, dtype=torch.bfloat16)
    k, v = cache.update(torch.randn(1, 1, 1, 2, dtype=torch.bfloat16),
                        torch.randn(1, 1, 1, 2, dtype=torch.bfloat16))
    assert k.dtype == v.dtype == torch.bfloat16


@pytest.mark.parametrize("k_shape, v_shape, message", [
    ((2, 3, 1, 5), (2, 3, 1, 4), r"KVCache holds \(2, 3, 4, 4\), cannot append keys \(2, 3, 1, 5\)"),
    ((1, 3, 1, 4), (1, 3, 1, 4), r"cannot append keys \(1, 3, 1, 4\)"),
    ((2, 2, 1, 4), (2, 2, 1, 4), r"cannot append keys \(2, 2, 1, 4\)"),
    ((2, 3, 4), (2, 3, 4), r"cannot append keys \(2, 3, 4\)"),
    ((2, 3, 1, 4), (2, 3, 2, 4), r"cannot append values \(2, 3, 2, 4\) to keys \(2, 3, 1, 4\)"),
    ((2, 3, 5, 4), (2, 3, 5, 4), r"KVCache is full: 0 \+ 5 tokens > max_len 4"),
])
def test_update_refuses_what_does_not_fit(k_shape, v_shape, message):
    cache = KVCache(2, 3, 4, max_len=4)
    with pytest.raises(ValueError, match=message):
        cache.update(torch.randn(k_shape), torch.randn(v_shape))


def test_sizes_must_be_positive():
    with pytest.raises(ValueError, match="max_len=0"):
        KVCache(1, 2, 4, max_len=0)


def test_a_full_cache_refuses_the_next_token_of_a_module():
    mha = MultiHeadAttention(8, 2)
    cache = KVCache(1, 2, 4, max_len=3)
    mha(torch.randn(1, 3, 8), is_causal=True, kv_cache=cache)
    with pytest.raises(ValueError, match=r"KVCache is full: 3 \+ 1 tokens > max_len 3"):
        mha(torch.randn(1, 1, 8), kv_cache=cache)
