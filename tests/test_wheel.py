"""``pip install .`` (a wheel, not editable) ships everything qkv reads at run time (issue 40):
the kernel's C++ source (``document()`` hashed it: FileNotFoundError before), the viewer's pages,
the shipped models. The wheel is built offline from a copy of the tree (the repository gets no
build/ or egg-info), installed with ``--target`` into a temporary directory, and a fresh
interpreter that imports qkv from there (checked) runs the main paths. torch and the other
dependencies come from the running environment, as they would from an installed one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHILD = r"""
import subprocess, sys
from pathlib import Path
import qkv, qkv.explain
site = Path(sys.argv[1]).resolve()
assert Path(qkv.__file__).resolve().is_relative_to(site), qkv.__file__  # the installed copy
from qkv.attention.kernels import build
assert build.SOURCE.is_file(), build.SOURCE
built = subprocess.run([sys.executable, '-m', 'qkv.attention.kernels.build'], capture_output=True,
                       text=True)
assert built.returncode == 0 and built.stdout.startswith(('qkv kernels:', 'note:')), built
print('build:', built.stdout.strip().splitlines()[-1][:60])
from qkv.view import page
files = page.static_files()
wanted = {page.FRAME, page.SHARED_SCRIPT} | {n for p in page.PAGES.values() for n in (p.body, p.script, *p.styles)}
assert wanted <= set(files), sorted(wanted - set(files))
assert '<html' in page.page_html().lower()
reader = qkv.load('reader')
doc = qkv.explain.document(reader, 'the cat sat on the mat. ' * 40)
print('document:', type(doc).__name__)
lm = qkv.load('lm')
print('lm:', qkv.explain.explain(lm, 'baka bela dima').__class__.__name__)
translate = qkv.load('translate')
print('translate:', type(translate).__name__)
"""


def test_the_wheel_ships_what_qkv_reads_at_run_time(tmp_path):
    tree = tmp_path / "tree"
    tree.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, tree / name)
    shutil.copytree(REPO / "src", tree / "src", ignore=shutil.ignore_patterns(
        "__pycache__", "*.egg-info", "*.so"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    subprocess.run([*pip, "wheel", str(tree), "--no-deps", "--no-build-isolation", "--no-index",
                    "-w", str(tmp_path / "dist")], check=True, capture_output=True, cwd=tmp_path)
    wheel, = (tmp_path / "dist").glob("qkv-*.whl")
    site = tmp_path / "site"
    subprocess.run([*pip, "install", "--no-deps", "--no-index", "--target", str(site), str(wheel)],
                   check=True, capture_output=True, cwd=tmp_path)
    env = {**os.environ, "PYTHONPATH": str(site)}  # the installed copy first; not the repository's src
    proc = subprocess.run([sys.executable, "-c", CHILD, str(site)], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [x.split(":")[0] for x in proc.stdout.splitlines()] == [
        "build", "document", "lm", "translate"], proc.stdout
