"""The viewer's first "why this weight" (issue 41): a fresh ``qkv view`` (its own process, the
example sentence "The dog found some pizza next to the baby and ate it" on MiniLM), chromium
opened on it, and a click on the heat map's cell "it" → "pizza" as soon as the page is ready —
timed from the click to the panel's title, and the panel's place in the viewport then.

    python benchmarks/why_click.py            # one fresh server a round, --rounds 2
"""

from __future__ import annotations

import argparse
import shutil
import time

from view import start_server, stop  # benchmarks/view.py: qkv view in its own process

CELL = (12, 5)  # "it" → "pizza" in MiniLM's tokens of the example sentence


def one_round(browser) -> dict:
    proc, url, started = start_server()
    try:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        t0 = time.perf_counter()
        page.goto(url)
        page.wait_for_selector("#steps-table", timeout=300_000)
        page.wait_for_function("() => document.body.dataset.state === 'ready'", timeout=300_000)
        ready = time.perf_counter() - t0
        head = page.locator("#head-title").text_content()
        page.locator("#heat").scroll_into_view_if_needed()
        box = page.locator("#heat").bounding_box()
        n = page.evaluate("() => qkvView.data.map.n")
        c = box["width"] / n
        t1 = time.perf_counter()
        page.mouse.click(box["x"] + (CELL[1] + 0.5) * c, box["y"] + (CELL[0] + 0.5) * c)
        page.wait_for_function("() => !!document.getElementById('why-title')", timeout=300_000)
        first = time.perf_counter() - t1
        rect = page.evaluate("""() => { const r = document.getElementById('why-title').getBoundingClientRect();
          return [r.top, r.bottom, innerHeight]; }""")
        page.close()
        return {"server_s": started, "ready_s": ready, "first_why_s": first, "head": head,
                "why_title_in_view": 0 <= rect[0] and rect[1] <= rect[2]}
    finally:
        stop(proc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium"))
        for r in range(args.rounds):
            print(r, one_round(browser), flush=True)
        browser.close()


if __name__ == "__main__":
    main()
