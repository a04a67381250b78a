"""The documentation site builds with no warning (``mkdocs build --strict``: a broken link, a page
missing from the nav, a docstring mkdocstrings cannot read fail it), so CI's ``make test`` checks
what ``make docs`` builds; and the README's links into docs/ point at pages that exist."""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_site_builds_strict(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]
    assert "WARNING" not in run.stderr, run.stderr[-4000:]
    api = (tmp_path / "site" / "api" / "attention.html").read_text(encoding="utf-8")
    assert "scaled_dot_product_attention" in api and "doc-object" in api  # the reference was generated


def test_the_readme_links_to_pages_that_exist():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\((docs/[^)#]+)", readme)
    assert len(links) >= 9
    for link in links:
        assert (ROOT / link).is_file(), link
