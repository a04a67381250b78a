"""``qkv.models.load``: known names, checkpoint layouts, and one clear error for each bad input.

Loaded weights are the checkpoint's tensors exactly (``torch.equal``); a bfloat16 load is held to
the rule of ``tests/tolerance.py`` against ``transformers`` (float64 truth, bfloat16 plain path).
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from qkv.errors import QkvError
from qkv.models import BertModel, GPT2Model, Tokenizer, load
from qkv.models.gpt2 import gpt2_shapes
from qkv.models.loading import minilm_dir
from qkv.models.gpt2 import GPT2Config
from tolerance import assert_within

IDS = torch.tensor([[101, 7592, 2088, 999, 102]])  # [CLS] hello world ! [SEP]


@pytest.fixture(scope="module")
def minilm() -> BertModel:
    return load("minilm")


@pytest.fixture(scope="module")
def minilm_tensors() -> dict[str, torch.Tensor]:
    return load_file(os.path.join(minilm_dir(), "model.safetensors"))


def checkpoint_copy(path, *, config: dict | None = None, weights: bool = True):
    """A copy of the MiniLM directory in ``path``: files linked, config.json optionally edited."""
    for f in os.listdir(minilm_dir()):
        if f == "config.json" or (f == "model.safetensors" and not weights):
            continue
        os.symlink(os.path.join(minilm_dir(), f), path / f)
    with open(os.path.join(minilm_dir(), "config.json")) as f:
        raw = json.load(f)
    (path / "config.json").write_text(json.dumps({**raw, **(config or {})}))
    return path


def test_load_minilm(minilm):
    assert isinstance(minilm, BertModel) and not minilm.training
    assert minilm.name == "all-MiniLM-L6-v2"
    assert isinstance(minilm.tokenizer, Tokenizer) and minilm.tokenizer.max_length == 512
    assert minilm.max_seq_length == 256  # sentence_bert_config.json
    assert minilm.config.num_hidden_layers == len(minilm.layers) == 6
    assert minilm.embeddings.word.weight.dtype == torch.float32
    assert not any(p.is_meta for p in minilm.parameters())


def test_weights_are_the_checkpoint_tensors(minilm, minilm_tensors):
    layer = minilm.layers[2]
    assert torch.equal(layer.self_attn.v_proj.weight, minilm_tensors["encoder.layer.2.attention.self.value.weight"])
    assert torch.equal(layer.feed_forward.fc2.bias, minilm_tensors["encoder.layer.2.output.dense.bias"])
    assert torch.equal(layer.norm3.weight, minilm_tensors["encoder.layer.2.output.LayerNorm.weight"])


@pytest.mark.parametrize("name", ["all-MiniLM-L6-v2", minilm_dir()])
def test_other_names_for_the_same_model(minilm, name):
    other = load(name)
    with torch.no_grad():
        assert torch.equal(other(IDS).last_hidden_state, minilm(IDS).last_hidden_state)


def test_unknown_name():
    with pytest.raises(QkvError, match=r"unknown model 'gpt-17': known names are minilm, all-MiniLM-L6-v2"):
        load("gpt-17")


def test_directory_that_does_not_exist(tmp_path):
    missing = tmp_path / "no" / "such"
    with pytest.raises(QkvError, match=f"model directory {missing} does not exist"):
        load(missing)


def test_file_instead_of_directory(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(QkvError, match="is a file; give the checkpoint directory"):
        load(tmp_path / "model.safetensors")


def test_missing_or_invalid_config(tmp_path):
    with pytest.raises(QkvError, match=f"{tmp_path / 'config.json'} is missing"):
        load(tmp_path)
    (tmp_path / "config.json").write_text("{oops")
    with pytest.raises(QkvError, match="config.json is not valid JSON"):
        load(tmp_path)


def test_missing_weights(tmp_path):
    checkpoint_copy(tmp_path, weights=False)
    with pytest.raises(QkvError, match=f"{tmp_path / 'model.safetensors'} is missing"):
        load(tmp_path)
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x04")  # a pickle: never opened
    with pytest.raises(QkvError, match="only pickled PyTorch weights, which qkv never loads"):
        load(tmp_path)


def test_truncated_weights(tmp_path):
    checkpoint_copy(tmp_path, weights=False)
    with open(os.path.join(minilm_dir(), "model.safetensors"), "rb") as f:
        data = f.read()
    (tmp_path / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(QkvError, match=r"model.safetensors is truncated or not a safetensors file"):
        load(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(data[:100])  # not even a whole header
    with pytest.raises(QkvError, match=r"model.safetensors is truncated"):
        load(tmp_path)


def test_tensor_shape_disagrees_with_config(tmp_path):
    checkpoint_copy(tmp_path, config={"max_position_embeddings": 256})
    with pytest.raises(QkvError, match=r"tensor 'embeddings.position_embeddings.weight' has shape "
                                       r"\(512, 384\) but config.json implies \(256, 384\)"):
        load(tmp_path)


def test_stored_tensor_with_a_wrong_shape(tmp_path, minilm_tensors):
    checkpoint_copy(tmp_path, weights=False)
    bad = dict(minilm_tensors)
    bad["encoder.layer.3.intermediate.dense.weight"] = torch.zeros(1535, 384)
    save_file(bad, str(tmp_path / "model.safetensors"))
    with pytest.raises(QkvError, match=r"'encoder.layer.3.intermediate.dense.weight' has shape "
                                       r"\(1535, 384\) but config.json implies \(1536, 384\)"):
        load(tmp_path)


def test_layer_count_disagrees_with_the_header(tmp_path):
    """Checked first, from the header alone: the message names the key and both counts."""
    fewer, more = tmp_path / "fewer", tmp_path / "more"
    fewer.mkdir(), more.mkdir()
    checkpoint_copy(fewer, config={"num_hidden_layers": 5})
    with pytest.raises(QkvError, match=r"num_hidden_layers is 5 but .*model.safetensors holds 6 layers \(0–5\)"):
        load(fewer)
    checkpoint_copy(more, config={"num_hidden_layers": 7})
    with pytest.raises(QkvError, match=r"num_hidden_layers is 7 but .* holds 6 layers"):
        load(more)


def test_unexpected_and_missing_tensors(tmp_path, minilm_tensors):
    extra, fewer = tmp_path / "extra", tmp_path / "fewer"
    for path, tensors in ((extra, {**minilm_tensors, "encoder.layer.2.attention.self.rel": torch.zeros(3)}),
                          (fewer, {k: v for k, v in minilm_tensors.items() if "layer.4.output.dense.bias" not in k})):
        path.mkdir()
        checkpoint_copy(path, weights=False)
        save_file(tensors, str(path / "model.safetensors"))
    with pytest.raises(QkvError, match=r"unexpected tensor 'encoder.layer.2.attention.self.rel'"):
        load(extra)
    with pytest.raises(QkvError, match=r"missing tensor 'encoder.layer.4.output.dense.bias'"):
        load(fewer)


@pytest.mark.parametrize("config, message", [
    ({"model_type": "t5"}, r"model_type 't5' is not supported; qkv runs bert, .*gpt2"),
    ({"architectures": ["BertForQuestionAnswering"]}, r"architecture 'BertForQuestionAnswering' is not supported"),
    ({"hidden_act": "gelu_10"}, r"hidden_act 'gelu_10' is not supported"),
])
def test_unsupported_architecture(tmp_path, config, message):
    checkpoint_copy(tmp_path, config=config)
    with pytest.raises(QkvError, match=message):
        load(tmp_path)


def test_prefixed_bert_checkpoint_with_heads(tmp_path, minilm, minilm_tensors):
    """Saved from BertForMaskedLM: keys carry "bert." and an MLM head comes along (ignored)."""
    checkpoint_copy(tmp_path, weights=False, config={"architectures": ["BertForMaskedLM"]})
    tensors = {"bert." + k: v for k, v in minilm_tensors.items()}
    tensors["cls.predictions.bias"] = torch.zeros(30522)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    model = load(tmp_path)
    with torch.no_grad():
        assert torch.equal(model(IDS).last_hidden_state, minilm(IDS).last_hidden_state)


def test_bf16():
    model = load("minilm", dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    transformers = pytest.importorskip("transformers")
    hf = transformers.BertModel.from_pretrained(minilm_dir(), attn_implementation="eager").eval()
    with torch.no_grad():
        got = model(IDS).last_hidden_state
        truth = hf.double()(IDS).last_hidden_state
        plain = hf.to(torch.bfloat16)(IDS).last_hidden_state
    assert got.dtype == torch.bfloat16
    assert_within(got, truth, plain, what="bf16 last_hidden_state")
    with pytest.raises(QkvError, match="dtype must be a floating-point torch.dtype, got torch.int64"):
        load("minilm", dtype=torch.int64)


# -- GPT-2 layouts ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gpt2_parts(tmp_path_factory):
    """(config dict, HF-named tensors, tokenizer dir) of a tiny random GPT-2."""
    from tokenizers import ByteLevelBPETokenizer

    tok_dir = tmp_path_factory.mktemp("gpt2-tok")
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(["hello world, attention please"] * 2, vocab_size=300, min_frequency=1)
    tok.save_model(str(tok_dir))
    config = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 32,
              "n_head": 4, "n_layer": 2, "n_positions": 16, "vocab_size": 300}
    g = torch.Generator().manual_seed(0)
    tensors = {k: torch.randn(s, generator=g) * 0.1 for k, s in gpt2_shapes(GPT2Config.from_dict(config)).items()}
    return config, tensors, str(tok_dir)


def write_gpt2(path, config, tensors, tok_dir):
    path.mkdir(exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(path / "model.safetensors"))
    for f in ("vocab.json", "merges.txt"):
        os.symlink(os.path.join(tok_dir, f), path / f)
    return path


def test_gpt2_with_or_without_prefix(tmp_path, gpt2_parts):
    config, tensors, tok_dir = gpt2_parts
    plain = load(write_gpt2(tmp_path / "a", config, tensors, tok_dir))
    prefixed = {"transformer." + k: v for k, v in tensors.items()}
    prefixed["lm_head.weight"] = tensors["wte.weight"].clone()  # a stored tied copy: allowed
    other = load(write_gpt2(tmp_path / "b", config, prefixed, tok_dir))
    assert isinstance(plain, GPT2Model) and plain.lm_head.weight is plain.wte.weight
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        assert torch.equal(plain(ids).logits, other(ids).logits)
    # the loaded projections are c_attn's transposed thirds
    assert torch.equal(plain.layers[0].self_attn.v_proj.weight, tensors["h.0.attn.c_attn.weight"][:, 64:].T)


def test_gpt2_untied_head_is_rejected(tmp_path, gpt2_parts):
    config, tensors, tok_dir = gpt2_parts
    write_gpt2(tmp_path, config, {**tensors, "lm_head.weight": torch.zeros(300, 32)}, tok_dir)
    with pytest.raises(QkvError, match="'lm_head.weight' differs from 'wte.weight'"):
        load(tmp_path)


def test_gpt2_fused_attention_shape_checked(tmp_path, gpt2_parts):
    config, tensors, tok_dir = gpt2_parts
    write_gpt2(tmp_path, config, {**tensors, "h.1.attn.c_attn.weight": torch.zeros(96, 32)}, tok_dir)
    with pytest.raises(QkvError, match=r"'h.1.attn.c_attn.weight' has shape \(96, 32\) but config.json implies \(32, 96\)"):
        load(tmp_path)
