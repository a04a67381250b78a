"""The shipped checkpoint: small, made by qkv's own command, and ≥ 98% exact on the test split."""

from __future__ import annotations

import shlex

import pytest
import torch

from qkv.translate.checkpoint import default_model_dir, load_checkpoint
from qkv.translate.report import render_report, test_report

test_report.__test__ = False  # a library function whose name starts with "test", not a test


@pytest.fixture(scope="module")
def report():
    return test_report(load_checkpoint("translate"))


def test_shipped_checkpoint_is_small_and_says_how_it_was_made():
    directory = default_model_dir()
    size = sum(p.stat().st_size for p in directory.iterdir())
    assert size <= 5 * 1024 * 1024, size
    ckpt = load_checkpoint("translate")
    command = shlex.split(ckpt.meta["command"])
    assert command[:3] == ["qkv", "train", "translate"] and "--slim" in command
    assert ckpt.meta["optimizer"] is None  # --slim: weights only
    assert ckpt.step == ckpt.meta["train"]["steps"]


def test_shipped_model_is_at_least_98_percent_exact_seen_and_unseen(report):
    parts = report["splits"]
    assert parts["seen"]["sentences"] == parts["unseen"]["sentences"] == 1000
    for name in ("seen", "unseen", "all"):
        assert parts[name]["exact_match"] >= 0.98, (name, report["errors"])
        assert parts[name]["bleu"] >= 95.0, name


def test_alignment_report(report):
    heads = torch.tensor(report["alignment"]["heads"], dtype=torch.float64)  # (layers, heads)
    best = report["alignment"]["best"]
    assert heads.shape == (3, 4)
    assert heads.max().item() == best["accuracy"] == heads[best["layer"], best["head"]].item()
    assert best["accuracy"] > 0.5  # some head aligns far above chance (~1/9 of the English)


def test_render_report(report, tmp_path):
    path = tmp_path / "out.txt"
    with open(path, "w") as f:
        render_report(report, file=f)
    text = path.read_text()
    assert "held-out combinations" in text and "best head: L" in text
