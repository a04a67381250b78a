"""Regenerate the viewer's screenshots in docs/img/ (README, "qkv view"): Playwright + Debian's chromium.

    .venv/bin/python docs/screenshots.py
"""

from __future__ import annotations

import shutil
import threading
import time
import urllib.parse
from pathlib import Path

from playwright.sync_api import sync_playwright

from qkv.view.api import Api, Models
from qkv.view.server import bind, create_app, make_server, url_of

OUT = Path(__file__).resolve().parent / "img"
TEXT = "The dog found some pizza next to the baby and ate it"


def main() -> None:
    sock = bind("127.0.0.1", 0)
    server = make_server(create_app(Api(Models(["minilm", "translate"]))), sock)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not server.started:
            if not thread.is_alive():
                raise SystemExit("the server did not start")
            time.sleep(0.05)
        shoot(url_of(sock))
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
    print("wrote", ", ".join(sorted(p.name for p in OUT.glob("view-*.png"))))


def shoot(url: str) -> None:
    """Every screenshot of the page at ``url``; the browser is closed however this ends."""
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium"))
        page = browser.new_page(viewport={"width": 1400, "height": 900}, device_scale_factor=1)

        def show(**query) -> None:
            page.goto(url + "?" + urllib.parse.urlencode(query))
            page.wait_for_selector("#steps-table", timeout=120_000)
            page.wait_for_function("() => !document.querySelector('#model-hint').textContent.includes('computing')",
                                   timeout=120_000)

        show(text=TEXT, layer=3, head=1, token=12)
        page.screenshot(path=OUT / "view-page.png")
        page.locator("#model-view").screenshot(path=OUT / "view-model.png")
        box = page.locator("#heat").bounding_box()
        page.mouse.move(box["x"] + 5.5 * box["width"] / 14, box["y"] + 12.5 * box["height"] / 14)
        page.locator("#head-view").screenshot(path=OUT / "view-head.png")
        page.mouse.move(0, 0)
        page.locator("#steps").screenshot(path=OUT / "view-steps.png")
        page.emulate_media(color_scheme="dark")
        page.reload()
        page.wait_for_selector("#steps-table")
        page.evaluate("() => window.scrollTo(0, 0)")
        page.screenshot(path=OUT / "view-dark.png")
        page.emulate_media(color_scheme="light")
        show(model="translate", text="the red apple is next to the black cats", layer=1, head=0, token=2)
        page.screenshot(path=OUT / "view-cross.png")
        browser.close()


if __name__ == "__main__":
    main()
