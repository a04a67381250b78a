"""A needle map as one self-contained HTML page (``qkv needle --html FILE``): two depth × length
heat maps (accuracy, the retrieval heads' attention on the needle), each cell's number written in
it — a static page, drawn from :meth:`qkv.explain.probes.needle.NeedleMap.to_dict` (no script).

    >>> d = {"model": "m", "needle": 8, "samples": 1, "heads": [[1, 1]], "haystack": "random",
    ...      "lengths": [32, 64], "depths": [0.0, 1.0],
    ...      "accuracy": [[1.0, 0.5], [0.25, 0.0]], "attention": [[0.5, 0.5], [0.5, 0.5]]}
    >>> page = needle_page(d)
    >>> page.count("<td"), "1.00" in page
    (8, True)
"""

from __future__ import annotations

import html


def _colour(v: float) -> str:
    """White (0) to a deep blue (1); the text turns white past the middle."""
    v = min(1.0, max(0.0, v))
    r, g, b = (round(255 - (255 - c) * v) for c in (33, 82, 160))
    return f"background:rgb({r},{g},{b});color:{'#fff' if v > 0.5 else '#000'}"


def _table(title: str, d: dict, values: list[list[float]]) -> str:
    head = "".join(f"<th>{n:,}</th>" for n in d["lengths"])
    rows = "".join(
        f"<tr><th>{depth:.0%}</th>"
        + "".join(f'<td style="{_colour(v)}">{v:.2f}</td>' for v in row) + "</tr>"
        for depth, row in zip(d["depths"], values))
    return (f"<h2>{html.escape(title)}</h2><table><tr><th>depth \\ length</th>{head}</tr>{rows}"
            f"</table>")


def needle_page(d: dict) -> str:
    """The page for a needle map's ``to_dict()`` (see the module docstring)."""
    heads = ", ".join(f"L{l} H{h}" for l, h in d["heads"])
    title = html.escape(f"qkv needle · {d['model']}")
    about = html.escape(f"a {d['needle']}-token needle in a {d['haystack']} haystack, copied again "
                        f"at the end; {d['samples']} input(s) a cell; retrieval heads {heads}")
    style = ("body{font:14px system-ui,sans-serif;margin:1.5em}table{border-collapse:collapse}"
             "td,th{padding:4px 10px;text-align:right;border:1px solid #ddd}")
    return (f"<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{title}</title>"
            f"<style>{style}</style></head><body><h1>{title}</h1><p>{about}</p>"
            + _table("needle accuracy (share of its tokens predicted)", d, d["accuracy"])
            + _table("retrieval heads' attention on the needle", d, d["attention"])
            + "</body></html>\n")


__all__ = ["needle_page"]
