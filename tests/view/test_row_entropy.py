"""The "row entropy" panel — the example of a result kind added in three files (the result in
explain/row_entropy.py, its row in kinds.py, its entry in app.js's PANELS): the API serves it, the
page draws it under the head view, the export and a notebook carry it, with the library's numbers."""

from __future__ import annotations

import html
import re
from urllib.parse import urlencode

from view_checks import TEXT, assert_shown, notebook_frame

from qkv.explain.row_entropy import row_entropy
from qkv.view import notebook

READ = "() => [...document.querySelectorAll('#row-entropy-table tbody tr')].map(r => [...r.cells].map(c => c.textContent))"


def assert_panel(page, r) -> None:
    rows = page.evaluate(READ)
    labels = r.map.units.labels
    assert [row[1] for row in rows] == labels
    for i, (_, _, entropy, top, weight) in enumerate(rows):
        assert_shown(entropy, float(r.entropy[i]), f"entropy[{i}]")
        assert top == labels[int(r.argmax[i])]
        assert_shown(weight, float(r.map.weights[i].max()), f"max weight[{i}]")


def test_the_panel_shows_the_librarys_row_entropies(watched, served, model):
    page = watched.page
    page.goto(served.url + "?" + urlencode({"text": TEXT, "layer": 2, "head": 5}))
    page.wait_for_function("() => (document.querySelector('#row-entropy-table caption') || {})"
                           ".textContent?.startsWith('layer 2, head 5')", timeout=60_000)
    assert_panel(page, row_entropy(model, TEXT, layer=2, head=5))
    page.click('#grid button.cell[data-layer="4"][data-head="0"]')  # another head: its own rows
    page.wait_for_function("() => document.querySelector('#row-entropy-table caption')"
                           ".textContent.startsWith('layer 4, head 0')", timeout=30_000)
    assert_panel(page, row_entropy(model, TEXT, layer=4, head=0))


def test_a_notebook_shows_it_alone(watched, model):
    r = row_entropy(model, TEXT, layer=3, head=1)
    out = notebook.html(r)
    assert '"kind":"row-entropy"' in html.unescape(re.search(r'srcdoc="([^"]*)"', out)[1])
    frame = notebook_frame(watched.page, out)
    frame.wait_for_selector("#row-entropy-table tbody tr", timeout=30_000)
    assert_panel(frame, r)
