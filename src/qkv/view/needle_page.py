"""A needle map as one self-contained HTML page (`qkv needle --html FILE`): two depth × length
tables (accuracy, the retrieval heads' attention on the needle), each cell shaded by its value
with its number in it and its exact value in its tooltip.

It is the viewer's needle page (`static/needle.html` + `needle.js` on `shared.js` and
`style.css`, `qkv.view.page.page_html`) with the map's `to_dict()` embedded — the page
`qkv view` serves at `/needle` for a saved `qkv needle --json` — under a
Content-Security-Policy that allows that script and style only and no network access.

Examples:
    >>> d = {"kind": "needle-map", "model": "m", "needle": 8, "samples": 1, "heads": [[1, 1]],
    ...      "haystack": "random", "seed": 0, "lengths": [32, 64], "depths": [0.0, 1.0],
    ...      "accuracy": [[1.0, 0.5], [0.25, 0.0]], "attention": [[0.5, 0.5], [0.5, 0.5]]}
    >>> page = needle_page(d)
    >>> page.startswith("<!doctype html>"), '"accuracy":[[1.0,0.5],[0.25,0.0]]' in page
    (True, True)
"""

from __future__ import annotations

from qkv.view.page import page_html


def needle_page(d: dict) -> str:
    """The page for a needle map's `to_dict()` (see the module docstring)."""
    return page_html(embed=d, page="needle")


__all__ = ["needle_page"]
