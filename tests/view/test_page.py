"""A qkv.explain result in a notebook: :func:`qkv.view.notebook.html` is the viewer in a sandboxed
srcdoc iframe (isolated from the notebook's scripts), showing the result's own numbers; registering
it with IPython is the viewer's doing, not the library's."""

from __future__ import annotations

import html
import re

from view_checks import TEXT, assert_steps

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
    page.set_content(f"<!doctype html><title>notebook</title>{notebook.html(st)}")
    frame = page.frames[1]
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
