"""Regenerate the viewer's screenshots in docs/img/ (README, "qkv view"), and the API reference's
(docs-api.png: site/api/explain.html, built first with mkdocs): Playwright + Debian's chromium.

    .venv/bin/python docs/screenshots.py

The main page (it opens on its top-ranked head), "why this weight" after a click on a cell, the
long-document page (``qkv view --file``, the shipped reader: byte-level BPE tokens shown as text)
and the head atlas (``qkv atlas --html``, the reader over this repository's README), with the
views the docs show besides (model view, head view, steps, dark, a translation).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path

from playwright.sync_api import sync_playwright

from qkv.view.api import Api, Models
from qkv.view.server import bind, create_app, make_server, url_of

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "img"
TEXT = "The dog found some pizza next to the baby and ate it"
READY = "() => document.body.dataset.state === 'ready'"


@contextlib.contextmanager
def serving(api: Api):
    """``api``'s app on a free port of 127.0.0.1 (uvicorn in a thread) → its URL."""
    sock = bind("127.0.0.1", 0)
    server = make_server(create_app(api), sock)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not server.started:
            if not thread.is_alive():
                raise SystemExit("the server did not start")
            time.sleep(0.05)
        yield url_of(sock)
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def corpus(chars: int) -> str:
    """The first ``chars`` characters of the README: English with code and newlines."""
    return (ROOT / "README.md").read_text(encoding="utf-8")[:chars]


def main() -> None:
    import qkv
    from qkv.explain.long.document import document
    from qkv.explain.probes.atlas import atlas
    from qkv.view.atlas_page import atlas_page

    reader = qkv.load("reader")
    doc = document(reader, corpus(3000))
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as p:
        atlas_file = Path(tmp) / "atlas.html"
        atlas_file.write_text(atlas_page(atlas(reader, corpus(20000), retrieval_samples=4).to_dict()),
                              encoding="utf-8")
        browser = p.chromium.launch(executable_path=shutil.which("chromium"))
        try:
            with serving(Api(Models(["minilm", "translate"]))) as url:
                shoot_text(browser, url)
            with serving(Api(Models(["reader"], loader=lambda name: reader), document=doc)) as url:
                shoot_document(browser, url)
            shoot_atlas(browser, atlas_file.as_uri())
        finally:
            browser.close()
    print("wrote", ", ".join(sorted(p.name for p in OUT.glob("view-*.png"))))


def new_page(browser, height: int = 900):
    return browser.new_page(viewport={"width": 1400, "height": height}, device_scale_factor=1)


def shoot_text(browser, url: str) -> None:
    """The text page: whole, its model view, head view, steps, "why this weight", dark, a translation."""
    page = new_page(browser)

    def show(**query) -> None:
        page.goto(url + "?" + urllib.parse.urlencode(query))
        page.wait_for_selector("#steps-table", timeout=120_000)
        page.wait_for_function("() => !document.querySelector('#model-hint').textContent.includes('computing')",
                               timeout=120_000)
        page.wait_for_function(READY, timeout=120_000)

    show(text=TEXT)  # no head named: the page opens on the top-ranked one
    page.screenshot(path=OUT / "view-page.png")
    page.locator("#model-view").screenshot(path=OUT / "view-model.png")
    # the coref head (★): "it" looks at "pizza" — the head view and the why panel show it
    page.click('#grid button.cell[data-layer="3"][data-head="1"]')
    page.wait_for_function("() => document.getElementById('head-title').textContent.endsWith('layer 3, head 1')")
    page.wait_for_function(READY, timeout=120_000)
    heat = page.locator("#heat")
    heat.scroll_into_view_if_needed()
    box, n = heat.bounding_box(), page.evaluate("() => qkvView.data.map.n")
    page.mouse.move(box["x"] + 5.5 * box["width"] / n, box["y"] + 12.5 * box["height"] / n)
    page.locator(".head-wrap").screenshot(path=OUT / "view-head.png")
    page.mouse.click(box["x"] + 5.5 * box["width"] / n, box["y"] + 12.5 * box["height"] / n)  # "it" → "pizza"
    page.wait_for_selector("#why-title", timeout=120_000)
    page.wait_for_function(READY, timeout=120_000)
    page.mouse.move(0, 0)
    page.screenshot(path=OUT / "view-why.png")  # the viewport the click left the reader in
    page.locator("#steps").screenshot(path=OUT / "view-steps.png")
    page.emulate_media(color_scheme="dark")
    show(text=TEXT)
    page.evaluate("() => window.scrollTo(0, 0)")
    page.screenshot(path=OUT / "view-dark.png")
    page.emulate_media(color_scheme="light")
    show(model="translate", text="the red apple is next to the black cats", layer=1, head=0, token=2)
    page.screenshot(path=OUT / "view-cross.png")
    page.close()


def shoot_document(browser, url: str) -> None:
    """The long-document page, whole (tokens as text, the legends under the grids)."""
    page = new_page(browser)
    page.goto(url)
    page.wait_for_selector("#spans-grid button.cell", timeout=120_000)
    page.wait_for_function(READY, timeout=120_000)
    page.screenshot(path=OUT / "view-long.png", full_page=True)
    page.close()


def shoot_atlas(browser, uri: str) -> None:
    page = new_page(browser, height=760)
    page.goto(uri)
    page.wait_for_function(READY, timeout=120_000)
    page.screenshot(path=OUT / "view-atlas.png")
    page.close()


def shoot_api() -> None:
    """The built API page (site/api/explain.html, as `make docs` builds it) at the overview's
    entry, opened from file:// — the rendered Args/Returns tables and an example with "<s>"."""
    root = OUT.parent.parent
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet"], cwd=root, env=env, check=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium"))
        page = browser.new_page(viewport={"width": 1400, "height": 900}, device_scale_factor=1)
        page.goto((root / "site" / "api" / "explain.html").as_uri() + "#qkv.explain.overview.attention_sink")
        page.wait_for_timeout(500)
        page.screenshot(path=OUT / "docs-api.png")
        browser.close()
    print("wrote docs-api.png")


if __name__ == "__main__":
    main()
    shoot_api()
