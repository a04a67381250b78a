"""qkv.training.checkpoint: the manifest lists every file with its sha256; reads are checked."""

from __future__ import annotations

import json

import pytest
import torch

from qkv.errors import QkvError
from qkv.training.checkpoint import (
    check_out_dir, get_field, load_tensors, prepare_out_dir, read_listed, read_manifest,
    remove_stale_temporaries, save_tensors_writer, sha256_bytes, write_checkpoint,
)


@pytest.fixture
def ckpt(tmp_path):
    d = tmp_path / "ckpt"
    write_checkpoint(d, {"a.txt": b"alpha", "w-1.safetensors": save_tensors_writer({"x": torch.ones(3)})},
                     {"step": 1}, kinds=("w-*.safetensors",))
    return d


def test_every_file_is_listed_with_its_sha256(ckpt):
    manifest = read_manifest(ckpt)
    assert manifest["step"] == 1
    assert manifest["files"]["a.txt"] == sha256_bytes(b"alpha")
    assert set(manifest["files"]) == {"a.txt", "w-1.safetensors"}
    assert read_listed(ckpt, manifest, "a.txt") == b"alpha"
    assert torch.equal(load_tensors(ckpt, manifest, "w-1.safetensors")["x"], torch.ones(3))


def test_a_new_save_deletes_the_files_it_no_longer_lists(ckpt):
    (ckpt / "notes.md").write_text("mine")  # not one of the checkpoint's kinds: left alone
    write_checkpoint(ckpt, {"w-2.safetensors": save_tensors_writer({"x": torch.zeros(2)})},
                     {"step": 2}, kinds=("w-*.safetensors",))
    assert sorted(p.name for p in ckpt.iterdir()) == ["a.txt", "config.json", "notes.md", "w-2.safetensors"]


def test_unlisted_tampered_and_escaping_files_are_refused(ckpt, tmp_path):
    manifest = read_manifest(ckpt)
    (ckpt / "extra.txt").write_text("stale")
    with pytest.raises(QkvError, match="'extra.txt' is not listed with a sha256"):
        read_listed(ckpt, manifest, "extra.txt")
    (ckpt / "a.txt").write_bytes(b"alphb")
    with pytest.raises(QkvError, match="does not match its sha256"):
        read_listed(ckpt, manifest, "a.txt")
    for name in ("../a.txt", str(tmp_path / "a.txt"), "..", ".config.json.tmp"):
        with pytest.raises(QkvError, match="not a plain file name"):
            read_listed(ckpt, {"files": {name: "0" * 64}}, name)
    (ckpt / "link.txt").symlink_to(tmp_path / "elsewhere.txt")
    (tmp_path / "elsewhere.txt").write_bytes(b"alpha")
    with pytest.raises(QkvError, match="link.txt: a symbolic link"):
        read_listed(ckpt, {"files": {"link.txt": sha256_bytes(b"alpha")}}, "link.txt")


def test_manifest_checks(ckpt):
    (ckpt / "config.json").write_text(json.dumps({"files": {"a.txt": None}}))
    with pytest.raises(QkvError, match="no valid sha256 recorded for 'a.txt'"):
        read_manifest(ckpt)
    (ckpt / "config.json").write_text("[1]")
    with pytest.raises(QkvError, match="must hold a JSON object, got list"):
        read_manifest(ckpt)
    (ckpt / "config.json").write_bytes(b"\xff")
    with pytest.raises(QkvError, match="not valid (JSON|UTF-8)"):
        read_manifest(ckpt)


@pytest.mark.parametrize("value, message", [("abc", "must be int, got 'abc'"), (True, "must be int"),
                                            (-1, "must be >= 0")])
def test_typed_fields(value, message):
    with pytest.raises(QkvError, match=message):
        get_field({"step": value}, "step", int, "config.json", minimum=0)
    assert get_field({"lr": 1}, "lr", float, "c") == 1.0
    with pytest.raises(QkvError, match="must be float, got nan"):
        get_field({"lr": float("nan")}, "lr", float, "c")


def test_out_dir_checks(tmp_path):
    with pytest.raises(QkvError, match="--out must name a directory, got an empty string"):
        check_out_dir("")
    (tmp_path / "f").write_text("x")
    with pytest.raises(QkvError, match="is a file, not a directory"):
        check_out_dir(tmp_path / "f")
    with pytest.raises(QkvError, match="is a file, not a directory"):
        check_out_dir(tmp_path / "f" / "sub")
    run = tmp_path / "run"
    run.mkdir()
    (run / ".model-1.safetensors.0123456789ab.tmp").write_bytes(b"half")
    assert prepare_out_dir(run, resume=False, force=False, kinds=()) == run  # only a stale .tmp: empty
    assert not list(run.iterdir())
    (run / "tokenizer_en.json").write_text("{}")
    (run / "keep.txt").write_text("mine")
    with pytest.raises(QkvError, match="is not empty; pass --resume"):
        prepare_out_dir(run, resume=False, force=False, kinds=("tokenizer_*.json",))
    prepare_out_dir(run, resume=False, force=True, kinds=("tokenizer_*.json",))
    assert [p.name for p in run.iterdir()] == ["keep.txt"]
    with pytest.raises(QkvError, match="holds no checkpoint to continue"):
        prepare_out_dir(run, resume=True, force=False, kinds=())


def test_remove_stale_temporaries_keeps_other_files(tmp_path):
    (tmp_path / ".config.json.a1b2c3d4e5f6.tmp").write_text("x")
    (tmp_path / "model.tmp").write_text("not ours")
    assert remove_stale_temporaries(tmp_path) == [".config.json.a1b2c3d4e5f6.tmp"]
    assert [p.name for p in tmp_path.iterdir()] == ["model.tmp"]
