"""A page as one HTML string: `static/frame.html` (what every page's `<head>` holds, the
`<body>` around its content) filled with one page's title, body (`static/index.html` for the
text's: `PAGES`), style and script.

Two forms, one frame:

* **served** (`page_html` without answers): `<link>`/`<script src>` to `/static/…`;
  the server sends a Content-Security-Policy header allowing its own origin only.
* **standalone** (with answers — `qkv view TEXT --html FILE` and a notebook's display,
  `qkv.view.notebook`):
  style, script and the API's answers inlined; a `<meta>` Content-Security-Policy that allows
  exactly that style and script (by sha256) and **no network access at all** (`connect-src
  'none'`, nothing loaded from anywhere). It works from `file://`.

`iframe` wraps a standalone page for a notebook: `srcdoc` in a sandboxed iframe (scripts
allowed, no same-origin), so the page and the notebook's scripts cannot reach each other.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
from dataclasses import dataclass
from pathlib import Path

STATIC_DIR = Path(__file__).resolve().parent / "static"
MEDIA_TYPES = {".html": "text/html; charset=utf-8", ".css": "text/css; charset=utf-8",
               ".js": "text/javascript; charset=utf-8", ".svg": "image/svg+xml",
               ".txt": "text/plain; charset=utf-8", ".json": "application/json"}


def static_files(static_dir: Path = STATIC_DIR) -> dict[str, tuple[bytes, str]]:
    """Every plain file directly in `static_dir` with a known type: name → (bytes, media type).

    Read once: the server answers from this dict, so no request can reach another file.
    """
    out = {}
    for path in sorted(Path(static_dir).iterdir()):
        if path.is_file() and not path.is_symlink() and path.suffix in MEDIA_TYPES:
            out[path.name] = (path.read_bytes(), MEDIA_TYPES[path.suffix])
    return out


def _sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def _json_in_html(data) -> str:
    # Inside <script type="application/json"> only "</script" could end the block early.
    text = json.dumps(data, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


@dataclass(frozen=True)
class Page:
    """One of the viewer's pages: files in `static/` that `FRAME` is filled with."""

    body: str  # what stands in the frame's <body>: the page's header, main and footer
    script: str  # its script, loaded after shared.js
    title: str  # its <title>
    styles: tuple[str, ...] = ("style.css",)  # its style sheets, in order


# Four pages, one style: a text's (index.html, app.js), a long document's (document.html,
# document.js: qkv view --file — a virtualised token strip, the block map, served only), a head
# atlas's and a needle map's (qkv atlas/needle --html, or a saved --json opened at /atlas, /needle).
PAGES = {"text": Page("index.html", "app.js", "qkv view"),
         "document": Page("document.html", "document.js", "qkv view — a long document",
                          ("style.css", "document.css")),
         "atlas": Page("atlas.html", "atlas.js", "qkv view — a head atlas"),
         "needle": Page("needle.html", "needle.js", "qkv view — a needle map")}
FRAME = "frame.html"  # every page's <head>, and the <body> its content, data and script go in
SHARED_SCRIPT = "shared.js"  # loaded before each page's script: the POST, helpers, the model grid


def page_html(static_dir: Path = STATIC_DIR, embed: dict | None = None, *, page: str = "text") -> str:
    """The page: served (`embed` None) or standalone with `embed` inlined (see the module doc).

    `embed`: the text page's `{"model", "text", "state", "info", "answers": [[endpoint,
    fields, answer], …]}`; an atlas's or a needle map's `to_dict()`.
    `page`: which of `PAGES` (a document's is served only).
    """
    static_dir = Path(static_dir)
    chosen = PAGES[page]
    if embed is not None and page == "document":
        raise ValueError("a document's page is served only, never written standalone")
    scripts = (SHARED_SCRIPT, chosen.script)
    # 1) the page in the frame (first, so that only the frame's and the page's own markers are read)
    parts = {"title": html.escape(chosen.title),
             "body": (static_dir / chosen.body).read_text(encoding="utf-8").rstrip("\n")}
    # 2) its style, script and data: linked (served), or inlined under a CSP that allows them only
    if embed is None:
        parts |= {"csp": "", "data": "",
                  "style": "".join(f'<link rel="stylesheet" href="/static/{name}">'
                                   for name in chosen.styles),
                  "script": "".join(f'<script src="/static/{name}"></script>' for name in scripts)}
    else:
        style = "\n".join((static_dir / name).read_text(encoding="utf-8") for name in chosen.styles)
        script = "\n".join((static_dir / name).read_text(encoding="utf-8") for name in scripts)
        csp = (f"default-src 'none'; script-src {_sha256(script)}; style-src {_sha256(style)}; "
               "img-src data: blob:; connect-src 'none'; font-src 'none'; base-uri 'none'; "
               "form-action 'none'")
        parts |= {"csp": f'<meta http-equiv="Content-Security-Policy" content="{csp}">',
                  "style": f"<style>{style}</style>", "script": f"<script>{script}</script>",
                  "data": f'<script type="application/json" id="qkv-data">{_json_in_html(embed)}</script>'}
    template = (static_dir / FRAME).read_text(encoding="utf-8")
    for name, value in parts.items():  # the data last: nothing is looked for in it
        template = template.replace(f"<!--qkv:{name}-->", value)
    return template


def standalone(answers: list, *, model: str, text: str, state: dict, info: dict) -> str:
    """A self-contained page showing `answers` (`[[endpoint, request fields, answer], …]`:
    the page looks each up by its request), opened at `state`;
    `info` is what `/api/info` would answer (the model and its capabilities)."""
    return page_html(embed={"model": model, "text": text, "state": state, "info": info,
                            "answers": answers})


def iframe(page: str, *, height: int = 760) -> str:
    """`page` in a sandboxed `srcdoc` iframe (a notebook's display)."""
    return (f'<iframe srcdoc="{html.escape(page, quote=True)}" sandbox="allow-scripts allow-downloads" '
            f'width="100%" height="{height}" title="qkv view" '
            f'style="border:1px solid #8884;width:100%"></iframe>')
