"""``qkv view --file``'s page in a real browser (Debian's chromium via Playwright), on a ~3,000-token
text read by a random Llama decoder: every number read off the page equals the Document's to the
digits shown; a token switch updates the model view; the token strip keeps only the lines in
sight; every request stays on 127.0.0.1 and the page logs no error (the ``watched`` fixture).
"""

from __future__ import annotations

import re

import torch
from view_checks import assert_shown

from qkv.explain.long.document_results import received

READY = "() => document.body.dataset.state === 'ready'"


def open_document(watched, served, query: str = "") -> None:
    watched.page.goto(served.url + query)
    watched.page.wait_for_function(READY, timeout=60_000)


def click_and_wait(page, selector: str) -> None:
    page.click(selector)  # the click sets "busy" at once; "ready" once the update has drawn
    page.wait_for_function(READY, timeout=30_000)


def click_at_and_wait(page, x: float, y: float) -> None:
    page.mouse.click(x, y)
    page.wait_for_function(READY, timeout=30_000)


def model_view(page) -> dict:
    labels = page.eval_on_selector_all("#grid button.cell", "cs => cs.map(c => c.getAttribute('aria-label'))")
    return {tuple(map(int, re.match(r"layer (\d+) head (\d+)", s).groups())): s for s in labels}


def assert_model_view(page, doc, token: int | None) -> None:
    """The model view shows ``doc.explain(token=…)``'s ranks and numbers (None: its default)."""
    ov = doc.explain(token=None if token is None else str(token))
    by_head = model_view(page)
    assert len(by_head) == len(ov.rows)
    for rank, row in enumerate(ov.rows, 1):
        m = re.search(r"rank (\d+), largest weight (\S+) on (.+?), entropy (\S+) bits", by_head[row.layer, row.head])
        assert int(m[1]) == rank, (row.layer, row.head)
        assert_shown(m[2], row.max_weight, f"token {token} L{row.layer} H{row.head} max weight")
        assert m[3] == ov.units.labels[row.argmax]
        assert_shown(m[4], row.entropy, f"token {token} L{row.layer} H{row.head} entropy")


def test_the_long_page_shows_the_documents_numbers(watched, document_served, long_document):
    doc, page, n = long_document, watched.page, len(long_document)
    assert n > 2500
    open_document(watched, document_served)

    # the token strip is virtualised: a few lines of buttons, not one per token
    shown = page.eval_on_selector_all("#strip button", "bs => bs.map(b => Number(b.dataset.token))")
    default = doc.explain().unit  # the library's default token (the last word)
    assert 0 < len(shown) < 300 < n and default in shown  # opened there, scrolled to it
    assert page.get_attribute(f'#strip button[data-token="{default}"]', "aria-pressed") == "true"
    assert_model_view(page, doc, None)

    # a token switch: click one near the top of the strip; the model view is that token's
    page.evaluate("() => { document.getElementById('strip').scrollTop = 0; }")
    page.wait_for_selector('#strip button[data-token="40"]')
    click_and_wait(page, '#strip button[data-token="40"]')
    assert page.get_attribute('#strip button[data-token="40"]', "aria-pressed") == "true"
    assert "token=40" in page.url
    assert_model_view(page, doc, 40)
    top = page.locator("#ranking li").first.text_content()
    best = doc.explain(token="40").rows[0]
    assert top.startswith(f"L{best.layer} H{best.head} → ")

    # another head: the block map and the received strip are that head's
    click_and_wait(page, '#grid button.cell[data-layer="1"][data-head="2"]')
    assert page.locator("#map-title").text_content() == "Block map — layer 1, head 2"

    # the block map: a tile's sum on hover, exactly doc.block_map's
    tiles = doc.block_map(1, 2, block=128)
    box = page.locator("#map").bounding_box()
    cell = box["width"] / tiles.shape[1]
    for i, j in ((0, 0), (5, 3), (tiles.shape[0] - 1, tiles.shape[1] - 1)):
        page.mouse.move(box["x"] + (j + 0.5) * cell, box["y"] + (i + 0.5) * cell)
        tip = page.locator("#tip").text_content()
        assert tip.startswith(f"rows {i * 128}–") and f"keys {j * 128}–" in tip, tip
        assert_shown(tip.split("Σ ")[1], float(tiles[i, j]), f"tile [{i}, {j}]")

    # zoom into tile (5, 3): its rows, each cell one exact weight (doc.weights)
    assert page.locator("#tip").is_visible()
    click_at_and_wait(page, box["x"] + 3.5 * cell, box["y"] + 5.5 * cell)
    assert "rows 640–767 × keys 384–511" in page.locator("#crumbs").text_content()
    # the tile's tip named a cell of the map before the zoom: gone until the mouse moves again
    assert page.locator("#tip").is_hidden(), page.locator("#tip").text_content()
    rows = doc.weights(1, 2, torch.arange(640, 768))  # (128, N)
    box = page.locator("#map").bounding_box()
    cell = box["width"] / 128
    labels = doc.explain(token="0").units.labels
    for i, j in ((0, 0), (17, 100), (127, 127)):
        page.mouse.move(box["x"] + (j + 0.5) * cell, box["y"] + (i + 0.5) * cell)
        tip = page.locator("#tip").text_content()
        q, k = 640 + i, 384 + j
        assert tip.startswith(f"{labels[q]} ({q}) → {labels[k]} ({k}): "), tip
        assert_shown(tip.rsplit(": ", 1)[1], float(rows[i, 384 + j]), f"w[{q}, {k}]")

    # a row of the zoomed tile selects its token
    click_at_and_wait(page, box["x"] + 10 * cell, box["y"] + 20.5 * cell)
    assert page.get_attribute('#strip button[data-token="660"]', "aria-pressed") == "true"
    assert_model_view(page, doc, 660)

    # attention received: the top keys and a key under the mouse, as the library sums them
    r = received(doc, layer=1, head=2)
    assert [t for t, _ in r.top] == [t for t, _ in doc.top_received(1, 2, k=10)]
    items = page.eval_on_selector_all("#received-top button", "bs => bs.map(b => b.textContent)")
    assert len(items) == len(r.top)
    for shown_item, (index, value) in zip(items, r.top):
        assert shown_item.startswith(f"{labels[index]} ({index}): ")
        assert_shown(shown_item.rsplit(": ", 1)[1], value, f"received[{index}]")
    box = page.locator("#received").bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + 10)
    tip = page.locator("#received-tip")
    j = int(tip.get_attribute("data-key"))
    assert tip.text_content().startswith(f"{labels[j]} ({j}): Σ ")
    assert_shown(tip.text_content().split("Σ ")[1], float(r.received[j]), f"received[{j}]")

    # Esc zooms back out to the tiles
    page.focus("#map")
    page.keyboard.press("Escape")
    page.wait_for_function(READY)
    assert page.locator("#crumbs button").count() == 1


def spans_shown(page) -> dict:
    """(layer, head) → the sinks-and-spans cell's label (its tooltip: the exact value)."""
    labels = page.eval_on_selector_all("#spans-grid button.cell", "cs => cs.map(c => c.getAttribute('title'))")
    return {tuple(map(int, re.match(r"layer (\d+) head (\d+)", s).groups())): s for s in labels}


def assert_spans(page, spans, metric: str) -> None:
    """Every head's cell names ``spans``' value of ``metric`` to the digits shown."""
    shown = spans_shown(page)
    L, H = spans.sink.shape
    assert set(shown) == {(layer, head) for layer in range(L) for head in range(H)}
    word = {"sink": "sink share", "distance": "mean attention distance"}[metric]
    for (layer, head), label in shown.items():
        m = re.search(word + r" (\S+)", label)
        assert m, label
        assert_shown(m[1], float(getattr(spans, metric)[layer, head]), f"{metric} L{layer} H{head}")
        assert f"over {int(spans.rows[layer, head])} rows" in label


def test_the_long_page_shows_sinks_and_spans(watched, document_served, long_document):
    from qkv.explain.long.document_heads import head_spans

    doc, page = long_document, watched.page
    open_document(watched, document_served)
    spans = head_spans(doc)  # the library's default: the first token is the sink
    assert_spans(page, spans, "sink")
    assert page.input_value("#spans-first") == "1"

    # the tooltip on hover: the exact value of the head under the mouse
    page.hover('#spans-grid button.cell[data-layer="1"][data-head="3"]')
    tip = page.locator("#spans-tip")
    assert tip.is_visible() and tip.get_attribute("data-layer") == "1" and tip.get_attribute("data-head") == "3"
    value = re.search(r"sink share (\S+)", tip.text_content())[1]
    assert len(value.split(".")[1]) == 6
    assert_shown(value, float(spans.sink[1, 3]), "sink L1 H3 (tip)")

    # switch to the mean distance: the same heads, the other number
    page.select_option("#spans-metric", "distance")
    assert_spans(page, spans, "distance")
    assert "spans=distance" in page.url

    # a larger sink: the library's numbers for first=4, asked again
    page.select_option("#spans-first", "4")
    page.wait_for_function(READY, timeout=30_000)
    assert_spans(page, head_spans(doc, first=4), "distance")
    assert "first=4" in page.url

    # a click selects the head: the block map is that head's, the cell marked
    click_and_wait(page, '#spans-grid button.cell[data-layer="0"][data-head="2"]')
    assert page.locator("#map-title").text_content() == "Block map — layer 0, head 2"
    assert page.get_attribute('#spans-grid button.cell[data-layer="0"][data-head="2"]', "aria-pressed") == "true"


def test_the_sink_size_opens_from_the_url(watched, document_served, long_document):
    from qkv.explain.long.document_heads import head_spans

    open_document(watched, document_served, "?first=3&spans=distance")
    page = watched.page
    assert page.input_value("#spans-first") == "3" and page.input_value("#spans-metric") == "distance"
    options = page.eval_on_selector_all("#spans-first option", "os => os.map(o => Number(o.value))")
    assert options == [1, 2, 3, 4, 8, 16]
    assert_spans(page, head_spans(long_document, first=3), "distance")


def test_tokens_are_text_and_the_legends_read(watched, reader_document_served):
    """Issue 41: the strip shows tokens as text (no Ġ or Ċ: display_token), opens on a word (not
    the final newline), and the model view and the sinks grid each have a colour scale with
    ticks; a sinks cell's shade is the value it shows."""
    (served, doc), page = reader_document_served, watched.page
    assert any("Ġ" in t for t in doc.encoding.tokens) and doc.encoding.tokens[-1] == "Ċ"
    open_document(watched, served)
    page.wait_for_selector("#spans-grid button.cell", timeout=60_000)
    strip = page.eval_on_selector_all("#strip button", "bs => bs.map(b => b.textContent)")
    assert strip and not [t for t in strip if "Ġ" in t or "Ċ" in t or "▁" in t], strip
    assert "↵" in strip and "pizza" in "".join(strip)
    chosen = page.locator('#strip button[aria-pressed="true"]').text_content()
    # the library's default: the last token with a letter ("hed" of "Ġlaug" "hed"), not the final "↵"
    ov = doc.explain()
    assert chosen == ov.units.labels[ov.unit] == "hed" and ov.units.labels[ov.unit + 1:] == [".", "↵"]
    assert "Ġ" not in page.locator("#model-hint").text_content()

    for legend in ("#grid-legend", "#spans-legend"):
        ticks = page.eval_on_selector_all(legend + " .legend-ticks span", "ss => ss.map(s => s.textContent)")
        assert len(ticks) >= 3 and page.locator(legend + " figcaption").is_visible(), (legend, ticks)
    assert page.eval_on_selector_all("#spans-legend .legend-ticks span", "ss => ss.map(s => s.textContent)") == \
        ["0.00", "0.25", "0.50", "0.75", "1.00"]
    cells = page.eval_on_selector_all("#spans-grid button.cell", """cs => cs.map(c =>
        [c.textContent, Number(getComputedStyle(c).getPropertyValue('--w'))])""")
    for shown, w in cells:  # sink share s shown → shade 0.85 s, whatever the other cells hold
        assert abs(w - 0.85 * float(shown)) < 1e-3, (shown, w)
