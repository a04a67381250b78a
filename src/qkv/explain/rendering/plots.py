"""Heat maps (matplotlib): one head's map, or every head's row for one token.

Figures are built as plain `matplotlib.figure.Figure` objects with an Agg canvas
(`new_figure`), never through `pyplot`: no display is needed, importing this module leaves
matplotlib's global backend alone, and a figure is freed like any other object once dropped
(pyplot would keep every figure alive until `plt.close`).

Files are written atomically (`qkv.files`): the figure goes to a temporary file in the
target's directory, then `os.replace` moves it into place, so an interrupted or failed write
never leaves a partial file behind. A path that cannot be written raises
`QkvError`.
"""

from __future__ import annotations

import os

import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from qkv.errors import QkvError
from qkv.files import atomic_write
from qkv.paths import check_output_path

FORMATS = ("png", "svg", "pdf")


def _format(path: str) -> str:
    ext = os.path.splitext(path)[1].lower().lstrip(".")
    if ext not in FORMATS:
        raise QkvError(f"--png {path!r}: the file name must end in .png, .svg or .pdf")
    return ext


def check_writable(path: str) -> None:
    """Fail early (before any model runs) when `path` cannot be written."""
    _format(path)
    check_output_path(path, flag="--png", example="map.png")


def new_figure(nrows: int = 1, ncols: int = 1, *, figsize: tuple[float, float] | None = None,
               squeeze: bool = True):
    """`(fig, axes)` like `plt.subplots`, without pyplot or its global backend.

    `axes` is one Axes for a 1×1 grid, else an array of them (always a 2-d array with
    `squeeze=False`), exactly as `matplotlib.figure.Figure.subplots` returns them.

    Examples:
        >>> fig, axes = new_figure(2, 3, figsize=(6, 4), squeeze=False)
        >>> axes.shape, fig.get_size_inches().tolist()
        ((2, 3), [6.0, 4.0])
    """
    fig = Figure(figsize=figsize)
    FigureCanvasAgg(fig)  # attaches itself as fig.canvas: renders PNG and lays out text headless
    return fig, fig.subplots(nrows, ncols, squeeze=squeeze)


def save_atomic(fig, path: str) -> None:
    """Write `fig` to `path` via a temporary file in the same directory and `os.replace`."""
    check_writable(path)
    fmt = _format(path)
    try:
        atomic_write(path, lambda tmp: fig.savefig(tmp, format=fmt, dpi=150, bbox_inches="tight"))
    except OSError as e:
        raise QkvError(f"--png {path!r}: cannot write there ({e.strerror})") from None


def _annotate(ax, values: torch.Tensor, limit: int = 24) -> None:
    """Write each weight into its cell when the map is small enough to read them."""
    rows, cols = values.shape
    if rows > limit or cols > limit:
        return
    for r in range(rows):
        for c in range(cols):
            v = float(values[r, c])
            if v >= 0.005:
                ax.text(c, r, f"{v:.2f}"[1:] if v < 1 else "1", ha="center", va="center",
                        fontsize=6, color="white" if v > 0.5 else "black")


def head_map(weights: torch.Tensor, labels: list[str], *, title: str):
    """One head's (t, t) attention map: rows are queries, columns keys.

    Examples:
        >>> fig = head_map(torch.eye(2), ["a", "b"], title="demo")
        >>> len(fig.axes)        # the map and its colour bar
        2
    """
    w = weights.detach().double().cpu()
    size = max(4.0, 0.38 * len(labels) + 2.0)
    fig, ax = new_figure(figsize=(size + 1.2, size))
    im = ax.imshow(w.numpy(), cmap="viridis", vmin=0.0, vmax=1.0)
    ax.set_xticks(range(len(labels)), labels, rotation=90, fontsize=8)
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.set_xlabel("attends to (key)")
    ax.set_ylabel("from (query)")
    ax.set_title(title, fontsize=10)
    _annotate(ax, w)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="weight")
    return fig


def grid_map(rows: torch.Tensor, labels: list[str], *, heads: int, title: str,
             names: list[str] | None = None, highlight: list[bool] | None = None):
    """Every head's row for one token: (layers·heads, U), one line per head, grouped by layer.

    Args:
        rows: (n, U), rows in layer-major order (L0 H0, L0 H1, …).
        heads: heads per layer (for the layer separators and default labels).
        names: a label per row (default `L{r // heads} H{r % heads}`).
        highlight: per row, whether to mark its label (heads that point at the focus word).
    """
    w = rows.detach().double().cpu()
    n = w.shape[0]
    fig, ax = new_figure(figsize=(max(5.0, 0.45 * len(labels) + 2.5), max(4.0, 0.16 * n + 1.5)))
    im = ax.imshow(w.numpy(), cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto",
                   interpolation="nearest")
    ax.set_xticks(range(len(labels)), labels, rotation=90, fontsize=8)
    names = names or [f"L{r // heads} H{r % heads}" for r in range(n)]
    ax.set_yticks(range(n), names, fontsize=5 if n > 48 else 7)
    for r, lit in enumerate(highlight or []):
        if lit:
            ax.get_yticklabels()[r].set_color("red")
            ax.get_yticklabels()[r].set_fontweight("bold")
    for layer in range(1, n // heads):
        ax.axhline(layer * heads - 0.5, color="white", linewidth=1.0)
    best = w.argmax(-1)
    ax.scatter(best.numpy(), range(n), s=6, c="red", marker="o")  # each head's largest weight
    ax.set_xlabel("attends to")
    ax.set_title(title, fontsize=10)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="weight")
    return fig
