"""qkv.hf.load: a saved transformers directory on qkv's attention, or one error naming why not."""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("transformers")  # the qkv[hf] extra
import torch  # noqa: E402

import qkv.hf  # noqa: E402
from archs import DECODERS, build  # noqa: E402
from qkv.errors import QkvError  # noqa: E402
from tolerance import assert_within  # noqa: E402



def test_load_runs_on_qkv_and_equals_eager(tmp_path):
    model = build(DECODERS, "olmo2")
    model.save_pretrained(tmp_path)
    ours = qkv.hf.load(tmp_path)
    assert ours.config._attn_implementation == "qkv" and not ours.training
    ids = torch.tensor([[3, 14, 15, 92, 65]])
    with torch.no_grad():
        plain = model(ids).logits
        truth = model.double()(ids).logits  # eager in float64
        assert_within(ours(ids).logits, truth, plain)


def write(tmp_path, **config):
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


@pytest.mark.parametrize("config,msg", [
    (dict(model_type="my_model", auto_map={"AutoModel": "x.Y"}),
     r"cannot build model_type 'my_model' \(its config names remote code, which qkv never runs\)"),
    (dict(model_type="llama", architectures=["NotAClass"]), "architecture 'NotAClass' is not a transformers class"),
    (dict(model_type="bloom", architectures=["BloomForCausalLM"]),
     "BloomForCausalLM: its attention does not go through transformers' AttentionInterface"),
])
def test_refused_by_name(tmp_path, config, msg):
    with pytest.raises(QkvError, match=msg):
        qkv.hf.load(write(tmp_path, **config))


def test_no_config(tmp_path):
    with pytest.raises(QkvError, match="cannot read a transformers config"):
        qkv.hf.load(tmp_path)


# -- issue 31 items 1-4: one checkpoint reader for every path ---------------------------------------
@pytest.fixture(scope="module")
def olmo2_dir(tmp_path_factory):
    """A tiny OLMo 2 (no native family: qkv.load takes the transformers path) with a word-level
    tokenizer of ≤ 99 ids, saved once; tests edit copies."""
    from tokenizers import Tokenizer as Raw, models, pre_tokenizers

    path = tmp_path_factory.mktemp("olmo2")
    build(DECODERS, "olmo2").save_pretrained(path)
    words = ["[UNK]", "a", "b", "cat", "sat"]
    tok = Raw(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path / "tokenizer.json"))
    return path


def edited(src, dst, *, config: dict | None = None, drop: tuple = ()):
    """A copy of ``src`` in ``dst`` with config.json updated by ``config`` (None values delete)."""
    import shutil

    shutil.copytree(src, dst)
    raw = json.loads((dst / "config.json").read_text())
    for key, value in (config or {}).items():
        raw.pop(key, None) if value is None else raw.__setitem__(key, value)
    (dst / "config.json").write_text(json.dumps(raw))
    for f in drop:
        (dst / f).unlink()
    return dst


def as_shards(path, name_of):
    """Replace model.safetensors by an index whose every tensor lies in ``name_of(path)``."""
    from safetensors import safe_open

    with safe_open(str(path / "model.safetensors"), "pt") as f:
        keys = list(f.keys())
    shard = name_of(path)
    (path / "model.safetensors").rename(path.parent / "OUTSIDE.safetensors")
    index = {"metadata": {}, "weight_map": {k: shard for k in keys}}
    (path / "model.safetensors.index.json").write_text(json.dumps(index))


def test_the_adapter_path_loads_the_fixture(olmo2_dir):
    model = qkv.load(olmo2_dir)
    assert type(model).__name__ == "HFModel"


def test_a_pickle_is_never_unpickled(olmo2_dir, tmp_path):
    """Item 1: a directory with only pytorch_model.bin is refused naming it; torch.load never runs
    (the pickle here would fail loudly if it did: it is not a state dict)."""
    path = edited(olmo2_dir, tmp_path / "m", drop=("model.safetensors",))
    (path / "pytorch_model.bin").write_bytes(b"\x80\x04K\x01.")  # pickle of the int 1
    for load in (qkv.load, qkv.hf.load):
        with pytest.raises(QkvError, match="has only pytorch_model.bin, pickled PyTorch weights, "
                                           "which qkv never loads"):
            load(path)


@pytest.mark.parametrize("shard, message", [
    (lambda p: "../OUTSIDE.safetensors", r"file name '\.\./OUTSIDE\.safetensors' is not a plain file name"),
    (lambda p: str(p.parent / "OUTSIDE.safetensors"), r"OUTSIDE\.safetensors' is not a plain file name"),
    (lambda p: "link.safetensors", r"link\.safetensors is a symbolic link to .*OUTSIDE\.safetensors, outside"),
])
def test_shards_outside_the_directory_are_refused(olmo2_dir, tmp_path, shard, message):
    """Item 2: an index naming ../x, an absolute path, or a link leading out."""
    path = edited(olmo2_dir, tmp_path / "m")
    as_shards(path, shard)
    os.symlink(path.parent / "OUTSIDE.safetensors", path / "link.safetensors")
    for load in (qkv.load, qkv.hf.load):
        with pytest.raises(QkvError, match=message):
            load(path)


@pytest.mark.parametrize("change, message", [
    (dict(model_type=["olmo2"]), r"model_type must be a non-empty string.*got \['olmo2'\]"),
    (dict(architectures=["AutoModel"]), r"architecture 'AutoModel' is not a transformers model class"),
    (dict(architectures=["Trainer"]), r"architecture 'Trainer' is not a transformers model class"),
    (dict(architectures=[{"a": 1}]), r"architectures must be a list of class names, got \[\{'a': 1\}\]"),
    (dict(hidden_act="nope"), r"hidden_act 'nope' is not an activation transformers knows"),
    (dict(num_hidden_layers="2"), r"num_hidden_layers must be an integer >= 1, got '2'"),
    (dict(num_hidden_layers=-1), r"num_hidden_layers must be an integer >= 1, got -1"),
    (dict(hidden_size=0), r"hidden_size must be an integer >= 1, got 0"),
    (dict(num_attention_heads=0), r"num_attention_heads must be an integer >= 1, got 0"),
    (dict(dtype="float99"), r"dtype 'float99' is not a floating-point dtype qkv reads"),
    (dict(attn_implementation="flash_attention_2"), r"attn_implementation 'flash_attention_2' is not supported"),
    (dict(quantization_config={"quant_method": "bitsandbytes", "load_in_8bit": True}),
     r"a quantized checkpoint \(quantization_config 'bitsandbytes'\)"),
    (dict(rope_parameters={"rope_theta": "x", "rope_type": "default"}),
     r"rope_theta must be a positive finite number, got 'x'"),
    (dict(rope_parameters={"rope_theta": -1.0, "rope_type": "default"}),
     r"rope_theta must be a positive finite number, got -1.0"),
    (dict(rope_theta="x"), r"rope_theta must be a positive finite number, got 'x'"),
])
def test_bad_config_fields_are_one_error_each(olmo2_dir, tmp_path, change, message):
    """Item 3: each was a traceback (TypeError, AttributeError, KeyError, ZeroDivisionError,
    ImportError) or, for rope_theta ≤ 0, NaN weights."""
    path = edited(olmo2_dir, tmp_path / "m", config=change)
    with pytest.raises(QkvError, match=message):
        qkv.load(path)

@pytest.mark.parametrize("change, field", [
    (dict(initializer_range=-1), "initializer_range"),
    (dict(rms_norm_eps=10**9), "rms_norm_eps"),
    (dict(attention_dropout=True), "attention_dropout"),
])
def test_fields_transformers_refuses_are_one_error(olmo2_dir, tmp_path, change, field):
    """Found by benchmarks/fuzz_checkpoints.py: a field of the wrong type for transformers' own
    config class (an int where it wants a float, a bool) was a TypeError traceback."""
    path = edited(olmo2_dir, tmp_path / "m", config=change)
    with pytest.raises(QkvError, match=rf"config.json: transformers refuses it: .*{field}"):
        qkv.load(path)


@pytest.mark.parametrize("index, message", [
    ([1, 2], r"model.safetensors.index.json must be a JSON object whose weight_map .* got list"),
    ({"weight_map": {}}, r"weight_map maps each tensor name to its shard file, got weight_map \{\}"),
])
def test_a_bad_index_is_one_error(olmo2_dir, tmp_path, index, message):
    path = edited(olmo2_dir, tmp_path / "m", drop=("model.safetensors",))
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(QkvError, match=message):
        qkv.load(path)


@pytest.mark.parametrize("kind, message", [
    ("missing", r"model.safetensors is missing \(a checkpoint directory needs"),
    ("directory", r"model.safetensors is not a regular file"),
    ("fifo", r"model.safetensors is not a regular file"),
])
def test_weight_files_that_are_not_files(olmo2_dir, tmp_path, kind, message):
    path = edited(olmo2_dir, tmp_path / "m", drop=("model.safetensors",))
    if kind == "directory":
        (path / "model.safetensors").mkdir()
    elif kind == "fifo":
        os.mkfifo(path / "model.safetensors")
    with pytest.raises(QkvError, match=message):
        qkv.load(path)


def test_int8_weights_and_extra_tensors_are_refused(olmo2_dir, tmp_path):
    """As natively: integer weights are never cast, a tensor the model lacks never dropped."""
    from safetensors.torch import load_file, save_file

    for kind, message in (("int8", r"tensor 'model.layers.0.self_attn.q_proj.weight' has dtype I8"),
                          ("extra", r"holds a tensor 'model.extra.weight' that Olmo2ForCausalLM does not have")):
        path = edited(olmo2_dir, tmp_path / kind)
        tensors = load_file(path / "model.safetensors")
        if kind == "int8":
            name = "model.layers.0.self_attn.q_proj.weight"
            tensors[name] = tensors[name].to(torch.int8)
        else:
            tensors["model.extra.weight"] = torch.zeros(3)
        save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
        with pytest.raises(QkvError, match=message):
            qkv.load(path)


def test_a_huge_layer_count_fails_from_the_headers_at_once(olmo2_dir, tmp_path):
    """Item 4: the model was laid out on meta before any check (2 GB and growing at 90 s)."""
    import time

    path = edited(olmo2_dir, tmp_path / "m", config=dict(num_hidden_layers=10**9))
    start = time.perf_counter()
    with pytest.raises(QkvError, match=r"num_hidden_layers is 1000000000 but .*model.safetensors "
                                       r"holds 2 layers \(0–1\)"):
        qkv.load(path)
    assert time.perf_counter() - start < 2.0


def test_the_cli_says_one_line_and_exits_2(olmo2_dir, tmp_path, capfd):
    """``qkv explain TEXT --model DIR``: one error line and exit status 2, for a refusal before
    transformers runs (a bad field) and after it has loaded (an extra tensor, with an
    out-of-vocabulary eos_token_id it would warn about): none of its bars or warnings."""
    from safetensors.torch import load_file, save_file

    from qkv.cli import main

    bad = edited(olmo2_dir, tmp_path / "bad", config=dict(hidden_act="nope"))
    extra = edited(olmo2_dir, tmp_path / "extra", config=dict(eos_token_id=500))
    tensors = load_file(extra / "model.safetensors") | {"model.extra.weight": torch.zeros(3)}
    save_file(tensors, extra / "model.safetensors", metadata={"format": "pt"})
    for path, message in ((bad, "hidden_act 'nope'"), (extra, "'model.extra.weight'")):
        assert main(["explain", "a b", "--model", str(path)]) == 2
        captured = capfd.readouterr()
        err = captured.err.strip().splitlines()
        assert len(err) == 1 and message in err[0] and not captured.out, err


def test_an_encoder_decoder_pickle_is_refused_too(tmp_path):
    """Item 1 on the seq2seq path (BART): the same reader, the same refusal."""
    from seq2seq_dirs import save

    path, _ = save(tmp_path, "bart")
    os.rename(os.path.join(path, "model.safetensors"), os.path.join(path, "pytorch_model.bin"))
    with pytest.raises(QkvError, match="has only pytorch_model.bin, pickled PyTorch weights"):
        qkv.load(path)
