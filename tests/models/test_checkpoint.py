"""models/checkpoint.py, the one safetensors reader: which files it reads and which it refuses,
on files written here (no model needed)."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import save_file

from qkv.errors import QkvError
from qkv.models.checkpoint import WeightFiles

TENSORS = {"layers.0.w": torch.zeros(2, 3), "layers.1.w": torch.ones(2, 3)}


def test_headers_are_read_without_the_data(tmp_path):
    save_file(TENSORS, tmp_path / "model.safetensors")
    w = WeightFiles.open(tmp_path)
    assert w.shapes == {"layers.0.w": (2, 3), "layers.1.w": (2, 3)} and w.layer_count() == 2
    w.check({"layers.0.w": (2, 3), "layers.1.w": (2, 3)})
    assert torch.equal(w.tensors(torch.float64, torch.device("cpu"))["layers.1.w"],
                       torch.ones(2, 3, dtype=torch.float64))


def test_a_link_inside_the_directory_or_into_the_hub_cache_is_read(tmp_path):
    """Inside: fine. The Hugging Face cache links ``snapshots/<rev>/f`` to ``blobs/<hash>``."""
    (tmp_path / "real").mkdir()
    save_file(TENSORS, tmp_path / "real" / "weights.bin.safetensors")
    os.symlink(tmp_path / "real" / "weights.bin.safetensors", tmp_path / "real" / "model.safetensors")
    assert WeightFiles.open(tmp_path / "real").layer_count() == 2
    repo = tmp_path / "models--org--name"
    (repo / "blobs").mkdir(parents=True)
    (repo / "snapshots" / "abc123").mkdir(parents=True)
    save_file(TENSORS, repo / "blobs" / "0f1e2d")
    os.symlink("../../blobs/0f1e2d", repo / "snapshots" / "abc123" / "model.safetensors")
    assert WeightFiles.open(repo / "snapshots" / "abc123").layer_count() == 2


def test_a_link_elsewhere_is_refused(tmp_path):
    (tmp_path / "m").mkdir()
    save_file(TENSORS, tmp_path / "elsewhere.safetensors")
    os.symlink(tmp_path / "elsewhere.safetensors", tmp_path / "m" / "model.safetensors")
    with pytest.raises(QkvError, match=r"model.safetensors is a symbolic link to .*elsewhere.safetensors, "
                                       r"outside .*m; a checkpoint's weights are read only from its own"):
        WeightFiles.open(tmp_path / "m")


def test_a_manifest_reads_only_what_it_lists(tmp_path):
    save_file(TENSORS, tmp_path / "model.safetensors")
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {n: "model-1.safetensors" for n in TENSORS}}))
    save_file(TENSORS, tmp_path / "model-1.safetensors")
    listed = {"model.safetensors.index.json": "0" * 64}  # a stray model.safetensors is not read
    with pytest.raises(QkvError, match=r"names 'model-1.safetensors', which config.json does not list"):
        WeightFiles.open(tmp_path, listed=listed)


@pytest.mark.parametrize("dtype, ok", [(torch.int8, False), (torch.bfloat16, True)])
def test_only_floating_point_weights(tmp_path, dtype, ok):
    save_file({"w": torch.zeros(2, dtype=dtype)}, tmp_path / "model.safetensors")
    w = WeightFiles.open(tmp_path)
    if ok:
        w.check({"w": (2,)})
        assert w.stored_dtype() == dtype
    else:
        with pytest.raises(QkvError, match=r"tensor 'w' has dtype I8; qkv reads floating-point weights"):
            w.check({"w": (2,)})


def test_names_and_shapes_against_what_the_config_implies(tmp_path):
    save_file(TENSORS, tmp_path / "model.safetensors")
    w = WeightFiles.open(tmp_path)
    with pytest.raises(QkvError, match=r"unexpected tensor 'layers.1.w'"):
        w.check({"layers.0.w": (2, 3)})
    with pytest.raises(QkvError, match=r"missing tensor 'layers.2.w'"):
        w.check(TENSORS_SHAPES | {"layers.2.w": (2, 3)})
    with pytest.raises(QkvError, match=r"tensor 'layers.0.w' has shape \(2, 3\) but config.json implies \(3, 2\)"):
        w.check({"layers.0.w": (3, 2), "layers.1.w": (2, 3)})
    with pytest.raises(QkvError, match=r"num_hidden_layers is 3 but .*model.safetensors holds 2 layers \(0–1\)"):
        w.check_layers(3, "num_hidden_layers", "config.json")
    w.check_layers(1, "encoder_layers", "config.json", at_most=True)  # one of two stacks


TENSORS_SHAPES = {n: tuple(t.shape) for n, t in TENSORS.items()}
