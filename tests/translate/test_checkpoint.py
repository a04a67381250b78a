"""Checkpoints: exact round trip, atomic replacement, and one clear error per kind of damage."""

from __future__ import annotations

import json

import pytest
import torch

from qkv.errors import QkvError
from qkv.translate.model import TranslationConfig, TranslationModel
from qkv.translate.checkpoint import (
    DEFAULT_MODEL_NAME, default_model_dir, is_translation_model, load_checkpoint, resolve_model_dir,
    save_checkpoint,
)
from qkv.translate.vocab import Vocab

EN = ["the cat eats the apple", "a dog sees an orange", "the birds are red"]
FR = ["le chat mange la pomme", "un chien voit une orange", "les oiseaux sont rouges"]


def tiny(vocab: Vocab, seed: int = 0) -> TranslationModel:
    torch.manual_seed(seed)
    cfg = TranslationConfig(vocab.src_size, vocab.tgt_size, d_model=16, num_heads=2,
                            encoder_layers=1, decoder_layers=1, ff_dim=32)
    return TranslationModel(cfg).eval()


@pytest.fixture
def saved(tmp_path):
    vocab = Vocab.train(EN, FR)
    model = tiny(vocab)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.tensor([[4, 5, 2]]), torch.tensor([[1, 4]])).sum().backward()
    opt.step()
    save_checkpoint(tmp_path / "ckpt", model, vocab, {"command": "test"}, step=7, optimizer=opt)
    return tmp_path / "ckpt", model


def test_round_trip_gives_the_same_model(saved):
    directory, model = saved
    ckpt = load_checkpoint(directory, with_optimizer=True)
    assert ckpt.step == 7 and ckpt.meta["command"] == "test"
    for (name, a), (_, b) in zip(model.state_dict().items(), ckpt.model.state_dict().items()):
        assert torch.equal(a, b), name
    assert ckpt.model.generator.weight is ckpt.model.tgt_embed.weight  # still tied after loading
    assert set(ckpt.optimizer_tensors) >= {"state.0.exp_avg", "state.0.exp_avg_sq", "state.0.step"}
    assert not ckpt.model.training


def test_a_new_save_replaces_the_old_files(saved):
    directory, model = saved
    vocab = Vocab.load(directory)
    save_checkpoint(directory, model, vocab, {}, step=9)
    names = sorted(p.name for p in directory.iterdir())
    assert names == ["config.json", "model-000009.safetensors", "tokenizer_en.json", "tokenizer_fr.json"]
    assert load_checkpoint(directory).step == 9


def _config(directory):
    return json.loads((directory / "config.json").read_text())


def test_truncated_weights_are_reported(saved):
    directory, _ = saved
    weights = directory / _config(directory)["weights"]["file"]
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(QkvError, match=r"corrupt checkpoint \(weights file does not match its sha256"):
        load_checkpoint(directory)


def test_a_file_without_a_hash_is_refused_not_trusted(saved):
    # Reproduces issue 9: the sha256 check was skipped when weights.sha256 was missing.
    directory, _ = saved
    meta = _config(directory)
    meta["files"].pop(meta["weights"]["file"])
    (directory / "config.json").write_text(json.dumps(meta))
    with pytest.raises(QkvError, match="is not listed with a sha256 in config.json"):
        load_checkpoint(directory)
    meta["files"][meta["weights"]["file"]] = ""
    (directory / "config.json").write_text(json.dumps(meta))
    with pytest.raises(QkvError, match="no valid sha256 recorded for 'model-000007.safetensors'"):
        load_checkpoint(directory)


@pytest.mark.parametrize("name", ["../outside.safetensors", "/etc/passwd", "sub/model.safetensors",
                                  ".hidden", "", 7])
def test_weights_file_outside_the_directory_is_refused(saved, name):
    # Reproduces issue 9: weights.file could point outside the checkpoint directory.
    directory, _ = saved
    meta = _config(directory)
    (directory.parent / "outside.safetensors").write_bytes(
        (directory / meta["weights"]["file"]).read_bytes())
    meta["weights"]["file"] = name
    if isinstance(name, str) and name:
        meta["files"][name] = meta["files"][f"model-{7:06d}.safetensors"]
    (directory / "config.json").write_text(json.dumps(meta))
    with pytest.raises(QkvError, match="not a plain file name inside the checkpoint directory|must be str"):
        load_checkpoint(directory)


def test_every_tokenizer_is_checked_against_its_sha256(saved):
    # Reproduces issue 9 item 1: tokenizers were not covered by the sha256 check, so another
    # run's tokenizer_*.json were used silently.
    directory, _ = saved
    other = Vocab.train(["a b c d e f"], ["g h i j k l"])
    (directory / "tokenizer_en.json").write_text(other.texts()["tokenizer_en.json"])
    with pytest.raises(QkvError, match=r"tokenizer_en.json: corrupt checkpoint \(tokenizer file does "
                                       r"not match its sha256"):
        load_checkpoint(directory)


@pytest.mark.parametrize("key, value, message", [
    ("step", "abc", r"'step' must be int, got 'abc'"),
    ("step", -3, r"'step' must be >= 0"),
    ("weights", [], r"'weights' must be dict"),
    ("history", "x", r"'history' must be list"),
    ("files", ["model"], r'"files" must map file names to sha256'),
    ("format_version", 1, r"unsupported format_version 1"),
])
def test_config_json_with_wrong_types(saved, key, value, message):
    directory, _ = saved
    meta = _config(directory)
    meta[key] = value
    (directory / "config.json").write_text(json.dumps(meta))
    with pytest.raises(QkvError, match=message):
        load_checkpoint(directory)


def test_saving_removes_temporary_files_a_kill_left(saved):
    directory, model = saved
    stale = directory / ".model-000009.safetensors.0123456789ab.tmp"
    stale.write_bytes(b"half a file")
    save_checkpoint(directory, model, Vocab.load(directory), {}, step=9)
    assert not stale.exists()


def test_bad_config_json(saved):
    directory, _ = saved
    (directory / "config.json").write_text("{\"model_type\": ")
    with pytest.raises(QkvError, match="config.json is not valid JSON"):
        load_checkpoint(directory)


def test_weights_that_do_not_fit_the_config(saved):
    directory, _ = saved
    meta = _config(directory)
    meta["model"]["ff_dim"] = 16
    (directory / "config.json").write_text(json.dumps(meta))
    with pytest.raises(QkvError, match=r"fc1.* has shape \(32,?.*\), the config needs \(16,?.*\)"):
        load_checkpoint(directory)


def test_missing_weights_file(saved):
    directory, _ = saved
    (directory / _config(directory)["weights"]["file"]).unlink()
    with pytest.raises(QkvError, match="weights file 'model-000007.safetensors' named in config.json is missing"):
        load_checkpoint(directory)


def test_not_a_translation_model(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(QkvError, match="is not a translation model .*'bert'"):
        load_checkpoint(tmp_path)
    assert not is_translation_model(tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(QkvError, match="is not a qkv model directory"):
        load_checkpoint(tmp_path / "empty")
    with pytest.raises(QkvError, match="does not exist"):
        load_checkpoint(tmp_path / "nowhere")


def test_the_default_name_means_the_shipped_model(saved):
    directory, _ = saved
    assert resolve_model_dir(None) == resolve_model_dir(DEFAULT_MODEL_NAME) == default_model_dir()
    assert resolve_model_dir(directory) == directory
    assert is_translation_model(directory)
    assert is_translation_model(DEFAULT_MODEL_NAME)


@pytest.mark.parametrize("key, value, message", [
    ("d_model", 10**9, "d_model=1000000000 but no tensor of the weights has a dimension that large"),
    ("encoder_layers", 10**9, "encoder_layers=1000000000 but the weights hold only"),
    ("max_len", 10**9, "max_len=1000000000 is more positions"),
])
def test_huge_config_sizes_fail_before_anything_is_allocated(saved, key, value, message):
    # Reproduces issue 9 item 6 for translation checkpoints: a config asking for 10⁹ of anything
    # allocated (or looped) before the weights were compared with it.
    directory, _ = saved
    meta = _config(directory)
    meta["model"][key] = value
    (directory / "config.json").write_text(json.dumps(meta))
    with pytest.raises(QkvError, match=message):
        load_checkpoint(directory)
