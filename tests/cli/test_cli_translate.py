"""``qkv translate``, ``qkv evaluate`` and ``qkv train translate`` from the command line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from numbers_match import contains_line

from qkv.cli import main
from qkv.translate.checkpoint import default_model_dir

SENTENCE = "the red apple is next to the black cats"
FRENCH = "la pomme rouge est à côté des chats noirs"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_translate_text(capsys):
    assert run(capsys, "translate", SENTENCE) == (0, FRENCH + "\n", "")
    assert run(capsys, "translate", "The bird is next to an orange.", "--beam", "3") == (
        0, "l'oiseau est à côté d'une orange\n", "")


def test_translate_stdin_line_by_line():
    lines = "the cat is red\n\nThe horses are hungry\na tired child sees the green trees\n"
    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}
    proc = subprocess.run([sys.executable, "-m", "qkv", "translate"], input=lines, text=True,
                          capture_output=True, env=env, timeout=300, encoding="utf-8")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n") == ["le chat est rouge", "", "les chevaux sont affamés",
                                       "un enfant fatigué voit les arbres verts", ""]


def test_vocab_lists_the_known_words(capsys):
    code, out, _ = run(capsys, "translate", "--vocab")
    assert code == 0 and "apple" in out.split() and "next" in out.split()


@pytest.mark.parametrize(("argv", "message"), [
    (["translate", "the zebra eats the purple apple"],
     "qkv: error: unknown English words 'zebra', 'purple' in 'the zebra eats the purple apple'"),
    (["translate", "   "], "qkv: error: nothing to translate"),
    (["translate", SENTENCE, "--beam", "0"], "qkv: error: --beam must be at least 1, got 0"),
    (["translate", SENTENCE, "--model", "/nonexistent/dir"],
     "qkv: error: model directory '/nonexistent/dir' does not exist"),
    (["evaluate", "--model", "/nonexistent/dir"],
     "qkv: error: model directory '/nonexistent/dir' does not exist"),
])
def test_bad_input_is_one_clear_line(capsys, argv, message):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.startswith(message) and err.count("\n") == 1, err


def test_stdin_errors_name_the_line(capsys, monkeypatch):
    import io

    monkeypatch.setattr(sys, "stdin", io.StringIO("the cat is red\nthe cat is purple\n"))
    code, out, err = run(capsys, "translate")
    assert code == 2 and out == "le chat est rouge\n\n"  # the failed line's output is empty
    assert err == "qkv: line 2: unknown English word 'purple' in 'the cat is purple'; " \
                  "the model knows 60 words (qkv translate --vocab lists them); its output line " \
                  "is empty\nqkv: error: 1 of 2 lines not translated (line 2); their output " \
                  "lines are empty\n"


def test_other_model_types_and_corrupt_checkpoints(capsys, tmp_path):
    bert = tmp_path / "bert"
    bert.mkdir()
    (bert / "config.json").write_text(json.dumps({"model_type": "bert"}))
    code, _, err = run(capsys, "translate", SENTENCE, "--model", str(bert))
    assert code == 2 and "is not a translation model (config.json has model_type 'bert'" in err

    broken = tmp_path / "broken"
    shutil.copytree(default_model_dir(), broken)
    weights = next(broken.glob("model-*.safetensors"))
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    code, _, err = run(capsys, "translate", SENTENCE, "--model", str(broken))
    assert code == 2 and "corrupt checkpoint" in err and "Traceback" not in err


def test_evaluate_json_and_text(capsys):
    code, out, _ = run(capsys, "evaluate", "--json")
    report = json.loads(out)
    assert code == 0
    assert report["splits"]["seen"]["exact_match"] >= 0.98
    assert report["splits"]["unseen"]["exact_match"] >= 0.98
    assert len(report["alignment"]["heads"]) == 3
    code, text, _ = run(capsys, "evaluate")
    assert code == 0 and text.startswith(f"model: {report['model']} (step {report['step']}) · "
                                         f"test split · greedy\n")
    for key, label in (("seen", "seen combinations"), ("unseen", "held-out combinations"), ("all", "all")):
        part = report["splits"][key]
        assert contains_line(f"{label} {part['sentences']} {part['exact_match']:.2%} "
                             f"{part['bleu']:.2f}", text), key
    for layer, row in enumerate(report["alignment"]["heads"]):
        assert contains_line(f"L{layer} " + " ".join(f"{a:.2%}" for a in row), text)
    best = report["alignment"]["best"]
    assert f"best head: L{best['layer']} H{best['head']} ({best['accuracy']:.2%})" in text


TINY = ["--d-model", "16", "--num-heads", "2", "--encoder-layers", "1", "--decoder-layers", "1",
        "--ff-dim", "32", "--batch-size", "16", "--eval-size", "10", "--quiet"]


def test_train_resume_and_its_errors(capsys, tmp_path):
    out = str(tmp_path / "run")
    code, stdout, _ = run(capsys, "train", "translate", "--out", out, "--steps", "3", *TINY)
    assert code == 0 and "trained to step 3" in stdout
    meta = json.loads((tmp_path / "run" / "config.json").read_text())
    assert meta["command"].startswith(f"qkv train translate --out {out} --threads 1 ")
    assert "--steps 3" in meta["command"] and "--d-model 16" in meta["command"]

    code, _, err = run(capsys, "train", "translate", "--out", out, "--resume", "--steps", "5",
                       "--ff-dim", "64")
    assert code == 2 and err == (f"qkv: error: --resume: {out} was trained with a different "
                                 f"configuration: ff_dim=32 (now 64)\n")
    code, stdout, _ = run(capsys, "train", "translate", "--out", out, "--resume", "--steps", "5", "--quiet")
    assert code == 0 and "trained to step 5" in stdout

    code, _, err = run(capsys, "train", "translate", "--out", out, "--steps", "3", *TINY)
    assert code == 2 and "already holds a checkpoint; pass --resume" in err
    assert main(["train", "translate", "--colour", "red"]) == 2  # argparse's exit, returned
