"""The reader's text: English prose from Debian's Python documentation, read offline.

The corpus is the HTML of the `python3.11-doc` package (`apt-get install python3.11-doc`,
`/usr/share/doc/python3.11/html`). Every page says of itself: "This page is licensed under the
Python Software Foundation License Version 2. Examples, recipes, and other code in the
documentation are additionally licensed under the Zero Clause BSD License." (`LICENCE`).

A page's text is what its `<div role="main">` holds, read with the standard library's
`html.parser.HTMLParser`: paragraphs, headings, list items and table cells, one block a
line, with the code blocks (`<pre>`), scripts and the `¶` header links left out — prose, not
listings. Pages that are not prose (the indexes, the search page, the module index, the
changelog) are skipped.

The pages under `tutorial/` are **held out**: the tokenizer and the model never see them, and
the reader's held-out loss is measured on them:

```text
html/library/*.html, reference/, howto/, faq/, …  ─► training text (tokenizer + model)
html/tutorial/*.html                               ─► held-out text (loss only)
```

Examples:
    >>> page_text('<div role="main"><h1>Hi<a class="headerlink">¶</a></h1><p>A <b>bold</b> word.</p>'
    ...           '<pre>x = 1</pre></div>')
    'Hi\\nA bold word.'
"""

from __future__ import annotations

import html.parser
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from qkv.errors import QkvError

PACKAGE = "python3.11-doc"
DEFAULT_DIR = "/usr/share/doc/python3.11/html"
LICENCE = ("Python Software Foundation License Version 2 (PSF-2.0); examples, recipes and other "
           "code in the documentation additionally under the Zero Clause BSD License (0BSD)")
HELD_OUT = ("tutorial",)  # top-level folders whose pages are held out
# Not prose: generated indexes, the search page, the full changelog (one line per commit).
SKIPPED = re.compile(r"^(genindex.*|py-modindex|search|whatsnew/changelog)\.html$")

_BLOCKS = {"p", "div", "section", "h1", "h2", "h3", "h4", "h5", "h6", "li", "dt", "dd", "tr",
           "td", "th", "blockquote", "table", "ul", "ol", "dl", "br", "caption", "figcaption"}
_SKIP = {"pre", "script", "style"}
_VOID = {"br", "img", "hr", "input", "meta", "link", "wbr", "col", "area", "source"}


class _Text(html.parser.HTMLParser):
    """Collects the text inside `<div role="main">` (or nothing, on a page without one)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.lines: list[str] = []
        self.line: list[str] = []
        self.depth = 0  # open <div>s inside main; 0 = outside it
        self.skipped: list[str] = []  # open tags of a left-out element (<pre>, a header link)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "div" and (self.depth or a.get("role") == "main"):
            self.depth += 1
        if self.skipped:
            if tag not in _VOID:
                self.skipped.append(tag)
        elif tag in _SKIP or (tag == "a" and "headerlink" in (a.get("class") or "")):
            self.skipped = [tag]
        if tag in _BLOCKS:
            self._break()

    def handle_endtag(self, tag):
        if self.skipped and self.skipped[-1] == tag:
            self.skipped.pop()
        if tag == "div" and self.depth:
            self.depth -= 1
        if tag in _BLOCKS:
            self._break()

    def handle_data(self, data):
        if self.depth and not self.skipped:
            self.line.append(data)

    def _break(self) -> None:
        text = " ".join("".join(self.line).split())
        if text:
            self.lines.append(text)
        self.line = []


def page_text(page: str) -> str:
    """The prose of one HTML page: one block a line, whitespace collapsed, code left out."""
    p = _Text()
    p.feed(page)
    p.close()
    p._break()
    return "\n".join(p.lines)


@dataclass(frozen=True)
class Corpus:
    """The training and held-out text of a documentation directory.

    Attributes:
        train: the pages' texts (one string per page, in path order).
        heldout: see `train`.
        train_pages: the pages' paths relative to the directory.
        heldout_pages: see `train_pages`.
        source: what the text is (package, version, licence, directory) — recorded in the
            checkpoint.
    """

    train: list[str]
    heldout: list[str]
    train_pages: list[str]
    heldout_pages: list[str]
    source: dict

    @property
    def chars(self) -> tuple[int, int]:
        return sum(map(len, self.train)), sum(map(len, self.heldout))


def package_version(package: str = PACKAGE) -> str | None:
    """The installed version of a Debian package (`dpkg-query`), or None without one."""
    try:
        out = subprocess.run(["dpkg-query", "-W", "-f=${Version}", package], capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def read_corpus(directory: str | os.PathLike = DEFAULT_DIR) -> Corpus:
    """Every prose page under `directory`, split into training and held-out pages.

    Raises:
        QkvError: the directory is missing or holds no page of either kind.
    """
    root = Path(directory)
    if not root.is_dir():
        hint = (f" (install it: apt-get install {PACKAGE})" if str(directory) == DEFAULT_DIR else "")
        raise QkvError(f"--corpus {str(directory)!r} is not a directory{hint}")
    train, heldout, train_pages, heldout_pages = [], [], [], []
    for path in sorted(root.rglob("*.html")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("_") or SKIPPED.match(rel):
            continue
        text = page_text(path.read_text(encoding="utf-8", errors="replace"))
        if not text:
            continue
        if rel.split("/", 1)[0] in HELD_OUT:
            heldout.append(text)
            heldout_pages.append(rel)
        else:
            train.append(text)
            train_pages.append(rel)
    if not train or not heldout:
        raise QkvError(f"--corpus {str(directory)!r}: need HTML pages both under "
                       f"{'/'.join(HELD_OUT)}/ (held out) and elsewhere (training); found "
                       f"{len(train)} training and {len(heldout)} held-out pages")
    default = root.resolve() == Path(DEFAULT_DIR).resolve() if Path(DEFAULT_DIR).exists() else False
    source = {"directory": str(directory), "pages": len(train), "heldout_pages": len(heldout),
              "heldout": [f"{h}/" for h in HELD_OUT]}
    if default:
        source |= {"package": PACKAGE, "version": package_version(), "licence": LICENCE}
    return Corpus(train, heldout, train_pages, heldout_pages, source)
