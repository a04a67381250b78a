"""Printing what a layer's own mixer steps add to a head's steps: an indexer's selection
(`qkv.explain.mixers.sparse.IndexedSelection`) — `qkv explain --layer L --head H` prints it
after the head's steps, `qkv show indexed` alone."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from qkv.explain.mixers.sparse import IndexedSelection


def render_indexed(out: Console, result: IndexedSelection) -> None:
    """Every visible key's index score, whether the indexer kept it, the head's weight and, for
    a key left out, by how much its score missed the cut."""
    r, i = result.row, result.token
    kept = len(r.selected)
    out.print(Text(f"indexer · layer {result.layer} · query {i} {result.units.labels[i]!r}: it scores the "
                   f"{i + 1} visible keys (Σ_g w_g·relu(q_g·k_j)), keeps the top {result.topk} "
                   f"({kept} kept), and head {result.head}'s softmax runs over those only"))
    cut = "every visible key is kept (no cut)" if r.cutoff is None else \
        f"the cut: the lowest kept score, {r.cutoff:.6g}; a key left out missed it by cut − its score"
    out.print(Text(cut))
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for name, justify in (("j", "right"), ("token", "left"), ("index score", "right"), ("kept", "left"),
                          ("rank", "right"), ("weight", "right"), ("missed the cut by", "right")):
        table.add_column(name, justify=justify)
    rank = {j: n for n, j in enumerate(r.selected, 1)}
    for j, missed in enumerate(result.missed()):
        table.add_row(str(j), result.units.labels[j], f"{float(r.scores[j]):.6g}", "✓" if missed is None else "·",
                      str(rank.get(j, "")), f"{float(result.weights[j]):.4f}",
                      "" if missed is None else f"{missed:.4g}" + (" (a tie: top-k chose by position)" if missed == 0 else ""))
    out.print(table)
    out.print(Text(f"the weights on the kept keys sum to {float(result.weights.sum()):.6f}; the keys left "
                   f"out get exactly 0 (masked before the softmax)"))
