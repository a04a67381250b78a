"""Progress on stderr (issue 32: long work was silent): every command that can take more than
a few seconds draws bars when stderr is a terminal — here a real pseudo-terminal — and nothing
in a pipe, a log or under ``--json``, where only the command's own lines go."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pty
import struct
import sys
import termios
import threading

import pytest

from qkv.cli import main

TEXT = "the cat sat on the mat"
BAR = "━"  # rich's bar (and only a drawn bar has it)


@contextlib.contextmanager
def stderr_on_a_terminal():
    """sys.stderr on a pseudo-terminal for the block; yields a list that holds, after it, what
    the terminal received (read by a thread, so a full pty buffer never blocks the command)."""
    master, slave = pty.openpty()
    # 24 rows × 100 columns, as a terminal window has (a new pty is 0 × 0: tqdm draws nothing)
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    received: list[str] = []
    chunks: list[bytes] = []

    def read() -> None:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the slave side is closed: nothing more to read
                return
            if not chunk:
                return
            chunks.append(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    saved = sys.stderr
    sys.stderr = open(slave, "w", encoding="utf-8", closefd=True)
    try:
        yield received
    finally:
        sys.stderr.close()
        sys.stderr = saved
        reader.join(timeout=10)
        os.close(master)
        received.append(b"".join(chunks).decode("utf-8", errors="replace"))


def on_a_terminal(argv: list[str]) -> tuple[int, str]:
    """(exit code, what stderr's terminal received) for ``qkv argv``."""
    with stderr_on_a_terminal() as received:
        code = main(argv)
    return code, received[0]


def test_the_terminal_helper_is_a_terminal():
    from rich.console import Console

    with stderr_on_a_terminal() as received:
        assert sys.stderr.isatty() and Console(stderr=True).is_terminal
        print("hello", file=sys.stderr, flush=True)
    assert "hello" in received[0]


def test_the_rule_terminal_and_not_json():
    from qkv.cli.progress import drawn

    assert not drawn()  # stderr is pytest's capture
    with stderr_on_a_terminal():
        assert drawn() and not drawn(False)


def test_view_html_draws_a_bar_on_a_terminal_only(tmp_path, capsys):
    code, drawn = on_a_terminal(["view", TEXT, "--html", str(tmp_path / "a.html")])
    assert code == 0 and "page" in drawn and "sentences" in drawn and BAR in drawn, drawn  # coref: the probe
    assert "wrote" in capsys.readouterr().out
    assert main(["view", TEXT, "--html", str(tmp_path / "b.html")]) == 0  # stderr: pytest's capture
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("argv, stages", [
    (["heads", "--probe", "coref", "--top", "1"], ["sentences"]),
    (["explain", TEXT, "--token", "sat", "--compare", "--top", "1"], ["methods"]),
    (["evaluate"], ["translating", "aligning"]),
], ids=["heads-probe", "explain-compare", "evaluate"])
def test_long_commands_draw_their_stages_on_a_terminal(argv, stages, capsys):
    code, drawn = on_a_terminal(argv)
    assert code == 0 and BAR in drawn and all(stage in drawn for stage in stages), drawn
    assert capsys.readouterr().out  # the command's own output, on stdout as ever


def test_json_draws_nothing_even_on_a_terminal(capsys):
    code, drawn = on_a_terminal(["heads", "--probe", "coref", "--json"])
    assert code == 0 and drawn == "", drawn
    assert json.loads(capsys.readouterr().out)[0]["n"] == 49  # every coref sentence


def test_training_draws_its_bar_on_a_terminal_only(tmp_path, capsys):
    tiny = ["--steps", "2", "--d-model", "32", "--num-heads", "2", "--ff-dim", "64", "--seq-len",
            "32", "--min-span", "2", "--max-span", "8", "--batch-size", "4", "--eval-size", "4",
            "--probe-size", "2"]
    code, drawn = on_a_terminal(["train", "lm", "--out", str(tmp_path / "a"), *tiny])
    assert code == 0 and "2/2" in drawn, drawn
    code, drawn = on_a_terminal(["train", "lm", "--out", str(tmp_path / "b"), *tiny, "--quiet"])
    assert code == 0 and "2/2" not in drawn and "step 2:" in drawn, drawn  # the evaluation line stays
    capsys.readouterr()
    assert main(["train", "lm", "--out", str(tmp_path / "c"), *tiny]) == 0  # in a pipe or a log
    err = capsys.readouterr().err
    assert "2/2" not in err and "step 2:" in err, err
