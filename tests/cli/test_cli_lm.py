"""``qkv train lm`` and ``qkv heads --probe induction|previous-token`` from the command line."""

from __future__ import annotations

import json

import pytest

from qkv.cli import main

TINY = ["--d-model", "32", "--num-heads", "2", "--ff-dim", "64", "--seq-len", "32", "--min-span", "2",
        "--max-span", "8", "--batch-size", "4", "--eval-size", "4", "--probe-size", "2", "--quiet"]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_train_lm_then_probe_its_heads(capsys, tmp_path):
    out = str(tmp_path / "lm")
    code, stdout, _ = run(capsys, "train", "lm", "--out", out, "--steps", "3", *TINY,
                          "--plot", str(tmp_path / "curves.png"))
    assert code == 0 and "trained to step 3" in stdout and "best induction head" in stdout
    assert (tmp_path / "curves.png").stat().st_size > 1000
    meta = json.loads((tmp_path / "lm" / "config.json").read_text())
    assert meta["qkv_training"]["command"].startswith(f"qkv train lm --out {out} --threads 1")
    code, stdout, _ = run(capsys, "heads", "--probe", "induction", "--model", out, "--top", "2")
    assert code == 0
    lines = stdout.splitlines()
    assert lines[0].startswith("model: lm · induction probe: 20 sequences of <bos> + 16 random tokens")
    assert lines[2].startswith("chance (uniform attention over itself and every earlier token): 0.0")
    code, stdout, _ = run(capsys, "heads", "--probe", "previous-token", "--model", out, "--json")
    assert code == 0 and len(json.loads(stdout)["heads"]) == 4
    # a second run into the same directory, without --resume or --force
    code, _, err = run(capsys, "train", "lm", "--out", out, "--steps", "3", *TINY)
    assert code == 2 and "already holds a checkpoint; pass --resume" in err
    code, stdout, _ = run(capsys, "train", "lm", "--out", out, "--resume", "--steps", "4", "--quiet")
    assert code == 0 and "trained to step 4" in stdout


@pytest.mark.parametrize("argv, message", [
    (["--out", ""], "--out must not be empty"),
    (["--lr", "inf"], "--lr must be a finite number"),
    (["--plot", "curves.txt"], "--plot 'curves.txt': give a .png or .svg file name"),
    (["--batch-size", str(10**8)], "--batch-size must be at most"),
])
def test_bad_options_are_refused_up_front(capsys, tmp_path, argv, message):
    code, _, err = run(capsys, "train", "lm", "--out", str(tmp_path / "x"), *argv)
    assert code == 2 and message in err and err.count("\n") == 1
    assert not (tmp_path / "x").exists()
