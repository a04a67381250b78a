"""Terminal output for `qkv explain TEXT --compare`: every contribution method side by side.

Formats a `Comparison`; computes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from qkv.explain.contributions import METHODS
from qkv.explain.contributions.compare import Comparison
from qkv.explain.rendering.render import HIGHLIGHT, number, units_line
from qkv.explain.wording import ARGUMENTS


def render_compare(out: Console, c: Comparison, *, names: Mapping[str, str] = ARGUMENTS) -> None:
    units = c.units
    out.print(Text(f"model: {c.model}"))
    out.print(Text(f"{units.kind}s: ").append_text(units_line(units, c.unit)))
    out.print(Text(f"contributions into {units.kind} {c.unit} {units.labels[c.unit]!r}, by every "
                   f"method, largest share first"))
    where = f"layer {c.layer}" if c.layer is not None else "every layer"
    after = f"layer {c.layer}" if c.layer is not None else "the last layer"
    out.print(Text(f"rows: per-head methods (weight, norm): the mean of the heads' shares, {where}; "
                   f"per-layer methods: the row rolled out through {after}"))
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    table.add_column("rank", justify="right", no_wrap=True)
    for name in c.rows:
        table.add_column(name, justify="left", no_wrap=True)
    depth = max(len(t) for t in c.top.values())
    for k in range(depth):
        cells = []
        for name in c.rows:
            pairs = c.top[name]
            cells.append(Text(f"{units.labels[pairs[k][0]]} {number(pairs[k][1], 3)}",
                              style=HIGHLIGHT if pairs[k][0] == c.unit else None)
                         if k < len(pairs) else Text(""))
        table.add_row(str(k + 1), *cells)
    out.print(table)
    out.print(Text("on [CLS]/[SEP]/punctuation: " + " · ".join(
        f"{name} {number(share, 3)}" for name, share in c.parked.items())))
    for name, why in c.skipped.items():
        out.print(Text(f"{name}: not run — {why.spelled(names)}"))
    for name in c.rows:
        out.print(Text(f"{name}: {METHODS[name].formula}"))
