"""A score attribution in a terminal (a ranked table of the largest terms) and as a heat map.

`render_terms` is the `score-attribution` row's printer (`qkv why`); `terms_figure`
draws the (query × key components) matrix, headless (`qkv.explain.rendering.plots.new_figure`).
"""

from __future__ import annotations

from rich.table import Table

from qkv.explain.circuits.score import ScoreAttribution
from qkv.explain.rendering.plots import new_figure
from qkv.models.tokenizer import display_token

#: Terms listed by default.
TOP = 12


def render_terms(console, a: ScoreAttribution, *, top: int = TOP) -> None:
    """The score, how well the terms sum to it, and the `top` largest terms (query component ×
    key component), with each key-side component's total beside."""
    q, k = display_token(a.tokens[a.token_index]), display_token(a.tokens[a.key_index])
    console.print(f"model: {a.model} · layer {a.layer} head {a.head} · query {a.token_index}:{q} "
                  f"→ key {a.key_index}:{k}")
    cap = "" if a.capped is None else f" (terms before the soft-cap; after it {a.capped:.4f})"
    console.print(f"score q·k/√d = {a.score:.4f}{cap} · Σ terms = {float(a.terms.sum()):.4f} "
                  f"(|diff| {abs(float(a.terms.sum()) - a.score):.2g} ≤ bound {a.bound:.2g})")
    for line in notes(a):
        console.print(line)
    table = Table(box=None, pad_edge=False)
    for name, justify in (("rank", "right"), ("query side", "left"), ("key side", "left"),
                          ("term", "right"), ("share", "right")):
        table.add_column(name, justify=justify)
    for rank, (qa, kb, term) in enumerate(a.top(top), 1):
        table.add_row(str(rank), qa, kb, f"{term:+.4f}", f"{term / a.score:+.0%}" if a.score else "")
    console.print(table)
    totals = a.key_totals()
    order = totals.abs().argsort(descending=True)[:5]
    console.print("key side, query summed: " + " · ".join(
        f"{a.key_components[int(i)]} {float(totals[i]):+.3f}" for i in order))


def notes(a: ScoreAttribution) -> list[str]:
    """The lines that say what kind of score it is: an MLA head's content and RoPE parts (each
    a sum of its own terms), a gated output, a key an indexer chose."""
    out = []
    if a.latent is not None:
        content, position = float(a.latent.content.sum()), float(a.latent.position.sum())
        out.append(f"latent attention: content q_nope·k_nope = {content:+.4f} · position "
                   f"RoPE(q_rope)·RoPE(k_rope) = {position:+.4f}")
    if a.indexed:
        out.append("sparse attention: the layer's indexer selected this key (the score is the "
                   "attention's, over its selected keys)")
    if a.gated:
        out.append("gated output: the head's output is multiplied by its gate after the weights; "
                   "the score and its terms are not")
    return out


def terms_figure(a: ScoreAttribution, *, most: int = 24):
    """The terms as a heat map, rows = query components, columns = key components; only the
    `most` components with the largest row/column totals by size (a 6-layer model has 80)."""
    rows = a.terms.abs().sum(1).argsort(descending=True)[:most].sort().values
    cols = a.terms.abs().sum(0).argsort(descending=True)[:most].sort().values
    m = a.terms[rows][:, cols].float()
    fig, ax = new_figure(figsize=(1.5 + 0.35 * len(cols), 1.5 + 0.3 * len(rows)))
    top = float(m.abs().max()) or 1.0
    ax.imshow(m.numpy(), cmap="RdBu_r", vmin=-top, vmax=top)
    ax.set_xticks(range(len(cols)), [a.key_components[int(j)] for j in cols], rotation=90)
    ax.set_yticks(range(len(rows)), [a.query_components[int(i)] for i in rows])
    ax.set_xlabel(f"key side: {display_token(a.tokens[a.key_index])!r}")
    ax.set_ylabel(f"query side: {display_token(a.tokens[a.token_index])!r}")
    ax.set_title(f"{a.model}: L{a.layer} H{a.head} score {a.score:.3f} = Σ terms")
    return fig


__all__ = ["TOP", "notes", "render_terms", "terms_figure"]
