"""Printing and drawing [`HeadEffects`][qkv.explain.causal.head_effects.HeadEffects] and
[`Faithfulness`][qkv.explain.causal.faithfulness.Faithfulness] (`qkv heads --probe P --ablate`,
`qkv faithfulness`): the effects beside the attention scores, the ρ table, and a scatter of
effect against attention score per head."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from qkv.explain.causal.faithfulness import Faithfulness
from qkv.explain.causal.head_effects import HeadEffects
from qkv.explain.rendering.render import head_name


def render_effects(out: Console, effects: HeadEffects, scores=None, *, top: int) -> None:
    """The `top` heads by ablation effect; `scores` (L, h): the probe's attention score."""
    out.print(Text(f"model: {effects.model} · {effects.probe}: {effects.metric} "
                   f"({effects.sequences} sequences, {effects.mode} ablation)"))
    out.print(Text(f"clean: {effects.clean:.4f} · effect = metric with the head ablated − clean"))
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for name in ("rank", "head", "effect") + (("score",) if scores is not None else ()):
        table.add_column(name, justify="left" if name == "head" else "right")
    ranked = effects.ranked()
    for rank, (layer, head, effect) in enumerate(ranked[:top], 1):
        row = [str(rank), head_name(layer, head), f"{effect:+.4f}"]
        if scores is not None:
            row.append(f"{float(scores[layer, head]):.3f}")
        table.add_row(*row)
    out.print(table)
    if len(ranked) > top:
        out.print(Text(f"… {len(ranked) - top} more heads (--top {len(ranked)} or --json for all)"))


def render_faithfulness(out: Console, f: Faithfulness) -> None:
    """One row per method: ρ with the ablation effects, over heads or layers."""
    e = f.effects
    out.print(Text(f"model: {f.model} · probe: {f.probe} · ground truth: {e.metric}, each head "
                   f"{e.mode}-ablated ({e.sequences} sequences)"))
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for name, justify in (("method", "left"), ("per", "left"), ("n", "right"), ("spearman ρ", "right")):
        table.add_column(name, justify=justify)
    for m, rho in f.spearman.items():
        table.add_row(m, f.per[m], str(f.scores[m].numel()), "—" if rho is None else f"{rho:+.2f}")
    out.print(table)
    for m, why in f.skipped.items():
        out.print(Text(f"{m}: skipped — {why}"))
    out.print(Text("ρ: rank correlation of the method's probe score with the ablation effect "
                   "(1: the heads it scores high are the ones the task needs)"))


def effects_figure(f: Faithfulness, method: str = "weight"):
    """A scatter: each head's ablation effect against `method`'s probe score, labelled L H."""
    from qkv.explain.rendering.plots import new_figure

    fig, ax = new_figure(figsize=(5.2, 4.0))
    scores, effects = f.scores[method].flatten(), f.effects.effects.flatten()
    heads = f.effects.effects.shape[1]
    ax.scatter(scores.tolist(), effects.tolist(), s=18, color="#3b6ea8")
    # label the heads that stand out (the 6 largest effects and the 6 largest scores), not all 72
    named = set(effects.argsort(descending=True)[:6].tolist()) | set(scores.argsort(descending=True)[:6].tolist())
    for k, (x, y) in enumerate(zip(scores.tolist(), effects.tolist())):
        if k not in named:
            continue
        ax.annotate(head_name(k // heads, k % heads), (x, y), fontsize=7, xytext=(3, 2),
                    textcoords="offset points")
    rho = f.spearman.get(method)
    ax.set_xlabel(f"{f.probe} score by {method}")
    ax.set_ylabel(f"effect of ablating the head ({f.effects.mode})")
    ax.set_title(f"{f.model}: {f.probe}" + (f" (ρ = {rho:+.2f})" if rho is not None else ""),
                 fontsize=10)
    ax.axhline(0.0, color="#999999", linewidth=0.6)
    fig.tight_layout()
    return fig
