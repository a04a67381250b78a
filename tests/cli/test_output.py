"""What the CLI writes: plots with the permissions any new file gets, overwritten files keeping
theirs (issue 9: plots were 0600); a failed stdout write is one line (tests/cli/test_fuzz.py runs
the real ``> /dev/full``)."""

import io
import os
import stat
import sys

import pytest

from qkv.cli import main
from qkv.cli.output import finish_output, print_json


@pytest.fixture
def umask_022():
    saved = os.umask(0o022)
    yield
    os.umask(saved)


def test_a_plot_gets_normal_permissions_and_keeps_an_old_files(tmp_path, capsys, umask_022):
    new, old = tmp_path / "new.png", tmp_path / "old.png"
    assert main(["explain", "the cat sat", "--png", str(new)]) == 0
    assert stat.S_IMODE(new.stat().st_mode) == 0o644
    old.write_bytes(b"x")
    old.chmod(0o640)
    assert main(["explain", "the cat sat", "--png", str(old)]) == 0
    assert stat.S_IMODE(old.stat().st_mode) == 0o640 and old.read_bytes()[:4] == b"\x89PNG"
    assert sorted(os.listdir(tmp_path)) == ["new.png", "old.png"]  # no temporary file left
    capsys.readouterr()


class FullStdout(io.StringIO):
    def flush(self):
        raise OSError(28, "No space left on device")


def test_a_failed_flush_is_one_error_line(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdout", FullStdout())
    assert finish_output(0) == 2
    assert capsys.readouterr().err == "qkv: error: cannot write the output: No space left on device\n"


def test_print_json_writes_nothing_for_nan(capsys):
    with pytest.raises(ValueError, match="non-finite number at \\[2\\]"):
        print_json([1.0, 2.0, float("inf")])
    assert capsys.readouterr().out == ""
