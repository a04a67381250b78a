"""Figures of [`qkv.explain`][qkv.explain] results: each function takes a result and returns a
matplotlib figure; write it with `qkv.explain.rendering.plots.save_atomic`.

* `overview_figure` — an [`Overview`][qkv.explain.Overview]: every head's row for the token
* `map_figure` — an [`AttentionMap`][qkv.explain.AttentionMap]: one head's whole map
* `cross_figure`, `cross_head_figure` — an encoder-decoder's cross-attention, target
  rows, source columns, a gold alignment (when the model has one) boxed in red
* `needle_figure` — a `NeedleMap`: accuracy and the
  retrieval heads' attention, depth × length

The drawing primitives (a headless figure, a heat map, a grid of rows) are in
`qkv.explain.plots`.
"""

from __future__ import annotations

import torch
from matplotlib.patches import Rectangle

from qkv.explain.contributions import get_method
from qkv.explain.cross import CrossAttention
from qkv.explain.maps import AttentionMap
from qkv.explain.overview import Overview
from qkv.explain.rendering.plots import grid_map, head_map, new_figure
from qkv.models.tokenizer import display_token


def overview_figure(ov: Overview):
    """Every head's row for the chosen unit, in layer/head order; heads on the focus in red."""
    ordered = sorted(ov.rows, key=lambda r: (r.layer, r.head or 0))
    rows = torch.stack([r.weights for r in ordered])  # (layers·heads, U), or (layers, U)
    label = ov.units.labels[ov.unit]
    m = get_method(ov.method)
    kind = "every layer" if ov.per == "layer" else "every head"
    largest = m.value
    title = f"{ov.model}: {m.row_heading} {label!r}, {kind} (red dot: its largest {largest})"
    if ov.focus is not None:
        title += (f"\nred labels: {kind.split()[1]}s whose largest {largest} is on "
                  f"{ov.units.labels[ov.focus]!r}")
    return grid_map(rows, ov.units.labels, heads=1 if ov.per == "layer" else ov.num_heads,
                    title=title, highlight=[ov.highlighted(r) for r in ordered],
                    names=[f"L{r.layer}" if r.head is None else f"L{r.layer} H{r.head}"
                           for r in ordered])


def map_figure(m: AttentionMap):
    """One head's map, rows from and columns to the units."""
    return head_map(m.weights, m.units.labels, title=f"{m.model}: layer {m.layer}, head {m.head}")


# -- cross-attention -----------------------------------------------------------------------------
def _draw_map(ax, ca: CrossAttention, layer: int, head: int, *, annotate: bool):
    w = ca.weights[layer, head].double()  # (t, s)
    im = ax.imshow(w.numpy(), cmap="viridis", vmin=0.0, vmax=1.0)
    ax.set_xticks(range(len(ca.source)), [display_token(t) for t in ca.source], rotation=90, fontsize=7)
    ax.set_yticks(range(len(ca.target)), [display_token(t) for t in ca.target], fontsize=7)
    for j, srcs in enumerate(ca.gold or []):
        for i in srcs:
            ax.add_patch(Rectangle((i - 0.5, j - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=1.2))
    if annotate:
        for j in range(w.shape[0]):
            for i in range(w.shape[1]):
                v = float(w[j, i])
                if v >= 0.005:
                    label = f"{v:.2f}"  # "0.37" → ".37"; anything that rounds to 1.00 → "1"
                    label = "1" if label.startswith("1") else label[1:]
                    ax.text(i, j, label, ha="center", va="center", fontsize=6,
                            color="white" if v < 0.5 else "black")
    return im


def cross_figure(ca: CrossAttention):
    """Every head of `ca.layers` as a small (t, s) map, one row of heads per layer."""
    H = ca.num_heads
    t, s = ca.weights.shape[2:]
    cell = 0.32
    fig, axes = new_figure(len(ca.layers), H, squeeze=False,
                           figsize=(H * (cell * s + 1.2), len(ca.layers) * (cell * t + 1.2)))
    for r, l in enumerate(ca.layers):
        for h in range(H):
            _draw_map(axes[r][h], ca, l, h, annotate=False)
            axes[r][h].set_title(f"L{l} H{h}", fontsize=8)
    fig.suptitle(f"{ca.model}: cross-attention, target (rows) → source (columns)"
                 + ("; red boxes: gold alignment" if ca.gold else ""), fontsize=10)
    fig.tight_layout()
    return fig


def cross_head_figure(ca: CrossAttention, layer: int, head: int):
    """One head's (t, s) map, each weight written in its cell."""
    t, s = ca.weights.shape[2:]
    fig, ax = new_figure(figsize=(max(4.0, 0.42 * s + 2.2), max(3.5, 0.42 * t + 1.5)))
    im = _draw_map(ax, ca, layer, head, annotate=True)
    ax.set_xlabel("source (keys: the encoder's output)")
    ax.set_ylabel("target (queries: the decoder producing this token)")
    ax.set_title(f"{ca.model}: layer {layer}, head {head} cross-attention"
                 + ("; red boxes: gold alignment" if ca.gold else ""), fontsize=9)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="weight")
    return fig


def needle_figure(m):
    """A `NeedleMap` `m` as two heat maps side by side,
    depth (rows) × length (columns): accuracy, attention."""
    fig, axes = new_figure(1, 2, figsize=(max(7.0, 1.1 * len(m.lengths) + 5), 0.5 * len(m.depths) + 2.5))
    for ax, values, title in ((axes[0], m.accuracy, "needle accuracy"),
                              (axes[1], m.attention, "retrieval heads' attention on the needle")):
        im = ax.imshow(values.numpy(), cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
        ax.set_xticks(range(len(m.lengths)), [f"{n:,}" for n in m.lengths], rotation=45, fontsize=8)
        ax.set_yticks(range(len(m.depths)), [f"{d:.0%}" for d in m.depths], fontsize=8)
        ax.set_xlabel("input length (tokens)")
        ax.set_ylabel("needle depth")
        ax.set_title(title, fontsize=9)
        for r in range(values.shape[0]):
            for c in range(values.shape[1]):
                v = float(values[r, c])
                ax.text(c, r, f"{v:.2f}", ha="center", va="center", fontsize=7,
                        color="white" if v < 0.5 else "black")
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    heads = ", ".join(f"L{l} H{h}" for l, h in m.heads)
    fig.suptitle(f"{m.model}: a {m.needle}-token needle, {m.samples} input{'s' * (m.samples != 1)} per cell; heads {heads}",
                 fontsize=10)
    return fig
