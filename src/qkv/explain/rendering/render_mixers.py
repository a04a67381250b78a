"""Printing what a layer's own mixer steps add to a head's steps: an indexer's selection
(`qkv.explain.mixers.sparse.IndexedSelection`) and an output gate
(`qkv.explain.mixers.gate.GatedHead`) — `qkv explain --layer L --head H` prints them after the
head's steps, `qkv show indexed|gate` alone."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from qkv.explain.mixers.gate import GatedHead
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


def render_gate(out: Console, result: GatedHead) -> None:
    """The gate as the head's last step: its value at the query, what reaches the residual
    stream gated and ungated, the verdict, and the same for every token."""
    i, g = result.token, result.gate
    out.print(Text(f"output gate · layer {result.layer}, head {result.head}: y = sigmoid(gate) ⊙ output, "
                   f"then W_O (the gate comes from the same projection as q, one value per channel)"))
    shown = ", ".join(f"{float(v):.4f}" for v in g[:4]) + (", …" if len(g) > 4 else "")
    out.print(Text(f"   gate at token {i} {result.units.labels[i]!r} = [{shown}] ({len(g)}), mean {float(g.mean()):.4g}"))
    out.print(Text(f"   ‖(gate ⊙ output)·W_O,h‖ = {float(result.gated[i]):.4g}   vs ungated ‖output·W_O,h‖ = "
                   f"{float(result.ungated[i]):.4g}   (the heads' gated outputs rebuild the layer's output "
                   f"to {result.error:.1e})"))
    out.print(Text(f"   {result.verdict()}"))
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for name in ("i", "token", "mean gate", "‖gated‖", "‖ungated‖", "let through"):
        table.add_column(name, justify="left" if name == "token" else "right")
    for j, label in enumerate(result.units.labels):
        table.add_row(str(j), label + (" ◀" if j == i else ""), f"{float(result.openness[j]):.4g}",
                      f"{float(result.gated[j]):.4g}", f"{float(result.ungated[j]):.4g}",
                      f"{100 * float(result.kept[j]):.3g}%")
    out.print(table)
