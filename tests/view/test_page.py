"""A qkv.explain result in a notebook: ``_repr_html_`` is the viewer in a sandboxed srcdoc iframe
(isolated from the notebook's scripts), showing the result's own numbers."""

from __future__ import annotations

import html
import re

from view_checks import TEXT, assert_steps

from qkv.explain import attention_map, explain, explain_head


def test_repr_html_is_an_isolated_iframe(model):
    out = attention_map(model, TEXT, layer=3, head=1)._repr_html_()
    assert out.startswith("<iframe srcdoc=") and 'sandbox="allow-scripts allow-downloads"' in out
    assert "allow-same-origin" not in out
    page = html.unescape(re.search(r'srcdoc="([^"]*)"', out)[1])
    assert "connect-src 'none'" in page and '"kind":"map"' in page
    overview = html.unescape(explain(model, TEXT, token="it")._repr_html_())
    assert '"kind":"overview"' in overview and "sandbox=" in overview


def test_a_notebook_shows_the_steps(watched, model):
    st = explain_head(model, TEXT, token="pizza", layer=3, head=1)
    page = watched.page
    page.set_content(f"<!doctype html><title>notebook</title>{st._repr_html_()}")
    frame = page.frames[1]
    frame.wait_for_selector("#steps-table", timeout=30_000)
    d = st.to_dict()
    assert_steps(frame, d, d["tokens"])
