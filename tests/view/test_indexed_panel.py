"""The indexer panel (issue 39 item 5): on a sparse (indexed) attention layer — a tiny random
deepseek_v32 saved by transformers — the head view shows the indexer's score of every visible
key, the keys it kept marked on their rows, the head's weights, and a key left out's miss
margin on hover (the row's tooltip) and on click; the numbers are the library's
(`qkv.explain.mixers.sparse.indexed`) to the digits shown. A model without an indexer (MiniLM)
shows no such panel."""

from __future__ import annotations

from urllib.parse import urlencode

import pytest

pytest.importorskip("transformers")  # the qkv[hf] extra
from view_checks import TEXT, assert_shown  # noqa: E402

from qkv.explain.mixers.sparse import indexed  # noqa: E402

SPARSE_TEXT = "the cat sat on the mat . a red dog"  # 10 tokens, top-k 4: six keys left out at the end
READ = """() => [...document.querySelectorAll('#indexed-table tbody tr')].map(r =>
  ({cls: r.className, title: r.title, cells: [...r.cells].map(c => c.textContent)}))"""


def test_the_indexer_panel_marks_the_kept_keys_and_tells_the_margin(watched, sparse_served):
    served, model = sparse_served
    page = watched.page
    page.goto(served.url + "?" + urlencode({"text": SPARSE_TEXT, "layer": 1, "head": 2, "token": 9}))
    page.wait_for_selector("#indexed-table tbody tr", timeout=60_000)
    want = indexed(model, SPARSE_TEXT, layer=1, head=2, token=9)
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
