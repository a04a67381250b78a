"""The "attention received" panel: each key's Σ_i w_ij in the selected head, exactly the library's
(:func:`qkv.explain.received.attention_received`), in the browser."""

from __future__ import annotations

from urllib.parse import urlencode

from view_checks import TEXT, assert_shown

from qkv.explain.received import attention_received


def test_the_panel_shows_the_librarys_column_sums(watched, served, model):
    page = watched.page
    page.goto(served.url + "?" + urlencode({"text": TEXT, "layer": 3, "head": 1}))
    page.wait_for_function("() => (document.querySelector('#received-table caption') || {})"
                           ".textContent?.startsWith('layer 3, head 1')", timeout=60_000)
    r = attention_received(model, TEXT, layer=3, head=1)
    cells = page.eval_on_selector_all("#received-table tbody tr",
                                      "rs => rs.map(r => [...r.cells].map(c => c.textContent))")
    assert [c[1] for c in cells] == r.map.units.labels
    for j, (_, label, shown) in enumerate(cells):
        assert_shown(shown, float(r.received[j]), f"received[{j}] ({label})")
    page.click('#grid button.cell[data-layer="0"][data-head="2"]')  # another head: its own sums
    page.wait_for_function("() => document.querySelector('#received-table caption')"
                           ".textContent.startsWith('layer 0, head 2')", timeout=30_000)
    r = attention_received(model, TEXT, layer=0, head=2)
    shown = page.eval_on_selector_all("#received-table tbody td.num", "cs => cs.map(c => c.textContent)")
    for j, s in enumerate(shown):
        assert_shown(s, float(r.received[j]), f"L0 H2 received[{j}]")
