"""Printing `RetrievalScores` (`qkv heads --probe retrieval`):
the inputs, the model's own copy accuracy, chance, and the heads ranked; and
`NeedleMap` (`qkv needle`) as depth × length tables."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from qkv.explain.probes.needle import NeedleMap
from qkv.explain.rendering.render import head_name
from qkv.explain.probes.retrieval import RetrievalScores


def render_retrieval(out: Console, result: RetrievalScores, *, top: int) -> None:
    """The `top` heads by retrieval score, beside their attention on the needle."""
    out.print(Text(f"model: {result.model} · retrieval probe: {result.samples} inputs of "
                   f"{result.length} tokens, a {result.needle}-token needle in a {result.haystack} "
                   f"haystack at depths {result.depths[0]:.2f}–{result.depths[-1]:.2f}, copied "
                   f"again at the end (seed {result.seed})"))
    out.print(Text("score: share of the needle's tokens the head copy-pastes (the model predicts "
                   "the token and the head's top key is the needle position holding it; Wu et "
                   "al. 2024)"))
    out.print(Text(f"the model predicts {result.accuracy:.1%} of the needle's tokens · chance "
                   f"(top key uniform over the visible keys): {result.chance:.4f}"))
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for name, justify in (("rank", "right"), ("head", "left"), ("score", "right"),
                          ("× chance", "right"), ("on needle", "right")):
        table.add_column(name, justify=justify)
    ranked = result.ranked()
    for rank, (layer, head, score) in enumerate(ranked[:top], 1):
        times = f"{score / result.chance:.1f}" if result.chance > 0 else "—"
        table.add_row(str(rank), head_name(layer, head), f"{score:.3f}", times,
                      f"{float(result.needle_weight[layer, head]):.3f}")
    out.print(table)
    if len(ranked) > top:
        out.print(Text(f"… {len(ranked) - top} more heads (--top {len(ranked)} or --json for all)"))


def render_needle(out: Console, result: NeedleMap) -> None:
    """Two tables, depth × length: the needle's accuracy, the retrieval heads' attention on it."""
    heads = ", ".join(head_name(layer, head) for layer, head in result.heads)
    out.print(Text(f"model: {result.model} · a {result.needle}-token needle in a {result.haystack} "
                   f"haystack, copied again at the end; {result.samples} "
                   f"input{'s' * (result.samples != 1)} per cell (seed {result.seed}); retrieval heads: {heads}"))
    for title, values in (("needle accuracy (share of its tokens predicted)", result.accuracy),
                          ("retrieval heads' attention on the needle", result.attention)):
        table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
        table.add_column("depth", justify="right")
        for n in result.lengths:
            table.add_column(f"{n:,}", justify="right")
        for i, depth in enumerate(result.depths):
            table.add_row(f"{depth:.0%}", *(f"{float(v):.2f}" for v in values[i]))
        out.print(table)
