"""Through a real process, with a timeout (issue 23): a closed stdout, an unwritable --out or
--plot (refused before training starts), a nested or FIFO config.json, a --html/--png that is a
link or a device. Each ends in one ``qkv: error:`` line and exit 2, or writes where a shell would."""

import os
import shutil
import subprocess
import sys
from importlib import resources

import pytest

import qkv as _qkv

LM = str(resources.files("qkv") / "data" / "lm")
TIMEOUT = 120


# this qkv, whatever the working directory and however PYTHONPATH was spelled
SRC = os.path.dirname(os.path.dirname(os.path.abspath(_qkv.__file__)))
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}


def qkv(*args, **kw):
    return subprocess.run([sys.executable, "-m", "qkv", *args], capture_output=True, text=True,
                          timeout=TIMEOUT, env=ENV, **kw)


def one_error_line(result, *fragments):
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("qkv: error: "), result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    for f in fragments:
        assert f in lines[0], lines[0]


@pytest.mark.parametrize("argv", [["explain", "the cat"], ["walkthrough", "a", "b"], ["--version"],
                                  ["translate", "the cat is red"]])
def test_a_closed_stdout_is_one_error_line(argv):
    r = subprocess.run([sys.executable, "-m", "qkv", *argv], stdout=None, stderr=subprocess.PIPE,
                       text=True, timeout=TIMEOUT, env=ENV, preexec_fn=lambda: os.close(1))
    one_error_line(r, "standard output is closed")


def test_a_closed_stderr_sends_nothing_to_stdout():
    r = subprocess.run([sys.executable, "-m", "qkv", "explain", "--top", "-3", "x"],
                       stdout=subprocess.PIPE, text=True, timeout=TIMEOUT, env=ENV,
                       preexec_fn=lambda: os.close(2))
    assert r.returncode == 2 and r.stdout == ""


@pytest.mark.parametrize("command", ["lm", "translate"])
def test_an_unwritable_out_is_refused_before_training(tmp_path, command):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    for out in ["/proc/qkv-cannot/run", str(blocker / "run")]:
        r = qkv("train", command, "--out", out, "--steps", "1000000")  # would train for hours
        one_error_line(r, "--out")


def test_an_unwritable_plot_is_refused_before_training(tmp_path):
    r = qkv("train", "lm", "--out", str(tmp_path / "run"), "--steps", "1000000",
            "--plot", "/proc/qkv-cannot/curves.png")
    one_error_line(r, "--plot", "cannot be written")
    assert not (tmp_path / "run" / "config.json").exists()


@pytest.fixture
def lm_copy(tmp_path):
    d = tmp_path / "lm"
    shutil.copytree(LM, d)
    return d


@pytest.mark.parametrize("argv", [["explain", "baka bala", "--model"], ["heads", "baka bala", "--to", "bala", "--model"],
                                  ["translate", "the cat", "--model"],
                                  ["train", "lm", "--steps", "5", "--resume", "--out"]])
def test_a_nested_or_fifo_config_json_is_one_error_line(lm_copy, argv):
    config = lm_copy / "config.json"
    config.write_text('{"model_type": "llama", "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    one_error_line(qkv(*argv, str(lm_copy)), "config.json")
    config.unlink()
    os.mkfifo(config)
    one_error_line(qkv(*argv, str(lm_copy)), "config.json")


def test_png_to_a_link_writes_the_file_it_points_to(tmp_path):
    png_link = tmp_path / "map.png"
    png_link.symlink_to(tmp_path / "real.png")
    r = qkv("explain", "the cat", "--layer", "0", "--head", "0", "--png", str(png_link))
    assert r.returncode == 0, r.stderr
    assert png_link.is_symlink() and (tmp_path / "real.png").read_bytes()[:4] == b"\x89PNG"


def test_translate_says_when_input_is_outside_what_the_model_knows():
    r = qkv("translate", "the")
    assert r.returncode == 0 and r.stdout.strip()  # the guess is still printed …
    assert r.stderr.count("\n") == 1 and "outside the grammar" in r.stderr  # … and called one
    r = qkv("translate", input="the cat is red\n\ufeffthe cat is red\nthe cat\u2028the dog\nthe " + "z" * 1_000_000 + "\n")
    out = r.stdout.split("\n")
    assert out[:4] == ["le chat est rouge", "le chat est rouge", "", ""], out[:4]
    assert "U+2028" in r.stderr and len(r.stderr) < 2000 and r.returncode == 2


def test_explain_refuses_text_the_model_cannot_see():
    one_error_line(qkv("explain", "the cat sat on the mat", "--model", "lm"), "unknown to", "<unk>")
    one_error_line(qkv("explain", "\u200b\u200d\x07"), "the text is empty")


@pytest.mark.parametrize("argv, fragments", [
    (["translate", "--model", "lm", "the cat"], ["'lm' is not a translation model"]),
    (["train", "lm", "--resume", "--steps", "5", "--out", str(resources.files("qkv") / "data" / "translate")],
     ["is not a run of qkv train lm", "qkv-translation"]),
    (["translate", "--vocab", "the cat"], ["--vocab", "no TEXT"]),
    (["explain", "the cat sat", "--layer", "0", "--head", "1", "--to", "cat"], ["--top and --to"]),
    (["explain", "the cat sat", "--layer", "0", "--head", "1", "--top", "5"], ["--top and --to"]),
    (["explain", "the cat sat", "--layer", "0", "--head", "1", "--top", "3"], ["--top and --to"]),  # the default, given
    (["explain", "the cat is red", "--model", "translate", "--words"], ["--words"]),
])
def test_an_option_that_would_be_ignored_or_misnamed_is_one_clear_line(argv, fragments):
    one_error_line(qkv(*argv), *fragments)


def test_heads_json_honours_top():
    import json

    args = ["heads", "the cat sat on the mat", "--to", "cat", "--json"]
    every, three = json.loads(qkv(*args).stdout), json.loads(qkv(*args, "--top", "3").stdout)
    assert len(every) == 72 and three == every[:3]
