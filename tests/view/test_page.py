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
    """Every kind with a viewer endpoint is registered, under the class that really has that kind."""
    import importlib
    from types import SimpleNamespace

    from qkv.explain.kinds import KINDS

    formatter = _Formatter()
    notebook.register(SimpleNamespace(display_formatter=SimpleNamespace(formatters={"text/html": formatter})))
    shown = {getattr(importlib.import_module(m), n).kind for m, n in formatter.by_name}
    # a document's kinds are served by qkv view --file only (the notebook shows a text's page)
    assert shown == {k.name for k in KINDS.values() if k.endpoint and k.endpoint != "maps" and not k.document}
    assert all(f is notebook.html for f in formatter.by_name.values())
    assert not hasattr(explain(model, TEXT), "_repr_html_")  # qkv.explain knows nothing of the viewer
