"""The head atlas as one self-contained HTML page (`qkv atlas --html FILE`): every head a point
placed by two metrics chosen from menus; a click lists that head's top contexts.

It is the viewer's atlas page (`static/atlas.html` + `atlas.js` on `shared.js` and
`style.css`, `qkv.view.page.page_html`) with the atlas's `to_dict()` embedded — the page
`qkv view` serves at `/atlas` for a saved `qkv atlas --json` — under a Content-Security-Policy
that allows that script and style only and no network access. The page draws the embedded
numbers and computes none (`<` is written `\\u003c`, so no text of the corpus can close the
script).

Examples:
    >>> page = atlas_page({"kind": "atlas", "model": "</script>", "metrics": ["sink"], "heads": []})
    >>> page.startswith("<!doctype html>"), page.count("</script>")   # the model's name escaped
    (True, 2)
"""

from __future__ import annotations

import copy

from qkv.view.answers import saved_labelled
from qkv.view.page import page_html


def atlas_page(atlas: dict) -> str:
    """The page for an atlas's `to_dict()` (see the module docstring), its contexts' keys
    labelled for display (`saved_labelled`; `atlas` is not changed)."""
    return page_html(embed=saved_labelled(copy.deepcopy(atlas)), page="atlas")


__all__ = ["atlas_page"]
