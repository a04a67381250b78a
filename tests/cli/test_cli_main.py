"""The CLI entry point: help, version, and user errors as one line with exit code 2."""

import subprocess
import sys

from qkv.cli import main


def test_a_group_without_its_command_is_one_error_line(capsys):
    for argv, prog in [([], "qkv"), (["train"], "qkv train")]:
        assert main(argv) == 2
        captured = capsys.readouterr()
        assert captured.out == ""
        assert captured.err.count("\n") == 1 and captured.err.startswith(f"qkv: error: {prog} needs a command: ")


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


def test_the_console_script_is_what_activating_the_venv_puts_on_the_path(tmp_path):
    """README: after ``make demo``, ``. .venv/bin/activate`` puts ``qkv`` on the PATH. That is the
    console script pip installed beside this interpreter; run it the way the shell would, by name
    from a PATH holding only that directory (the venv's bin/, as ``activate`` sets it first)."""
    from pathlib import Path

    bin_dir = Path(sys.executable).parent
    assert (bin_dir / "activate").is_file() or sys.prefix == sys.base_prefix  # a venv, as make setup makes
    r = subprocess.run(["qkv", "--version"], capture_output=True, text=True, cwd=tmp_path,
                       env={"PATH": str(bin_dir), "HOME": str(tmp_path)})
    assert r.returncode == 0 and r.stdout.startswith("qkv "), r.stderr
