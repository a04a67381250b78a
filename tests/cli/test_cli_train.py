"""``qkv train translate``'s run-directory rules from the command line (issue 9)."""

from __future__ import annotations

from qkv.cli import main

TINY = ["--steps", "2", "--d-model", "16", "--num-heads", "2", "--encoder-layers", "1",
        "--decoder-layers", "1", "--ff-dim", "32", "--eval-size", "5", "--quiet"]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_out_naming_a_file_is_refused_before_training(capsys, tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    code, _, err = run(capsys, "train", "translate", "--out", str(tmp_path / "notes.txt"), *TINY)
    assert code == 2 and err == f"qkv: error: --out '{tmp_path / 'notes.txt'}' is a file, not a directory\n"
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_a_stale_run_directory_needs_force(capsys, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "tokenizer_en.json").write_text("{}")  # what a run killed in its first save leaves
    (out / ".config.json.0123456789ab.tmp").write_text("{")
    code, _, err = run(capsys, "train", "translate", "--out", str(out), *TINY)
    assert code == 2 and "is not empty; pass --resume to continue it, --force" in err
    code, stdout, _ = run(capsys, "train", "translate", "--out", str(out), "--force", *TINY)
    assert code == 0 and "trained to step 2" in stdout
    assert not list(out.glob(".*.tmp"))
