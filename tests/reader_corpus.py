"""A tiny documentation directory for the reader's tests: a few HTML pages under library/ (training)
and tutorial/ (held out), with the parts the extractor must leave out (code, header links, the
navigation outside the main div)."""

from __future__ import annotations

import random
from pathlib import Path

WORDS = ("the a module function returns value list string object file class method argument "
         "name error type data").split()


def page(title: str, paragraphs: list[str]) -> str:
    body = "".join(f"<p>{p}</p>" for p in paragraphs)
    return (f'<html><body><div class="nav"><p>Navigation</p></div><div class="body" role="main">'
            f'<h1>{title}<a class="headerlink" href="#x">¶</a></h1>{body}'
            f'<div class="highlight"><pre>print("code is left out")</pre></div></div></body></html>')


def write_docs(root: Path, *, pages: int = 3, paragraphs: int = 30, seed: int = 0) -> Path:
    rng = random.Random(seed)

    def para() -> str:
        return " ".join(rng.choice(WORDS) for _ in range(50)) + "."

    (root / "library").mkdir(parents=True)
    (root / "tutorial").mkdir()
    for i in range(pages):
        (root / "library" / f"p{i}.html").write_text(page(f"Page {i}", [para() for _ in range(paragraphs)]))
    (root / "tutorial" / "t.html").write_text(page("Tutorial", [para() for _ in range(6)]))
    (root / "genindex.html").write_text(page("Index", ["not prose"]))
    return root
