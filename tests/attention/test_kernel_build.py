"""The kernel's library is verified before it is mapped (:mod:`qkv.attention.kernels.build`,
issue 40): a truncated, empty or corrupt file, or a directory under its name, is one warning line
and the pure-torch path at run time (never a SIGBUS), and ``build`` checks an existing library in
a child process and builds it again when the check fails.

Each case copies (part of) the real library into a temporary directory that a fresh interpreter
takes as the kernels' directory (``build.build_dir``), so a fault kills only that interpreter.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from qkv.attention import kernels
from qkv.attention.kernels import build

pytestmark = pytest.mark.skipif(
    kernels.load() is None,
    reason="qkv's C++ kernel is not built here (make setup builds it: python -m qkv.attention.kernels.build)")

SRC = Path(__file__).resolve().parents[2] / "src"

# The child: for each kernels' directory in argv[2:], load the library there and run a window
# through the blockwise backend (the kernel's place), and print what answered; or build there.
CHILD = """
import sys
from pathlib import Path
from qkv.attention.kernels import build
import torch, qkv
from qkv.attention import kernels
for directory in sys.argv[2:]:
    build.build_dir = lambda: Path(directory)
    if sys.argv[1] == 'build':
        build.build()
        continue
    kernels._state.update(loaded=False, module=None)
    q = torch.randn(1, 2, 128, 16)
    bm = qkv.create_block_mask(qkv.masks.sliding_window(16, 0), None, None, 128, 128)
    out = qkv.scaled_dot_product_attention(q, q, q, block_mask=bm)
    print('kernel' if kernels.load() is not None else 'pure-torch', bool(out.isfinite().all()))
"""


def run_child(*directories: Path, what: str = "load", **env) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(SRC), **env}
    return subprocess.run([sys.executable, "-c", CHILD, what, *map(str, directories)],
                          capture_output=True, text=True, env=env, timeout=600)


def library(tmp_path: Path, make) -> Path:
    real = kernels.load().__file__
    tmp_path.mkdir(exist_ok=True)
    path = tmp_path / Path(build.library_path()).name
    make(path, Path(real).read_bytes())
    return path


BAD = {  # name: how the file under the library's name is made from the real library's bytes
    "truncated to half": lambda p, b: p.write_bytes(b[: len(b) // 2]),
    "truncated to its first page": lambda p, b: p.write_bytes(b[:4096]),
    "empty": lambda p, b: p.write_bytes(b""),
    "random bytes": lambda p, b: p.write_bytes(os.urandom(len(b))),
    "a directory": lambda p, b: p.mkdir(),
}


def test_a_bad_library_is_one_warning_and_the_pure_torch_path(tmp_path):
    paths = [library(tmp_path / str(i), make) for i, make in enumerate(BAD.values())]
    proc = run_child(*(p.parent for p in paths))
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-500:]}"  # -7: SIGBUS
    assert proc.stdout.splitlines() == ["pure-torch True"] * len(BAD), proc.stdout
    warned = [x for x in proc.stderr.splitlines() if "does not load" in x]
    assert len(warned) == len(BAD), proc.stderr  # one line each
    for name, path, line in zip(BAD, paths, warned):
        assert str(path) in line and "python -m qkv.attention.kernels.build" in line, (name, line)
        assert not build.verified(path), name


def test_only_a_file_that_passed_its_check_is_mapped(tmp_path):
    good = library(tmp_path / "unstamped", lambda p, b: p.write_bytes(b))
    cut = library(tmp_path / "cut after its stamp", lambda p, b: p.write_bytes(b))
    assert build.verify(cut) is None and build.verified(cut)  # the real library: checked, stamped
    cut.write_bytes(cut.read_bytes()[: cut.stat().st_size // 2])
    assert not build.verified(cut)  # the stamp holds the bytes that passed, not the name
    proc = run_child(good.parent, cut.parent)
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-500:]}"
    assert proc.stdout.splitlines() == ["kernel True", "pure-torch True"], proc.stdout + proc.stderr
    assert build.verified(good)  # checked once in a child, then stamped: the next process maps it
    assert [x for x in proc.stderr.splitlines() if "does not load" in x] == [
        x for x in proc.stderr.splitlines() if str(cut) in x]


def test_build_checks_an_existing_library_and_builds_a_bad_one_again(tmp_path):
    bad = library(tmp_path / "bad", BAD["truncated to half"])
    good = library(tmp_path / "good", lambda p, b: p.write_bytes(b))
    # CXX=false: a compiler that fails at once, so the test sees the attempt without a 2-minute build
    proc = run_child(bad.parent, good.parent, what="build", CXX="false")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "does not load" in lines[0] and "building it again" in lines[0], lines
    assert lines[1].startswith("qkv kernels: compiling intervals.cpp with false"), lines
    assert lines[2].startswith("note: the C++ kernel did not build"), lines
    assert not bad.exists()  # the bad file is gone, not kept as "already built"
    assert "already built" in lines[3] and build.verified(good), lines
