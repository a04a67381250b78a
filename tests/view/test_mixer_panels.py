"""The head view's mixer panels (issue 39 items 5, 6). The indexer panel: on a sparse (indexed)
attention layer — a tiny random deepseek_v32 saved by transformers — the indexer's score of every
visible key, the kept keys marked on their rows, the head's weights, and a left-out key's miss
margin on hover (the row's tooltip) and on click. The output-gate panel: on a qwen3_5 whose head
has a closed gate, the library's verdict ("closed: this head contributes little") and every
token's gate. The numbers are the library's to the digits shown; a layer without the part shows
no panel."""

from __future__ import annotations

from urllib.parse import urlencode

import pytest

pytest.importorskip("transformers")  # the qkv[hf] extra
from view_checks import TEXT, assert_shown  # noqa: E402

from qkv.explain.mixers.sparse import indexed  # noqa: E402

SPARSE_TEXT = "the cat sat on the mat . a red dog"  # 10 tokens, top-k 4: six keys left out at the end
READ = """() => [...document.querySelectorAll('#indexed-table tbody tr')].map(r =>
  ({cls: r.className, title: r.title, cells: [...r.cells].map(c => c.textContent)}))"""


def _open_sparse(watched, sparse_served):
    """The page on SPARSE_TEXT's last token (layer 1, head 2) once its indexer table is drawn, and
    what `indexed` computes for it: (page, IndexedSelection)."""
    served, model = sparse_served
    page = watched.page
    page.goto(served.url + "?" + urlencode({"text": SPARSE_TEXT, "layer": 1, "head": 2, "token": 9}))
    page.wait_for_selector("#indexed-table tbody tr", timeout=60_000)
    return page, indexed(model, SPARSE_TEXT, layer=1, head=2, token=9)


def test_the_indexer_panel_marks_the_kept_keys_and_tells_the_margin(watched, sparse_served):
    page, want = _open_sparse(watched, sparse_served)
    rows = page.evaluate(READ)
    assert len(rows) == 10
    kept = [j for j, r in enumerate(rows) if r["cls"] == "kept"]
    assert sorted(kept) == sorted(want.row.selected) and len(kept) == want.topk
    for j, (r, missed) in enumerate(zip(rows, want.missed())):
        assert_shown(r["cells"][2], float(want.row.scores[j]), f"index score of key {j}")
        assert_shown(r["cells"][4], float(want.weights[j]), f"weight on key {j}")
        if missed is None:
            assert r["cells"][3].startswith("✓") and "kept: rank" in r["title"]
        else:
            assert r["cells"][4] in ("0", "0.000", "0.0000") or float(r["cells"][4]) == 0
            assert r["title"].startswith("left out: missed the cut by ")
            if missed:
                assert_shown(r["title"].rsplit(" ", 1)[1], missed, f"margin of key {j} (hover)")
    out = next(j for j, m in enumerate(want.missed()) if m)  # a key that missed by more than a tie
    row = page.locator(f"#indexed-table tbody tr[data-j='{out}']")
    row.click()
    assert_shown(row.locator("td.miss").text_content(), want.missed()[out], "margin (click)")


def test_a_model_without_an_indexer_has_no_indexer_panel(watched, served):
    page = watched.page
    page.goto(served.url + "?" + urlencode({"text": TEXT, "layer": 1, "head": 0}))
    page.wait_for_selector("#steps-table", timeout=60_000)
    assert page.locator("#indexed").is_hidden()


def test_the_gate_panel_says_a_closed_head_contributes_little(watched, gated_served):
    from closed_gate import HEAD, LAYER

    from qkv.explain.mixers.gate import gated_head

    served, model = gated_served
    page = watched.page
    page.goto(served.url + "?" + urlencode({"text": SPARSE_TEXT, "layer": LAYER, "head": HEAD, "token": 9}))
    page.wait_for_selector("#gate-verdict", timeout=60_000)
    want = gated_head(model, SPARSE_TEXT, layer=LAYER, head=HEAD, token=9)
    assert page.locator("#gate-verdict").text_content() == f"layer {LAYER}, head {HEAD}: {want.verdict()}"
    assert "closed: this head contributes little" in want.verdict()
    rows = page.evaluate("() => [...document.querySelectorAll('#gate-table tbody tr')].map(r => [...r.cells].map(c => c.textContent))")
    assert len(rows) == len(want.units.labels)
    for i, cells in enumerate(rows):
        assert_shown(cells[2], float(want.openness[i]), f"gate at {i}")
        assert_shown(cells[4], float(want.ungated[i]), f"ungated write at {i}")
    assert page.locator("#indexed").is_hidden()  # no indexer in this model
    # a Gated DeltaNet layer has no output gate of this kind: the panel hides
    page.goto(served.url + "?" + urlencode({"text": SPARSE_TEXT, "layer": 0, "head": 0, "token": 9}))
    page.wait_for_selector("#heat", timeout=60_000)
    page.wait_for_function("() => document.getElementById('gate') === null || document.getElementById('gate').hidden",
                           timeout=60_000)


def test_the_heat_map_outlines_the_kept_keys_and_tells_a_miss_on_hover(watched, sparse_served):
    page, want = _open_sparse(watched, sparse_served)
    n = len(want.units.labels)
    # each kept cell of row 9 has the gold outline on its left edge (mid-height); a left-out one not
    edges = page.evaluate("""([i, n, js]) => { const cv = document.getElementById('heat'), c = cv.width / n;
      const gold = getComputedStyle(document.documentElement).getPropertyValue('--gold').trim();
      return [gold, js.map((j) => { const px = cv.getContext('2d').getImageData(j * c + 1, i * c + c / 2, 1, 1).data;
        return '#' + Array.from(px.slice(0, 3)).map((v) => v.toString(16).padStart(2, '0')).join(''); })]; }""",
                          [9, n, list(range(n))])
    gold, colours = edges
    assert {j for j, colour in enumerate(colours) if colour == gold} == set(want.row.selected)
    out = next(j for j, m in enumerate(want.missed()) if m)
    box = page.locator("#heat").bounding_box()
    cell = box["width"] / n
    page.mouse.move(box["x"] + (out + 0.5) * cell, box["y"] + 9.5 * cell)
    tip = page.locator("#tip").text_content()
    assert "left out by the indexer: missed the cut by " in tip
    assert_shown(tip.rsplit(" ", 1)[1], want.missed()[out], "margin (heat map hover)")


def test_a_notebook_shows_each_panel_alone(watched, sparse_served, gated_served):
    """`indexed(...)`, `gated_head(...)` and a hybrid's probe display as their panels, alone."""
    from closed_gate import HEAD, LAYER
    from view_checks import notebook_frame

    from qkv.explain.mixers.gate import gated_head
    from qkv.explain.probes.induction import induction_probe
    from qkv.view import notebook

    page = watched.page
    r = indexed(sparse_served[1], SPARSE_TEXT, layer=1, head=2, token=9)
    frame = notebook_frame(page, notebook.html(r))
    frame.wait_for_selector("#indexed-table tbody tr", timeout=30_000)
    kept = frame.eval_on_selector_all("#indexed-table tbody tr.kept", "rs => rs.map(r => +r.dataset.j)")
    assert sorted(kept) == sorted(r.row.selected)
    g = gated_head(gated_served[1], SPARSE_TEXT, layer=LAYER, head=HEAD)
    frame = notebook_frame(page, notebook.html(g))
    frame.wait_for_selector("#gate-verdict", timeout=30_000)
    assert frame.locator("#gate-verdict").text_content() == f"layer {LAYER}, head {HEAD}: {g.verdict()}"
    scores = induction_probe(gated_served[1], "induction", sequences=1, length=3)
    frame = notebook_frame(page, notebook.html(scores))
    frame.wait_for_selector("#alone-table tbody tr", timeout=30_000)
    assert "|M[i,k]| / Σ_j |M[i,j]|" in frame.locator("#alone-title").text_content()
    assert frame.eval_on_selector_all("#alone-table tbody tr", "rs => rs.length") == 16
