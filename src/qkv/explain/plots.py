"""Heat maps (matplotlib, Agg backend): one head's map, or every head's row for one token.

Files are written atomically: the figure goes to a temporary file in the target's directory,
then ``os.replace`` moves it into place, so an interrupted or failed write never leaves a
partial file behind. A path that cannot be written raises :class:`~qkv.errors.QkvError`.
"""

from __future__ import annotations

import os
import tempfile

import matplotlib

matplotlib.use("Agg")  # no display needed; must come before pyplot is imported

import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from qkv.errors import QkvError  # noqa: E402

FORMATS = ("png", "svg", "pdf")


def _format(path: str) -> str:
    ext = os.path.splitext(path)[1].lower().lstrip(".")
    if ext not in FORMATS:
        raise QkvError(f"--png {path!r}: the file name must end in .png, .svg or .pdf")
    return ext


def check_writable(path: str) -> None:
    """Fail early (before any model runs) when ``path`` cannot be written."""
    _format(path)
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise QkvError(f"--png {path!r} is a directory; give a file name such as map.png")
    if not os.path.isdir(directory):
        raise QkvError(f"--png {path!r}: the directory {directory!r} does not exist")
    if not os.access(directory, os.W_OK):
        raise QkvError(f"--png {path!r}: the directory {directory!r} is not writable")


def save_atomic(fig, path: str) -> None:
    """Write ``fig`` to ``path`` via a temporary file in the same directory and ``os.replace``."""
    check_writable(path)
    directory = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(prefix=".qkv-", suffix=".tmp", dir=directory)
    except OSError as e:
        raise QkvError(f"--png {path!r}: cannot write there ({e.strerror})") from None
    try:
        with os.fdopen(fd, "wb") as f:
            fig.savefig(f, format=_format(path), dpi=150, bbox_inches="tight")
        os.replace(tmp, path)
    except OSError as e:
        raise QkvError(f"--png {path!r}: cannot write there ({e.strerror})") from None
    finally:
        plt.close(fig)
        if os.path.exists(tmp):
            os.unlink(tmp)


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

    Example:
        >>> fig = head_map(torch.eye(2), ["a", "b"], title="demo")
        >>> len(fig.axes)        # the map and its colour bar
        2
    """
    w = weights.detach().double().cpu()
    size = max(4.0, 0.38 * len(labels) + 2.0)
    fig, ax = plt.subplots(figsize=(size + 1.2, size))
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
        names: a label per row (default ``L{r // heads} H{r % heads}``).
        highlight: per row, whether to mark its label (heads that point at the focus word).
    """
    w = rows.detach().double().cpu()
    n = w.shape[0]
    fig, ax = plt.subplots(figsize=(max(5.0, 0.45 * len(labels) + 2.5), max(4.0, 0.16 * n + 1.5)))
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
