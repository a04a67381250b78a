"""Printing an `Atlas` (`qkv atlas`): one row per head with its
metrics and its strongest context (`--json` has every context)."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from qkv.explain.probes.atlas import METRICS, Atlas
from qkv.explain.rendering.render import head_name
from qkv.models.tokenizer import display_text


def render_atlas(out: Console, result: Atlas) -> None:
    """Every head, layer by layer: the metrics, then where its pattern is strongest."""
    out.print(Text(f"model: {result.model} · {result.tokens:,} tokens in {result.windows} windows "
                   f"of {result.window} · sink: the first {result.first} token{'s' if result.first != 1 else ''} of a window · "
                   f"retrieval chance {result.retrieval_chance:.4f}"))
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    table.add_column("head")
    for name in METRICS:
        table.add_column(name, justify="right")
    table.add_column("strongest context (→ key)", overflow="fold")
    L, H = result.metrics["entropy"].shape
    for layer in range(L):
        for head in range(H):
            ctx = result.contexts[layer][head]
            # the key as a label (a newline key: ↵, display_text), the text before it on one line
            where = (f"…{display_text(ctx[0].before)} → {display_text(ctx[0].key_text)} "
                     f"({ctx[0].weight:.2f})" if ctx else "")
            table.add_row(head_name(layer, head),
                          *(f"{float(result.metrics[m][layer, head]):.3f}" for m in METRICS), where)
    out.print(table)
