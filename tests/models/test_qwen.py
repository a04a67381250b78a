"""qkv's Qwen2 (q/k/v biases) and Qwen3 (per-head RMSNorm on q and k) against transformers.

Tiny random checkpoints with random biases and norm gains (``hf_decoders.make_checkpoint``), so
a missing bias or a norm applied to the wrong axis changes the numbers.
"""

from __future__ import annotations

import pytest
import torch

from hf_decoders import PROMPTS, assert_equals_transformers, assert_explain_rounding, make_checkpoint
from qkv.errors import QkvError
from qkv.models import load
from qkv.models.qwen2 import qwen2_config
from qkv.models.qwen3 import qwen3_config

transformers = pytest.importorskip("transformers")

SIZES = dict(hidden_size=36, intermediate_size=50, num_hidden_layers=2, num_attention_heads=6,
             max_position_embeddings=64)


@pytest.fixture(scope="module", params=["qwen2", "qwen3"])
def checkpoint(request, tmp_path_factory):
    kind = request.param
    path = tmp_path_factory.mktemp(kind)
    if kind == "qwen2":  # 6 heads, 3 kv heads (2 per group), tied
        path, hf = make_checkpoint(path, "Qwen2Config", "Qwen2ForCausalLM", num_key_value_heads=3,
                                   tie_word_embeddings=True, **SIZES)
    else:  # 6 heads, 2 kv heads (3 per group), head_dim 10 ≠ 36/6, untied
        path, hf = make_checkpoint(path, "Qwen3Config", "Qwen3ForCausalLM", num_key_value_heads=2,
                                   head_dim=10, tie_word_embeddings=False, **SIZES)
    return kind, path, hf, load(path)


def test_parts(checkpoint):
    kind, path, hf, model = checkpoint
    attn = model.layers[0].self_attn
    if kind == "qwen2":
        assert attn.q_proj.bias is not None and attn.out_proj.bias is None and attn.q_norm is None
        assert torch.equal(attn.v_proj.bias, hf.model.layers[0].self_attn.v_proj.bias)
    else:
        assert attn.q_proj.bias is None and attn.q_norm.weight.shape == (10,)
        assert torch.equal(attn.k_norm.weight, hf.model.layers[0].self_attn.k_norm.weight)


def test_equals_transformers(checkpoint):
    kind, path, hf, model = checkpoint
    ids = torch.randint(0, 300, (2, 13), generator=torch.Generator().manual_seed(4))
    assert_equals_transformers(model, hf, ids)


def test_right_padded_batch_equals_transformers(checkpoint):
    kind, path, hf, model = checkpoint
    batch = model.tokenizer.encode_batch(PROMPTS)
    assert_equals_transformers(model, hf, batch.input_ids, batch.attention_mask)


@pytest.mark.parametrize("read", [qwen2_config, qwen3_config])
def test_sliding_windows_are_refused_by_name(read):
    with pytest.raises(QkvError, match="use_sliding_window=true is not supported"):
        read({"hidden_size": 32, "num_attention_heads": 4, "use_sliding_window": True})
    with pytest.raises(QkvError, match=r"layer_types \['sliding_attention'\] are not supported"):
        read({"hidden_size": 32, "num_attention_heads": 4,
              "layer_types": ["full_attention", "sliding_attention"]})


def test_explain_head_recomputes_the_qk_norm_and_rotation(checkpoint):
    from qkv.explain import explain_head

    kind, path, hf, model = checkpoint
    st = explain_head(model, "The quick brown fox", layer=1, head=4)
    assert ("normalised per head (RMSNorm), then rotated" in st.qk_transform) == (kind == "qwen3")
    # float64 recomputation against the forward's float32 numbers
    assert_explain_rounding(path, "The quick brown fox", layer=1, head=4)
