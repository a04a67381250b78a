"""The "why this weight" panel (issue 29): a click on a cell (query i, key j) of the head view's
heat map shows :func:`qkv.explain.score_attribution`'s split of that score — the score, the sum
of the terms, its derived bound, the library's largest terms and every term on hover — with the
library's numbers to the digits shown; it follows the head; an error is its one line; and
``qkv why --html`` writes the same panel as a page that works from ``file://``."""

from __future__ import annotations

from urllib.parse import urlencode

from view_checks import DECODER, TEXT, assert_shown

from qkv.cli import main
from qkv.explain import explain, score_attribution

READ = """() => {
  const text = (id) => (document.getElementById(id) || {}).textContent || "";
  return {title: text('why-title'), score: text('why-score'), sum: text('why-sum'), bound: text('why-bound'),
          top: [...document.querySelectorAll('#why-top tbody tr')].map(r => [...r.cells].map(c => c.textContent))};
}"""


def wait_title(page, title: str) -> None:
    page.wait_for_function("(t) => (document.getElementById('why-title') || {}).textContent === t",
                           arg=title, timeout=60_000)


def assert_panel(page, a) -> None:
    """The panel shows exactly ``a``'s numbers (a ScoreAttribution)."""
    shown = page.evaluate(READ)
    assert_shown(shown["score"], a.score, "score")
    assert_shown(shown["sum"], float(a.terms.sum()), "Σ terms")
    assert_shown(shown["bound"], a.bound, "bound")  # toExponential(2)
    top = a.top()
    assert [row[:3] for row in shown["top"]] == [[str(r), q, k] for r, (q, k, _) in enumerate(top, 1)]
    for (_, q, k, term), (_, _, want) in zip(shown["top"], top):
        assert_shown(term.replace("+", ""), want, f"term {q} × {k}")


def hover_term(page, a, qi: int, kj: int) -> None:
    """Hovering the terms map's cell (qi, kj) names both components and shows their term."""
    page.locator("#why-map").scroll_into_view_if_needed()
    box = page.locator("#why-map").bounding_box()
    border, c = page.eval_on_selector("#why-map", "(cv, m) => [cv.clientLeft, cv.width / m]",
                                      len(a.key_components))
    page.mouse.move(box["x"] + border + (kj + 0.5) * c, box["y"] + border + (qi + 0.5) * c)
    tip = page.locator("#why-tip").text_content()
    assert tip.startswith(f"{a.query_components[qi]} × {a.key_components[kj]}: "), tip
    assert_shown(tip.split(": ")[1].replace("+", ""), float(a.terms[qi, kj]), f"terms[{qi}, {kj}]")


def click_cell(page, i: int, j: int, units: int) -> None:
    page.locator("#heat").scroll_into_view_if_needed()
    box = page.locator("#heat").bounding_box()
    cell = box["width"] / units
    page.mouse.click(box["x"] + (j + 0.5) * cell, box["y"] + (i + 0.5) * cell)


def test_a_clicked_cell_shows_its_score_split(watched, served, model):
    page = watched.page
    page.goto(served.url + "?" + urlencode({"text": TEXT, "layer": 3, "head": 1, "token": 12}))
    page.wait_for_selector("#steps-table", timeout=60_000)
    assert page.locator("#score-attribution-body").text_content().startswith("click a cell")
    units = len(score_attribution(model, TEXT, layer=3, head=1, token=12, key=5).tokens)
    click_cell(page, 12, 5, units)  # "it" → "pizza"
    wait_title(page, "layer 3, head 1: query 12 “it” → key 5 “pizza”")
    a = score_attribution(model, TEXT, layer=3, head=1, token=12, key=5)
    assert_panel(page, a)
    qi, kj = (int(x) for x in divmod(int(a.terms.abs().argmax()), a.terms.shape[1]))
    hover_term(page, a, qi, kj)
    hover_term(page, a, len(a.query_components) - 1, 0)
    assert "key=5" in page.url and "token=12" in page.url
    # the heat map outlines the cell (the text's colour on the cell's left edge, mid-height)
    edge = page.evaluate("""([i, j, n]) => { const cv = document.getElementById('heat'), c = cv.width / n;
      const px = cv.getContext('2d').getImageData(j * c + 1, i * c + c / 2, 1, 1).data;
      const fg = getComputedStyle(document.documentElement).getPropertyValue('--fg').trim();
      return [Array.from(px.slice(0, 3)), fg]; }""", [12, 5, units])
    assert "#%02x%02x%02x" % tuple(edge[0]) == edge[1], edge

    # another row's cell: the row becomes the selected token, the column the key
    click_cell(page, 9, 2, units)
    wait_title(page, "layer 3, head 1: query 9 “baby” → key 2 “dog”")
    assert_panel(page, score_attribution(model, TEXT, layer=3, head=1, token=9, key=2))
    page.wait_for_function("() => document.querySelector('#steps-body p').textContent.includes('token 9')",
                           timeout=30_000)

    # the panel follows the head: the same cell, asked again of another head
    page.click('#grid button.cell[data-layer="1"][data-head="4"]')
    wait_title(page, "layer 1, head 4: query 9 “baby” → key 2 “dog”")
    assert_panel(page, score_attribution(model, TEXT, layer=1, head=4, token=9, key=2))

    # by keyboard: the arrows move from the selected row, Enter asks for the cell
    page.focus("#heat")
    page.keyboard.press("ArrowRight")  # (9, 0)
    page.keyboard.press("ArrowRight")  # (9, 1)
    page.keyboard.press("Enter")
    wait_title(page, "layer 1, head 4: query 9 “baby” → key 1 “the”")
    assert_panel(page, score_attribution(model, TEXT, layer=1, head=4, token=9, key=1))


def test_a_masked_cell_says_why_in_one_line(watched, served):
    page = watched.page
    page.goto(served.url + "?" + urlencode({"model": DECODER, "text": "the dog ate it", "layer": 1,
                                            "head": 0, "token": 1, "key": 3}))
    page.wait_for_selector("#steps-table", timeout=60_000)
    note = page.locator("#score-attribution-body p.missing")
    note.wait_for(timeout=30_000)
    text = note.text_content()
    assert text.startswith("key: key '3' (position 3) is masked for the query at 1"), text
    assert "\n" not in text and watched.page.locator("#why-title").count() == 0
    assert watched.errors and all("422" in e for e in watched.errors), watched.errors  # the browser logs the 4xx
    watched.errors.clear()


def test_qkv_why_html_is_the_panel_offline(watched, model, tmp_path, capsys):
    path = tmp_path / "why.html"
    code = main(["why", TEXT, "--token", "it", "--to", "pizza", "--layer", "3", "--head", "1",
                 "--html", str(path)])
    capsys.readouterr()
    assert code == 0
    page = watched.page
    page.goto(path.as_uri())
    a = score_attribution(model, TEXT, layer=3, head=1, token="it", key="pizza")
    wait_title(page, "layer 3, head 1: query 12 “it” → key 5 “pizza”")
    assert_panel(page, a)
    hover_term(page, a, 0, 0)
    assert page.locator("main .columns").is_hidden() and page.locator("#steps").is_hidden()
    assert watched.requests == [path.as_uri()]  # nothing else loaded: the page is the file


def test_the_page_opens_on_the_top_ranked_head_and_the_panel_comes_into_view(watched, served, model):
    """Issue 41: no head in the URL → the model view's #1 head (as qkv explain ranks them), not
    L0 H0; a clicked cell's panel shows a busy sign at once and is scrolled into the viewport."""
    page = watched.page
    page.goto(served.url + "?" + urlencode({"text": TEXT}))
    page.wait_for_selector("#steps-table", timeout=60_000)
    top = explain(model, TEXT).to_dict()["heads"][0]
    assert (top["layer"], top["head"]) != (0, 0)  # else this test could not tell
    assert page.locator("#head-title").text_content() == f"Head view — layer {top['layer']}, head {top['head']}"
    assert f"layer={top['layer']}" in page.url and f"head={top['head']}" in page.url
    assert page.locator("#grid button.cell.selected").get_attribute("aria-label").split(":")[1].strip().startswith("rank 1,")

    # a busy sign, recorded as it appears (the answer may follow within milliseconds)
    page.evaluate("""() => { window.sawBusy = false; new MutationObserver(() => {
        if (document.querySelector('#score-attribution .busy')) window.sawBusy = true;
      }).observe(document.getElementById('head-view'), {childList: true, subtree: true}); }""")
    page.evaluate("() => window.scrollTo(0, 0)")
    units = page.evaluate("() => qkvView.data.map.n")
    click_cell(page, 12, 5, units)
    wait_title(page, f"layer {top['layer']}, head {top['head']}: query 12 “it” → key 5 “pizza”")
    assert page.evaluate("() => window.sawBusy")
    top_, bottom, height = page.evaluate("""() => { const r = document.getElementById('why-title').getBoundingClientRect();
      return [r.top, r.bottom, innerHeight]; }""")
    assert 0 <= top_ and bottom <= height, (top_, bottom, height)
    assert page.locator("#score-attribution").get_attribute("aria-busy") is None
