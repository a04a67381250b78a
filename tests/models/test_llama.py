"""qkv's Llama against Hugging Face transformers, same weights (tiny random checkpoints).

Each variant is a random ``LlamaForCausalLM`` built by ``transformers`` from a config with odd
sizes, saved with ``save_pretrained`` and loaded with ``qkv.load``: GQA with 1, 2 and 3 query
heads per key/value head, a ``head_dim`` that is not hidden/heads, every ``rope_scaling`` type,
tied and untied output heads, attention and MLP biases. Logits, every hidden state and every
attention probability equal transformers' eager implementation within derived tolerances
(``tests/hf_decoders.py``); cached and padded forwards equal the plain one.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from hf_decoders import PROMPTS, assert_equals_transformers, assert_explain_rounding, make_checkpoint
from qkv.errors import QkvError
from qkv.models import load
from qkv.models.llama import LlamaConfig, LlamaModel, RMSNorm
from tolerance import assert_within, twin

transformers = pytest.importorskip("transformers")

BASE = dict(hidden_size=36, intermediate_size=50, num_hidden_layers=2, max_position_embeddings=48)
VARIANTS = {
    # 6 heads, 2 kv heads (3 per group), head_dim 10 ≠ 36/6, untied, q/k/v/o biases
    "gqa3-headdim-bias": dict(num_attention_heads=6, num_key_value_heads=2, head_dim=10,
                              attention_bias=True, rope_theta=500.0),
    # 4 heads, 4 kv heads (ratio 1), tied head, mlp biases
    "mha-tied": dict(hidden_size=40, num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=True,
                     mlp_bias=True),
    # 4 heads, 2 kv heads (ratio 2), linear position interpolation
    "gqa2-linear": dict(hidden_size=40, num_attention_heads=4, num_key_value_heads=2,
                        rope_scaling={"rope_type": "linear", "factor": 3.0}),
    # one kv head (MQA), Llama 3.1's scaling with a short original length so every band occurs
    "mqa-llama3": dict(num_attention_heads=6, num_key_value_heads=1, head_dim=16,
                       rope_theta=50.0,
                       rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                     "high_freq_factor": 4.0, "original_max_position_embeddings": 16}),
    # dynamic NTK: tested past max_position_embeddings (16), where it changes the base
    "gqa3-dynamic": dict(num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=16,
                         rope_scaling={"rope_type": "dynamic", "factor": 2.0}),
}


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def variant(request, tmp_path_factory):
    """(name, directory, HF eager model, qkv model)."""
    name = request.param
    path, hf = make_checkpoint(tmp_path_factory.mktemp(name), "LlamaConfig", "LlamaForCausalLM",
                               **(BASE | VARIANTS[name]))
    return name, path, hf, load(path)


def fresh(variant):
    """transformers' model for one comparison: dynamic NTK in transformers keeps the largest
    length seen so far as state (a later, shorter call keeps its frequencies), so each
    comparison with it starts from a freshly loaded model."""
    name, path, hf, model = variant
    if "dynamic" not in name:
        return hf
    return transformers.LlamaForCausalLM.from_pretrained(path, attn_implementation="eager").eval()


def test_loads_the_saved_config_and_weights(variant):
    name, path, hf, model = variant
    c = model.config
    assert isinstance(model, LlamaModel) and isinstance(c, LlamaConfig)
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (
        hf.config.num_attention_heads, hf.config.num_key_value_heads, hf.config.head_dim)
    attn = model.layers[1].self_attn
    assert torch.equal(attn.k_proj.weight, hf.model.layers[1].self_attn.k_proj.weight)
    assert torch.equal(model.layers[0].norm3.weight, hf.model.layers[0].post_attention_layernorm.weight)
    if c.tie_word_embeddings:
        assert model.lm_head is None and model.output_weight is model.embed_tokens.weight
    else:
        assert torch.equal(model.lm_head.weight, hf.lm_head.weight)
        assert not torch.equal(model.lm_head.weight, model.embed_tokens.weight)


def test_equals_transformers(variant):
    name, path, hf, model = variant
    t = 29 if "dynamic" in name else 13  # dynamic: past max_position_embeddings = 16
    ids = torch.randint(0, 300, (2, t), generator=torch.Generator().manual_seed(3))
    assert_equals_transformers(model, fresh(variant), ids)


def test_right_padded_batch_equals_transformers(variant):
    name, path, hf, model = variant
    batch = model.tokenizer.encode_batch(PROMPTS)  # right-padded: positions as HF counts them
    assert_equals_transformers(model, fresh(variant), batch.input_ids, batch.attention_mask)


def test_rope_scaling_is_used(variant):
    """The scaled variants differ from the same weights with plain RoPE (the test can fail)."""
    name, path, hf, model = variant
    if model.config.rope_scaling is None:
        pytest.skip(f"{name} uses plain RoPE (no rope_scaling in its config): no scaled variant "
                    "to tell apart")
    plain = LlamaModel(LlamaConfig(**{**model.config.__dict__, "rope_scaling": None,
                                      "max_position_embeddings": 64}))
    plain.load_state_dict(model.state_dict())
    ids = torch.arange(29 if "dynamic" in name else 13)[None]
    with torch.no_grad():
        assert not torch.allclose(model(ids).logits, plain(ids).logits)


def test_cached_and_left_padded_forwards_equal_the_plain_one(variant):
    """Truth: the same model in float64; plain: its own full float32 forward."""
    name, path, hf, model = variant
    model64 = twin(model, torch.float64)
    ids = torch.randint(0, 300, (2, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full, truth = model(ids).logits, model64(ids).logits
        caches = model.new_kv_caches(2, 11)
        steps = [model(ids[:, :5], kv_caches=caches).logits]
        steps += [model(ids[:, j : j + 1], kv_caches=caches).logits for j in range(5, 11)]
        assert_within(torch.cat(steps, dim=1), truth, full, what="cached logits")
        # left padding: 3 pads before row 0 leave its logits as they are alone
        pad = torch.cat([torch.zeros(2, 3, dtype=torch.long), ids], dim=1)
        mask = torch.ones_like(pad)
        mask[0, :3] = 0
        mask[1, :3] = 0
        left = model(pad, mask).logits[:, 3:]
        assert_within(left, truth, full, what="left-padded logits")


def test_rmsnorm_equals_transformers():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    """float32 and bfloat16: the same operations in the same order (bf16 normalised in float32,
    as transformers does), so equal bit for bit. (transformers also rounds float64 inputs to
    float32 here; qkv keeps float64 in float64, its truth for the other tests.)"""
    x = torch.randn(3, 5, 12)
    ours, theirs = RMSNorm(12, eps=1e-5), LlamaRMSNorm(12, eps=1e-5)
    with torch.no_grad():
        w = torch.randn(12)
        ours.weight.copy_(w)
        theirs.weight.copy_(w)
        assert torch.equal(ours(x), theirs(x))
        xb = x.to(torch.bfloat16)
        assert torch.equal(ours.to(torch.bfloat16)(xb), theirs.to(torch.bfloat16)(xb))


# -- bad input -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    path, _ = make_checkpoint(tmp_path_factory.mktemp("tiny"), "LlamaConfig", "LlamaForCausalLM",
                              **(BASE | VARIANTS["gqa2-linear"]))
    return path


def _with_config(src: str, dst, change: dict) -> str:
    import shutil

    shutil.copytree(src, dst)
    file = os.path.join(dst, "config.json")
    with open(file) as f:
        d = json.load(f)
    d |= change
    with open(file, "w") as f:
        json.dump(d, f)
    return str(dst)


@pytest.mark.parametrize("change, message", [
    ({"rope_parameters": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 1e4}},
     "RoPE scaling type 'yarn' is not supported; qkv supports default, linear, dynamic, llama3"),
    ({"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4}}, "factor must be a positive"),
    ({"hidden_act": "gelu_fast"}, "hidden_act 'gelu_fast' is not supported"),
    ({"num_key_value_heads": 3}, r"num_attention_heads \(4\) must be divisible by num_key_value_heads \(3\)"),
    ({"architectures": ["LlamaForSequenceClassification"]}, "LlamaForSequenceClassification"),
    ({"partial_rotary_factor": 0.5}, "partial_rotary_factor=0.5 is not supported"),
])
def test_unsupported_options_are_named(tiny_dir, tmp_path, change, message):
    with pytest.raises(QkvError, match=message):
        load(_with_config(tiny_dir, tmp_path / "x", change))


def test_unsupported_model_type_names_the_supported_ones(tiny_dir, tmp_path):
    with pytest.raises(QkvError, match=r"model_type 'mixtral' is not supported natively; qkv runs .*llama.*mistral.*qwen2.*qwen3"):
        load(_with_config(tiny_dir, tmp_path / "x", {"model_type": "mixtral"}), via="native")


def test_a_model_type_that_contradicts_the_weights_is_refused(tiny_dir, tmp_path):
    # without a native family the directory goes to transformers (qkv.hf), which would build a
    # Mixtral and fill it with random experts: the header check refuses the disagreement first
    with pytest.raises(QkvError, match=r"'LlamaForCausalLM' is a 'llama' model but config.json says "
                                       r"model_type 'mixtral'"):
        load(_with_config(tiny_dir, tmp_path / "x", {"model_type": "mixtral"}))


def test_old_style_rope_keys_are_read():
    """transformers < 5 wrote rope_theta and rope_scaling ({"type": ...}) at the top level."""
    c = LlamaConfig.from_dict({"hidden_size": 32, "num_attention_heads": 4, "rope_theta": 5e5,
                               "rope_scaling": {"type": "dynamic", "factor": 4.0},
                               "max_position_embeddings": 100})
    assert c.rope_theta == 5e5 and c.rope_scaling.kind == "dynamic" and c.max_length == 400


def test_prompt_longer_than_the_positions(variant):
    name, path, hf, model = variant
    n = model.max_length
    with pytest.raises(QkvError, match=f"input is {n + 1} tokens; .* takes at most {n}"):
        model(torch.zeros(1, n + 1, dtype=torch.long))
    with pytest.raises(QkvError, match=f"takes at most {n}"):
        model.generate(torch.zeros(1, n - 2, dtype=torch.long), max_new_tokens=3)


# -- qkv explain / qkv heads on a Llama directory ------------------------------------------------
def test_explain_says_causal_and_recomputes_rope(tiny_dir, capsys):
    from qkv.cli import main
    from qkv.explain import explain, explain_head

    model = load(tiny_dir)
    text = "The quick brown fox jumps"
    ov = explain(model, text)
    assert ov.causal and ov.to_dict()["causal"].startswith("decoder: each token attends to itself")
    st = explain_head(model, text, token="fox", layer=1, head=3)
    assert "rotated by RoPE" in st.qk_transform
    assert torch.all(st.weights[st.token_index + 1:] == 0)  # nothing from later tokens
    # the float64 recomputation (with the rotation) matches the forward's float32 numbers
    assert_explain_rounding(tiny_dir, text, token="fox", layer=1, head=3)
    assert main(["explain", text, "--model", tiny_dir]) == 0
    out = capsys.readouterr().out
    assert "decoder: each token attends to itself and the tokens before it only" in out
    assert main(["heads", text, "--model", tiny_dir, "--from", "brown", "--to", "jumps"]) == 0
    assert "'jumps' comes after 'brown'" in capsys.readouterr().err


def test_attention_sink_is_named(tiny_dir, capsys):
    """Layer 0's heads made to park on the first token: every query gets a constant component
    (embedding coordinate 0 is the same for all tokens) and only the first token's key
    answers it (coordinate 1 is set for its id alone), in the last rotary pair of each head,
    whose frequency is so low (θ = 10000^(−8/10) / 3) that RoPE barely turns it."""
    from qkv.cli import main
    from qkv.explain import explain

    model = load(tiny_dir)
    text = "The quick brown fox jumps"
    ids = model.tokenizer.encode(text).ids
    assert ids.count(ids[0]) == 1
    d, h, h_kv = model.config.head_dim, model.config.num_attention_heads, model.config.num_key_value_heads
    with torch.no_grad():
        model.embed_tokens.weight[:, :2] = 0
        model.embed_tokens.weight[:, 0] = 5.0
        model.embed_tokens.weight[ids[0], 1] = 5.0
        a = model.layers[0].self_attn
        a.q_proj.weight.zero_()
        a.k_proj.weight.zero_()
        for head in range(h):
            a.q_proj.weight[head * d + d // 2 - 1, 0] = 3.0
        for head in range(h_kv):
            a.k_proj.weight[head * d + d // 2 - 1, 1] = 3.0
    ov = explain(model, text)
    assert ov.sink is not None and ov.to_dict()["attention_sink"].startswith("attention sink: ")
    assert ov.focus != 0  # the sink is not the focus
    assert sum(r.argmax == 0 for r in ov.rows if r.layer == 0) == h
    from rich.console import Console

    from qkv.explain.rendering.render import render_overview

    console = Console(record=True, width=300)
    render_overview(console, ov)
    assert f"attention sink: {sum(r.argmax == 0 for r in ov.rows)} of {len(ov.rows)} heads" in console.export_text()
    ov_first = explain(model, text, token="0")  # the first token itself: no sink to name
    assert ov_first.sink is None
    capsys.readouterr()  # (the console above printed too)
    assert main(["explain", text, "--model", tiny_dir]) == 0  # the CLI says what the library found
    saved = explain(load(tiny_dir), text).sink
    assert ("attention sink: " in capsys.readouterr().out) == (saved is not None)


def test_logits_to_keep(variant):
    """Generation asks for the last position's logits only: the same row as the full forward's
    (truth: float64; plain: the full float32 forward)."""
    name, path, hf, model = variant
    ids = torch.randint(0, 300, (2, 9), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        kept = model(ids, logits_to_keep=1).logits
        full, truth = model(ids).logits, twin(model, torch.float64)(ids).logits
    assert kept.shape == (2, 1, 300)
    assert_within(kept, truth[:, -1:], full[:, -1:], what="last logits")


def test_sharded_checkpoint_loads_the_same_model(tiny_dir, tmp_path):
    """save_pretrained with a small max_shard_size writes model-0000k-of-0000n.safetensors and
    model.safetensors.index.json: the same weights, the same logits (bit for bit)."""
    hf = transformers.LlamaForCausalLM.from_pretrained(tiny_dir)
    hf.save_pretrained(tmp_path, max_shard_size="20KB")
    import shutil

    shutil.copy(os.path.join(tiny_dir, "tokenizer.json"), tmp_path)
    assert os.path.isfile(tmp_path / "model.safetensors.index.json")
    assert len([f for f in os.listdir(tmp_path) if f.endswith(".safetensors")]) > 1
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    with torch.no_grad():
        assert torch.equal(load(tmp_path)(ids).logits, load(tiny_dir)(ids).logits)
