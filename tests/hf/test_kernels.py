"""qkv.hf.kernels: the functions a transformers layer calls by name, found in its modeling file,
and replaced there for one call only (a tiny Llama attention, eager)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from transformers import LlamaConfig  # noqa: E402
from transformers.models.llama import modeling_llama  # noqa: E402

from qkv.explain.mixers.capture import kernel_call  # noqa: E402
from qkv.hf.kernels import modeling_function, replaced, rope_functions  # noqa: E402


def attention() -> tuple[torch.nn.Module, dict]:
    """A Llama attention layer and the arguments of one call on 5 tokens (causal, its RoPE)."""
    config = LlamaConfig(hidden_size=16, num_attention_heads=2, num_key_value_heads=2,
                         intermediate_size=24, num_hidden_layers=1, vocab_size=10)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    module = modeling_llama.LlamaAttention(config, layer_idx=0).eval()
    x = torch.randn(1, 5, 16)
    cos_sin = modeling_llama.LlamaRotaryEmbedding(config)(x, torch.arange(5)[None])
    mask = torch.full((5, 5), torch.finfo(x.dtype).min).triu(1)[None, None]
    return module, dict(hidden_states=x, position_embeddings=cos_sin, attention_mask=mask)


def test_modeling_function_is_the_modeling_files_own():
    module, _ = attention()
    assert modeling_function(module, "eager_attention_forward") is modeling_llama.eager_attention_forward
    assert modeling_function(module, "no_such_function") is None
    assert modeling_function(module, "logger") is None  # a module attribute, not a function
    assert rope_functions(module) == ("apply_rotary_pos_emb",)


def test_replaced_for_one_call_and_put_back():
    module, call = attention()
    original = modeling_llama.apply_rotary_pos_emb
    seen = []

    def counting(*args, **kwargs):
        seen.append(args[0].shape)
        return original(*args, **kwargs)

    with replaced(module, "apply_rotary_pos_emb", counting) as found, torch.no_grad():
        assert found is original
        want = module(**call)[0]
    assert seen == [(1, 2, 5, 8)]  # (b, h, t, d): the layer rotated its q once
    assert modeling_llama.apply_rotary_pos_emb is original
    with pytest.raises(RuntimeError), replaced(module, "apply_rotary_pos_emb", counting):
        raise RuntimeError("inside")
    assert modeling_llama.apply_rotary_pos_emb is original
    with pytest.raises(ValueError, match="no function 'no_such_function'"):
        with replaced(module, "no_such_function", counting):
            pass
    with torch.no_grad():
        assert torch.equal(module(**call)[0], want)  # nothing left behind


def test_a_recorded_call_carries_the_function_it_called():
    module, call = attention()
    recorded = kernel_call(module, "eager_attention_forward", **call)
    assert recorded.function is modeling_llama.eager_attention_forward
    with torch.no_grad():
        again = recorded.function(**recorded.arguments)
    assert torch.equal(again[0], recorded.result[0])
