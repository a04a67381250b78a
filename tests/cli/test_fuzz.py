"""Property: no command line makes qkv crash (hypothesis; tests/cli_fuzzing.py builds them).

For every command found in the parser: random argument lists (wrong types, extremes, Unicode,
invalid bytes, missing and unknown arguments) end with exit code 0 or 2, no traceback, at most
one ``qkv: error:`` line, and nothing written outside the temporary working directory. The
normal suite tries :data:`EXAMPLES` lists per command (about 40 s on one thread); the long run is
``benchmarks/fuzz_cli.py``. A few cases run the real entry point (``python -m qkv``) in a
subprocess, where argv really is bytes and stdout a real file.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_fuzzing import (
    PARSE_ONLY, argv_for, check_result, closed_stdout_argvs, commands, make_hostile_files, run_cli,
    run_with_stdout_closed,
)
from hypothesis import HealthCheck, given, settings

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = 25  # per command; the benchmark's long run tries thousands

COMMANDS = commands()


def test_every_command_is_fuzzed_or_says_why_not():
    names = {c.words for c in COMMANDS}
    assert {("explain",), ("heads",), ("translate",), ("walkthrough",), ("softmax-demo",)} <= names
    assert set(PARSE_ONLY) <= names, "PARSE_ONLY names a command that no longer exists"
    assert all(reason for reason in PARSE_ONLY.values())


def _repo_listing() -> set[str]:
    """Top-level entries of the repository and of the places a command writes by default."""
    out = set(os.listdir(REPO))
    # Other test processes (xdist workers) may create caches meanwhile: .hypothesis, __pycache__.
    out = {name for name in out if not name.startswith((".", "__pycache__"))}
    for sub in ("runs", "src/qkv/data"):
        if (REPO / sub).is_dir():
            out |= {f"{sub}/{name}" for name in os.listdir(REPO / sub)}
    return out


@pytest.fixture(scope="module")
def in_tmp_cwd(tmp_path_factory):
    """Run in an empty directory; afterwards nothing new may exist beside the repository's files."""
    before = _repo_listing()
    cwd = os.getcwd()
    tmp = tmp_path_factory.mktemp("fuzz_cwd")
    make_hostile_files(tmp)  # links, a FIFO config.json, a nested one: names the fuzz draws
    os.chdir(tmp)
    yield tmp
    os.chdir(cwd)
    new = _repo_listing() - before
    assert not new, f"the CLI wrote into the repository: {sorted(new)}"


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.name.replace(" ", "-"))
def test_random_command_lines_never_crash(command, in_tmp_cwd):
    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(argv=argv_for(command))
    def run(argv):
        check_result(run_cli(argv, parse_only=command.parse_only))

    run()
    leftovers = [p for p in Path(in_tmp_cwd).rglob("*.tmp")]
    assert not leftovers, leftovers  # atomic writes leave no temporary files behind


# -- the real entry point --------------------------------------------------------------------------
def qkv(*argv, stdin: bytes = b"", stdout=subprocess.PIPE, cwd=None):
    env = {**os.environ, "PYTHONIOENCODING": ""}
    return subprocess.run([sys.executable, "-m", "qkv", *argv], input=stdin, stdout=stdout,
                          stderr=subprocess.PIPE, cwd=cwd, env=env, timeout=300)


def test_invalid_utf8_in_argv_is_one_line(tmp_path):
    r = qkv(b"explain", b"the cat \xff is red", cwd=tmp_path)
    assert r.returncode == 2 and r.stdout == b""
    assert r.stderr == b"qkv: error: the text is not valid UTF-8 (byte 0xff at position 8)\n"


def test_threads_100000_is_refused_not_a_segfault(tmp_path):
    r = qkv("translate", "the cat is red", "--threads", "100000", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.startswith(b"qkv: error: --threads must be at most ")
    assert r.stderr.count(b"\n") == 1


def test_stdout_on_a_full_device_is_one_line(tmp_path):
    with open("/dev/full", "wb") as full:
        r = qkv("walkthrough", stdout=full, cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr == b"qkv: error: cannot write the output: No space left on device\n"


def test_a_latin1_file_on_translate_stdin(tmp_path):
    r = qkv("translate", stdin="the cat is red\nthe café is red\nthe dog is red\n".encode("latin-1"),
            cwd=tmp_path)
    assert r.returncode == 2 and r.stdout == b"le chat est rouge\n\nle chien est rouge\n"
    assert r.stderr.splitlines() == [
        b"qkv: line 2 is not valid UTF-8 (byte 0xe9 at position 7); its output line is empty",
        b"qkv: error: 1 of 3 lines not translated (line 2); their output lines are empty"]



@pytest.mark.parametrize("argv", closed_stdout_argvs(), ids=lambda a: "-".join(a[:2]) or "qkv")
def test_every_command_with_stdout_closed_is_one_error_line(argv):
    r = run_with_stdout_closed(argv)
    check_result(r)
    assert r.code == 2 and r.err.startswith("qkv: error: standard output is closed"), r.err
