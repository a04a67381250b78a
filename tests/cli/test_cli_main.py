"""The CLI entry point: help, version, and user errors as one line with exit code 2."""

import subprocess
import sys

from qkv.cli import main


def test_no_command_prints_help_and_fails(capsys):
    assert main([]) == 2
    assert "usage: qkv" in capsys.readouterr().out


def test_walkthrough_runs(capsys):
    assert main(["walkthrough", "let's", "go"]) == 0
    out = capsys.readouterr().out
    assert "Query of 'go'" in out and "weights sum to 1.000000" in out


def test_user_error_is_one_line_exit_2():
    r = subprocess.run([sys.executable, "-m", "qkv", "walkthrough", "a", "b", "--token", "zz"],
                       capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr.strip() == "qkv: error: --token 'zz' is not one of the tokens ['a', 'b']"
    assert "Traceback" not in r.stderr


def test_version():
    r = subprocess.run([sys.executable, "-m", "qkv", "--version"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("qkv ")
