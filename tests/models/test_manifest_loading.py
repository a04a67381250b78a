"""qkv.load on a checkpoint with a manifest (config.json's "files"): exactly the listed files are
read, each checked against its sha256 on every load (issue 23, items 2 and 3); config.json is read
through the guarded JSON reader (item 4, the FIFO, rope_theta: Infinity)."""

import json
import os
import shutil
import time
from importlib import resources

import pytest
import torch

import qkv
from qkv.errors import QkvError

LM = str(resources.files("qkv") / "data" / "lm")


@pytest.fixture
def lm_copy(tmp_path):
    d = tmp_path / "lm"
    shutil.copytree(LM, d)
    return d


def test_a_stray_weights_file_beside_the_manifest_is_never_read(lm_copy):
    from safetensors.torch import load_file, save_file

    listed = json.loads((lm_copy / "config.json").read_text())["qkv_training"]["weights"]
    stray = {k: torch.zeros_like(v) for k, v in load_file(lm_copy / listed).items()}
    save_file(stray, lm_copy / "model.safetensors")  # what `train lm --force` used to leave
    got, truth = qkv.load(str(lm_copy)), qkv.load("lm")
    for (name, a), (_, b) in zip(got.state_dict().items(), truth.state_dict().items()):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("victim", ["weights", "model.safetensors.index.json", "tokenizer.json"])
def test_a_changed_listed_file_is_refused_on_every_load_naming_it(lm_copy, victim):
    manifest = json.loads((lm_copy / "config.json").read_text())
    name = manifest["qkv_training"]["weights"] if victim == "weights" else victim
    path = lm_copy / name
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01  # one flipped bit, deep inside the file
    path.write_bytes(bytes(data))
    with pytest.raises(QkvError, match=f"{name}: corrupt checkpoint .*sha256"):
        qkv.load(str(lm_copy))


def test_a_listed_file_that_is_missing_or_a_link_is_refused(lm_copy, tmp_path):
    (lm_copy / "tokenizer.json").rename(tmp_path / "elsewhere.json")
    with pytest.raises(QkvError, match="tokenizer.json is missing"):
        qkv.load(str(lm_copy))
    (lm_copy / "tokenizer.json").symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(QkvError, match="tokenizer.json: a symbolic link"):
        qkv.load(str(lm_copy))


def test_config_json_nested_deep_fifo_or_infinite_is_one_error(lm_copy):
    config = lm_copy / "config.json"
    raw = config.read_text()
    config.write_text('{"model_type": "llama", "x": ' + "[" * 50_000 + "]" * 50_000 + "}")
    with pytest.raises(QkvError, match="config.json is not a usable JSON file: it nests"):
        qkv.load(str(lm_copy))
    config.write_text(raw.replace('"rope_theta": 10000.0', '"rope_theta": Infinity'))
    assert "Infinity" in config.read_text()
    with pytest.raises(QkvError, match="config.json holds Infinity"):
        qkv.load(str(lm_copy))
    config.unlink()
    os.mkfifo(config)
    start = time.monotonic()
    with pytest.raises(QkvError, match="config.json is not a regular file"):
        qkv.load(str(lm_copy))
    assert time.monotonic() - start < 10
