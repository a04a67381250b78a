"""qkv's GPT-NeoX / Pythia against Hugging Face transformers, same weights.

Each variant is a random ``GPTNeoXForCausalLM`` built by ``transformers`` from a config with
odd sizes, saved with ``save_pretrained`` and loaded with ``qkv.load``: parallel and
sequential residuals, rotary on a quarter, half or all of each head, tied and untied output
heads, with and without attention biases. Logits, every hidden state and every attention
probability equal transformers' eager implementation within derived tolerances
(``tests/hf_decoders.py``: float64 truth, transformers' float32 as the plain path); greedy
generation equals transformers' token for token, with and without the cache; a left-padded
batch equals one prompt at a time. Sharded, bfloat16 and broken checkpoints load or fail clearly.
"""

from __future__ import annotations

import os

import pytest
import torch

from hf_decoders import PROMPTS, assert_equals_transformers, make_checkpoint
from qkv.errors import QkvError
from qkv.models import load
from qkv.models.gpt_neox import GPTNeoXConfig, GPTNeoXModel, ParallelResidualLayer, split_qkv
from tolerance import assert_within, twin

transformers = pytest.importorskip("transformers")

BASE = dict(num_hidden_layers=2, intermediate_size=50, max_position_embeddings=48)
VARIANTS = {
    # Pythia's layout: parallel residual, RoPE on a quarter of each head (4 of 16), untied
    "parallel-quarter": dict(hidden_size=48, num_attention_heads=3, rotary_pct=0.25),
    # GPT-2-like sequential residual, RoPE on the whole head, tied head, no attention biases
    "sequential-full-tied": dict(hidden_size=40, num_attention_heads=4, rotary_pct=1.0,
                                 use_parallel_residual=False, tie_word_embeddings=True,
                                 attention_bias=False),
    # half of each head rotated, another base
    "parallel-half-base": dict(hidden_size=36, num_attention_heads=3, rotary_pct=0.5,
                               rope_theta=500.0, hidden_act="gelu_new"),
}


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def variant(request, tmp_path_factory):
    """(name, directory, HF eager model, qkv model)."""
    name = request.param
    path, hf = make_checkpoint(tmp_path_factory.mktemp(name), "GPTNeoXConfig", "GPTNeoXForCausalLM",
                               **(BASE | VARIANTS[name]))
    return name, path, hf, load(path)


def test_loaded_model_matches_the_config(variant):
    name, path, hf, model = variant
    assert isinstance(model, GPTNeoXModel) and not model.training
    c = model.config
    assert c.rotary_dim == int(c.head_dim * VARIANTS[name]["rotary_pct"])
    assert isinstance(model.layers[0], ParallelResidualLayer) == c.use_parallel_residual
    assert (model.lm_head is None) == c.tie_word_embeddings
    if c.rotary_dim:
        assert model.layers[0].self_attn.rotary.rotary_dim == c.rotary_dim
    # the fused query_key_value, rows [q_h k_h v_h] per head, split into three projections
    w = hf.gpt_neox.layers[1].attention.query_key_value.weight  # (3E, E)
    d = c.head_dim
    assert torch.equal(model.layers[1].self_attn.k_proj.weight[d : 2 * d], w[4 * d : 5 * d])
    assert torch.equal(model.layers[1].self_attn.v_proj.weight[:d], w[2 * d : 3 * d])


def test_logits_hidden_states_attention_equal_transformers(variant):
    _, _, hf, model = variant
    batch = model.tokenizer.encode_batch(PROMPTS)  # right-padded
    assert_equals_transformers(model, hf, batch.input_ids, batch.attention_mask)
    ids = torch.tensor([model.tokenizer.encode(PROMPTS[2]).ids])
    assert_equals_transformers(model, hf, ids)


def test_greedy_generation_equals_transformers(variant):
    _, _, hf, model = variant
    for prompt in PROMPTS:
        ids = torch.tensor([model.tokenizer.encode(prompt).ids])
        with torch.no_grad():
            ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=10,
                              do_sample=False, pad_token_id=0, eos_token_id=None)
        for use_cache in (True, False):
            ours = model.generate(ids, 10, use_cache=use_cache)
            assert ours.tolist() == ref.tolist(), f"use_cache={use_cache}, prompt {prompt!r}"


def test_left_padded_batch_equals_one_by_one(variant):
    """Each real token of a left-padded batch is as close to its float64 truth as the prompt's
    own unpadded float32 forward; batched greedy generation equals one prompt at a time."""
    _, _, _, model = variant
    model64 = twin(model, torch.float64)
    encs = [model.tokenizer.encode(p) for p in PROMPTS]
    t = max(len(e) for e in encs)
    ids = torch.zeros(len(encs), t, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, e in enumerate(encs):
        ids[i, t - len(e):], mask[i, t - len(e):] = torch.tensor(e.ids), 1
    with torch.no_grad():
        left = model(ids, mask).logits
        for i, e in enumerate(encs):
            alone = model(torch.tensor([e.ids])).logits[0]
            truth = model64(torch.tensor([e.ids])).logits[0]
            assert_within(left[i, t - len(e):], truth, alone, what=f"left-padded prompt {i}")
    gen = model.generate(ids, 6, attention_mask=mask)
    for i, e in enumerate(encs):
        assert gen[i, t - len(e):].tolist() == model.generate(torch.tensor([e.ids]), 6)[0].tolist()


def test_cached_decoding_equals_the_full_forward(variant):
    _, _, _, model = variant
    ids = torch.randint(0, 300, (2, 13), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full, truth = model(ids).logits, twin(model, torch.float64)(ids).logits
        caches = model.new_kv_caches(2, 13)
        steps = [model(ids[:, :6], kv_caches=caches).logits]
        steps += [model(ids[:, j : j + 1], kv_caches=caches).logits for j in range(6, 13)]
    assert_within(torch.cat(steps, dim=1), truth, full, what="cached logits")


def test_split_qkv_layout():
    w = torch.arange(3 * 2 * 4 * 5.0).view(24, 5)  # h = 2 heads of d = 4, E = 5
    q, k, v = split_qkv(w, heads=2)
    assert torch.equal(q, torch.cat([w[0:4], w[12:16]]))
    assert torch.equal(k, torch.cat([w[4:8], w[16:20]]))
    assert torch.equal(v, torch.cat([w[8:12], w[20:24]]))


# -- checkpoints: sharded, bfloat16, broken --------------------------------------------------
@pytest.fixture(scope="module")
def pythia_like(tmp_path_factory):
    path, hf = make_checkpoint(tmp_path_factory.mktemp("pythia-like"), "GPTNeoXConfig",
                               "GPTNeoXForCausalLM", **(BASE | VARIANTS["parallel-quarter"]))
    return path, hf


def test_sharded_checkpoint_loads_the_same_weights(pythia_like, tmp_path):
    path, hf = pythia_like
    hf.save_pretrained(str(tmp_path), max_shard_size="40KB")
    for f in ("tokenizer.json",):
        os.symlink(os.path.join(path, f), tmp_path / f)
    assert (tmp_path / "model.safetensors.index.json").is_file()
    shards = sorted(p.name for p in tmp_path.glob("model-*.safetensors"))
    assert len(shards) > 2
    one, sharded = load(path), load(tmp_path)
    for (name, a), (_, b) in zip(one.state_dict().items(), sharded.state_dict().items()):
        assert torch.equal(a, b), name
    os.remove(tmp_path / shards[1])
    with pytest.raises(QkvError, match=f"{shards[1]} is missing \\(named in .*index.json\\)"):
        load(tmp_path)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_half_precision_checkpoint_loads_as_stored(pythia_like, tmp_path, dtype):
    """dtype=None keeps the stored bf16/fp16; the forward is held to transformers' error in
    that dtype (float64 truth from the same rounded weights)."""
    path, hf = pythia_like
    hf16 = twin(hf, dtype)
    hf16.save_pretrained(str(tmp_path))
    os.symlink(os.path.join(path, "tokenizer.json"), tmp_path / "tokenizer.json")
    model = load(tmp_path)
    assert {p.dtype for p in model.parameters()} == {dtype}
    assert load(tmp_path, dtype=torch.float32).embed_tokens.weight.dtype == torch.float32
    ids = torch.tensor([model.tokenizer.encode(PROMPTS[2]).ids])
    with torch.no_grad():
        got = model(ids).logits
        truth = twin(hf16, torch.float64)(ids).logits  # the rounded weights, computed exactly
        plain = hf16(ids).logits
    assert got.dtype == dtype
    assert_within(got, truth, plain, what=f"{dtype} logits")


def test_wrong_dtype_tensor_is_named(pythia_like, tmp_path):
    from safetensors.torch import load_file, save_file

    path, _ = pythia_like
    tensors = load_file(os.path.join(path, "model.safetensors"))
    tensors["gpt_neox.layers.1.mlp.dense_h_to_4h.bias"] = torch.zeros(50, dtype=torch.int32)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    for f in ("config.json", "tokenizer.json"):
        os.symlink(os.path.join(path, f), tmp_path / f)
    with pytest.raises(QkvError, match=r"tensor 'gpt_neox.layers.1.mlp.dense_h_to_4h.bias' has dtype I32"):
        load(tmp_path)


@pytest.mark.parametrize("change, message", [
    ({"rope_parameters": {"rope_type": "linear", "factor": 2.0}}, r"rope_parameters type 'linear' is not supported"),
    ({"rotary_pct": 0.3, "hidden_size": 40, "num_attention_heads": 4}, r"rotary_pct .* = 3 rotary features"),
    ({"use_parallel_residual": "yes"}, r"use_parallel_residual must be true or false, got 'yes'"),
    ({"architectures": ["GPTNeoXForTokenClassification"]}, r"'GPTNeoXForTokenClassification' is not supported"),
    ({"hidden_act": ["gelu"]}, r"hidden_act \['gelu'\] is not supported"),
    ({"eos_token_id": [0, "1"]}, r"eos_token_id must be a token id or a list of them, got \[0, '1'\]"),
])
def test_config_rejects_unsupported(change, message):
    with pytest.raises(QkvError, match=message):
        GPTNeoXConfig.from_dict({"model_type": "gpt_neox", "hidden_size": 48,
                                 "num_attention_heads": 4} | change)


def test_pythia_config_keys():
    """A Pythia config.json (transformers 4 names: rotary_pct, rotary_emb_base)."""
    c = GPTNeoXConfig.from_dict({
        "architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox", "hidden_size": 512,
        "num_attention_heads": 8, "num_hidden_layers": 6, "intermediate_size": 2048,
        "rotary_pct": 0.25, "rotary_emb_base": 10000, "use_parallel_residual": True,
        "tie_word_embeddings": False, "vocab_size": 50304, "eos_token_id": 0, "rope_scaling": None})
    assert (c.head_dim, c.rotary_dim, c.rotary_emb_base, c.eos_token_id) == (64, 16, 10000.0, (0,))


def test_explain_and_heads_run_on_a_neox_checkpoint(pythia_like, capsys):
    """The CLI on a decoder: words from "Ġ"-marked tokens, each word's text without its space."""
    from qkv.cli import main

    path, _ = pythia_like
    assert main(["explain", "The quick brown fox jumps.", "--model", path, "--words"]) == 0
    out = capsys.readouterr().out
    assert "words: 0:The 1:quick 2:brown 3:fox 4:jumps 5:." in out
    assert "decoder: each token attends to itself and the tokens before it only" in out
    assert main(["heads", "--probe", "induction", "--model", path]) == 0
    assert "chance" in capsys.readouterr().out
    assert main(["heads", "The quick brown fox jumps", "--model", path, "--from", "jumps",
                 "--to", "fox"]) == 0
    assert "weight from 'jumps' (word 4) to 'fox' (word 3)" in capsys.readouterr().out
