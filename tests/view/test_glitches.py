"""The page's glitches of issue 32 (Chromium at 1400×900), each with the check that would have
caught it: vectors that wrap inside a number, a heat map without token labels, empty menus on the
translation model, a model switch that leaves the old model's views (and a 422) behind, a main page
without ``document.body.dataset.state``. (The Δ labels' fit: test_effects.py; the block map's
stale tip: test_document_page.py; the exported page's hint: test_export.py.)"""

from __future__ import annotations

from urllib.parse import urlencode

from view_checks import DECODER, FRENCH_TEXT, TEXT

from qkv.view.api import EXAMPLES

READY = "() => document.body.dataset.state === 'ready'"

# For each whitespace-separated number of a vector: how many line boxes it is drawn on.
SPLIT_NUMBERS = """(id) => {
  const node = document.getElementById(id).firstChild, text = node.textContent, split = [];
  const lines = new Set();
  for (const m of text.matchAll(/\\S+/g)) {
    const r = document.createRange();
    r.setStart(node, m.index); r.setEnd(node, m.index + m[0].length);
    const rects = [...r.getClientRects()].filter((x) => x.width > 0);
    rects.forEach((x) => lines.add(Math.round(x.top)));
    if (rects.length !== 1) split.push(m[0]);
  }
  return { split, lines: lines.size, numbers: text.split(/\\s+/).filter(Boolean).length };
}"""


# The labels of the model view's cells whose text runs past the cell (or is clipped by it).
CUT_LABELS = """() => [...document.querySelectorAll('#grid button.cell span')].flatMap((span) => {
  const cell = span.closest('button').getBoundingClientRect(), r = document.createRange();
  r.selectNodeContents(span);
  const text = r.getBoundingClientRect();
  return text.left < cell.left || text.right > cell.right || span.scrollWidth > span.clientWidth
    ? [span.textContent] : [];
})"""


def open_ready(watched, served, **query) -> None:
    watched.page.set_viewport_size({"width": 1400, "height": 900})
    watched.page.goto(served.url + "?" + urlencode(query))
    watched.page.wait_for_function(READY, timeout=60_000)


def test_vectors_wrap_between_numbers_and_the_state_is_set(watched, served):
    page = watched.page
    open_ready(watched, served, text=TEXT, layer=3, head=1, token=5)
    assert page.locator("#steps-table").count() == 1  # "ready": the step panel is drawn
    page.click("#steps-body details:not([open]) summary")  # x, 384 numbers
    for vector in ("step-x", "step-q", "step-out", "step-model-out"):
        got = page.evaluate(SPLIT_NUMBERS, vector)
        assert got["numbers"] > 0 and not got["split"], f"{vector}: numbers cut across lines: {got['split'][:5]}"
    assert page.evaluate(SPLIT_NUMBERS, "step-x")["lines"] > 1  # it does wrap, between numbers

    # every label of a model-view cell ("#rank weight") is drawn inside its cell, not cut off
    assert not page.evaluate(CUT_LABELS), page.evaluate(CUT_LABELS)[:5]

    # the state follows every update: busy at a click, ready once the head is drawn
    page.click('#grid button.cell[data-layer="0"][data-head="4"]')
    page.wait_for_function(READY)
    assert page.locator("#head-title").text_content() == "Head view — layer 0, head 4"


def test_the_heat_map_has_token_labels(watched, served, model):
    page = watched.page
    open_ready(watched, served, text=TEXT, layer=3, head=1)
    labels = model.tokenizer.encode(TEXT).tokens
    rows = page.eval_on_selector_all("#heat-rows div", "ds => ds.map(d => d.textContent)")
    cols = page.eval_on_selector_all("#heat-cols div", "ds => ds.map(d => d.textContent)")
    assert rows == cols == labels
    heat = page.locator("#heat").bounding_box()
    c = heat["height"] / len(labels)
    box = "ds => ds.map(d => { const r = d.getBoundingClientRect(); return [r.x, r.y, r.width, r.height]; })"
    row_boxes, col_boxes = (page.eval_on_selector_all(f"#heat-{k} div", box) for k in ("rows", "cols"))
    for i, (x, y, w, h) in enumerate(row_boxes):  # each row's label beside its row
        assert x + w <= heat["x"] + 1 and abs((y + h / 2) - (heat["y"] + (i + 0.5) * c)) <= c / 2, (i, labels[i])
    for j, (x, y, w, h) in enumerate(col_boxes):  # each key's label above its column
        assert y + h <= heat["y"] + 1 and abs((x + w / 2) - (heat["x"] + (j + 0.5) * c)) <= c / 2, (j, labels[j])


def test_the_translation_models_menus_say_why_they_are_off(watched, served):
    page = watched.page
    open_ready(watched, served, model="translate", text=FRENCH_TEXT)
    for menu in ("#method", "#effects-probe"):
        assert page.is_disabled(menu) and page.locator(f"{menu} option").count() == 1
        assert page.get_attribute(menu, "title")
    assert "no contribution methods" in page.locator("#form-hint").text_content()
    assert page.locator("#form-hint").is_visible()
    assert "no ablation probe applies to translate" in page.locator("#effects-why").text_content()


def test_switching_to_translation_leaves_nothing_of_the_last_model(watched, served):
    page = watched.page
    open_ready(watched, served, model=DECODER, text=TEXT, effects="induction")
    page.wait_for_selector("#grid .effect", timeout=120_000)  # every head ablated (cached after test_effects)
    page.select_option("#model", "translate")
    page.wait_for_function("() => document.body.dataset.state === 'ready' && "
                           "document.querySelector('#steps-body p')?.textContent.startsWith('Cross-attention')",
                           timeout=60_000)
    assert page.input_value("#text") == EXAMPLES["cross_attention"]  # MiniLM's example → translate's
    assert "model=translate" in page.url and "effects=" not in page.url
    labels = page.eval_on_selector_all("#grid button.cell", "cs => cs.map(c => c.getAttribute('aria-label'))")
    assert labels and all("entropy" not in s and "ablation" not in s for s in labels)
    assert not page.locator("#grid .effect").count() and page.locator("#effects-ranking").is_hidden()
    assert page.locator("#status").text_content() == ""

    # a sentence typed by hand that the toy grammar cannot read: an error, and no stale views
    page.select_option("#model", "minilm")
    page.wait_for_function(READY, timeout=60_000)
    page.fill("#text", "the dog ate it")
    page.click("#run")
    page.wait_for_function(READY)
    page.select_option("#model", "translate")
    page.wait_for_function("() => document.body.dataset.state === 'error'", timeout=60_000)
    assert "unknown English words" in page.locator("#status").text_content()
    assert not page.locator("#grid button.cell").count() and not page.locator("#tokens button").count()
    assert not page.locator("#steps-table").count() and page.locator("#head-title").text_content() == "Head view"
    # the browser logs the refused request itself (a 422); nothing else may be logged
    assert all("422" in e for e in watched.errors), watched.errors
    watched.errors.clear()
