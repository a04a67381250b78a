"""Printing `HeadScores` (`qkv heads --probe induction` /
`--probe previous-token`): what was measured, chance, and the heads ranked."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from qkv.explain.probes.induction import HeadScores
from qkv.explain.rendering.render import head_name

WHAT = {
    "induction": "mean attention from each token of the second copy to the token after its "
                 "earlier occurrence",
    "previous-token": "mean attention from each token to the token just before it",
}


def render_head_scores(out: Console, result: HeadScores, *, top: int) -> None:
    """The `top` heads by score, with the sequences used and chance level."""
    first = " + ".join(result.prefix) + " + " if result.prefix else ""
    out.print(Text(f"model: {result.model} · {result.probe} probe: {result.sequences} sequences of "
                   f"{first}{result.length} random tokens + the same {result.length} again "
                   f"(seed {result.seed})"))
    out.print(Text(f"score: {WHAT[result.probe]}"))
    seen = "itself and every earlier token" if result.causal else "every token"
    out.print(Text(f"chance (uniform attention over {seen}): {result.chance:.3f}"))
    hybrid = len(set(result.mixers)) > 1 or bool(result.effective)
    if result.effective:
        layers = ", ".join(f"{i} ({result.mixers[i]})" for i in result.effective)
        out.print(Text(f"layers {layers}: no softmax weights; scored on their exact effective map M "
                       f"(o = M·v, signed, rows not summing to 1) by the same rule read as shares of "
                       f"each row's absolute weight, |M[i,k]| / Σ_j |M[i,j]| (= the weight on a softmax "
                       f"row), so every layer is ranked in one table; the sign is dropped"))
    for layer, why in result.unscored:
        out.print(Text(f"not scored: layer {layer}, {why}"))
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for name, justify in (("rank", "right"), ("head", "left"), *((("mixer", "left"),) if hybrid else ()),
                          ("score", "right"), ("× chance", "right")):
        table.add_column(name, justify=justify)
    ranked = result.ranked()
    for rank, (layer, head, score) in enumerate(ranked[:top], 1):
        mixer = (result.mixers[layer] + (" |M|" if layer in result.effective else ""),) if hybrid else ()
        table.add_row(str(rank), head_name(layer, head), *mixer, f"{score:.3f}", f"{score / result.chance:.1f}")
    out.print(table)
    if len(ranked) > top:
        out.print(Text(f"… {len(ranked) - top} more heads (--top {len(ranked)} or --json for all)"))
