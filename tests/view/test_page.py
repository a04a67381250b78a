"""A qkv.explain result in a notebook: :func:`qkv.view.notebook.html` is the viewer in a sandboxed
srcdoc iframe (isolated from the notebook's scripts), showing the result's own numbers; registering
it with IPython is the viewer's doing, not the library's."""

from __future__ import annotations

import html
import re

from view_checks import TEXT, assert_shown, assert_steps, notebook_frame

from qkv.explain import attention_map, explain, explain_head
from qkv.view import notebook


def test_repr_html_is_an_isolated_iframe(model):
    out = notebook.html(attention_map(model, TEXT, layer=3, head=1))
    assert out.startswith("<iframe srcdoc=") and 'sandbox="allow-scripts allow-downloads"' in out
    assert "allow-same-origin" not in out
    page = html.unescape(re.search(r'srcdoc="([^"]*)"', out)[1])
    assert "connect-src 'none'" in page and '"kind":"map"' in page
    overview = html.unescape(notebook.html(explain(model, TEXT, token="it")))
    assert '"kind":"overview"' in overview and "sandbox=" in overview


def test_a_notebook_shows_the_steps(watched, model):
    st = explain_head(model, TEXT, token="pizza", layer=3, head=1)
    page = watched.page
    frame = notebook_frame(page, notebook.html(st))
    frame.wait_for_selector("#steps-table", timeout=30_000)
    d = st.to_dict()
    assert_steps(frame, d, d["tokens"])


class _Formatter:
    def __init__(self):
        self.by_name = {}

    def for_type_by_name(self, module, name, func):
        self.by_name[(module, name)] = func


def test_register_shows_every_result_kind_with_a_panel(model):
    """Every kind the page opens at (a row with a ``request``) is registered, under the class its
    row names — read from the table, not listed again in the notebook."""
    import importlib
    from types import SimpleNamespace

    from qkv.explain.kinds import KINDS

    formatter = _Formatter()
    notebook.register(SimpleNamespace(display_formatter=SimpleNamespace(formatters={"text/html": formatter})))
    shown = {getattr(importlib.import_module(m), n).kind for m, n in formatter.by_name}
    opened = {k.name for k in KINDS.values() if k.request is not None}
    missing = sorted(n for n in opened if KINDS[n].result is None)
    assert not missing, f"rows the page opens at name no result class (give them result=): {missing}"
    assert shown == opened  # a document's kinds have no request: served by qkv view --file only
    assert all(f is notebook.html for f in formatter.by_name.values())
    assert not hasattr(explain(model, TEXT), "_repr_html_")  # qkv.explain knows nothing of the viewer


def read_alone(frame) -> tuple[str, list[str], list[list[str]]]:
    frame.wait_for_selector("#alone-table tbody tr", timeout=30_000)
    return (frame.locator("#alone-title").text_content(),
            frame.eval_on_selector_all("#alone-table thead th", "hs => hs.map(h => h.textContent)"),
            frame.eval_on_selector_all("#alone-table tbody tr", "rs => rs.map(r => [...r.cells].map(c => c.textContent))"))


def test_a_notebook_shows_a_probe_and_head_effects(watched):
    """probe(...) and head_effects(...) display their ranked heads (they once showed "not in
    this exported file" over an empty grid): every head, in the library's order, to the digits shown."""
    import qkv
    from qkv.explain import head_effects, probe

    lm = qkv.load("lm")
    page = watched.page
    for result, value in ((probe(lm, "previous-token"), "score"),
                          (head_effects(lm, "previous-token", sequences=2), "effect")):
        d = result.to_dict()
        frame = notebook_frame(page, notebook.html(result))
        title, columns, rows = read_alone(frame)
        assert d["probe"] in title and d["model"] in title
        assert not frame.locator("#grid button.cell").count()
        assert len(rows) == len(d["heads"]) > 0
        k = columns.index(value)
        for rank, (row, head) in enumerate(zip(rows, d["heads"]), 1):
            assert row[0] == str(rank)
            assert (int(row[columns.index("layer")]), int(row[columns.index("head")])) == (head["layer"], head["head"])
            assert_shown(row[k], head[value], f"{type(result).__name__} L{head['layer']} H{head['head']}")
        assert "not in this exported file" not in frame.inner_text("body")
