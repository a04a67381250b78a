"""Why divide by √d_k: with unit-variance entries, q·k has standard deviation √d, so the
unscaled softmax saturates as d grows — one weight near 1, the rest near 0 — and its gradient
(the Jacobian ``diag(w) − w wᵀ``) vanishes. Dividing the scores by √d keeps both steady.

Everything is computed in float64 from a seeded generator, so the figures are reproducible.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from qkv.errors import QkvError


@dataclass(frozen=True)
class Saturation:
    """Averages over the trials for one dimension d (weights are over ``keys`` keys)."""

    d: int
    score_std: float          # std of q·k (≈ √d)
    scaled_std: float         # std of q·k / √d (≈ 1)
    max_weight_raw: float     # mean largest softmax weight, unscaled scores
    max_weight_scaled: float  # the same with scores / √d
    grad_raw: float           # mean Frobenius norm of the softmax Jacobian, unscaled
    grad_scaled: float        # the same, scaled


def _jacobian_norm(w: torch.Tensor) -> torch.Tensor:
    """‖diag(w) − w wᵀ‖_F for each row of w (n, k) → (n,)."""
    jac = torch.diag_embed(w) - w.unsqueeze(-1) * w.unsqueeze(-2)  # (n, k, k)
    return jac.flatten(1).norm(dim=-1)


def saturation(dims: list[int], *, keys: int = 10, trials: int = 2000, seed: int = 0) -> list[Saturation]:
    """One :class:`Saturation` per dimension.

    Example:
        >>> rows = saturation([4, 1024], trials=200)
        >>> rows[1].max_weight_raw > rows[0].max_weight_raw, abs(rows[1].max_weight_scaled - rows[0].max_weight_scaled) < 0.1
        (True, True)
    """
    if not dims or any(d < 1 for d in dims):
        raise QkvError(f"--dims must be positive whole numbers, got {dims}")
    if keys < 2:
        raise QkvError(f"--keys must be at least 2, got {keys}")
    if trials < 1:
        raise QkvError(f"--trials must be at least 1, got {trials}")
    out = []
    for d in dims:
        gen = torch.Generator().manual_seed(seed + d)
        raw_w, scaled_w, scores = [], [], []
        # Chunks of queries keep memory small at large d (keys alone are trials·keys·d numbers).
        for start in range(0, trials, 256):
            n = min(256, trials - start)
            q = torch.randn(n, 1, d, generator=gen, dtype=torch.float64)  # (n, 1, d)
            k = torch.randn(n, keys, d, generator=gen, dtype=torch.float64)  # (n, keys, d)
            s = (q @ k.transpose(-2, -1)).squeeze(1)  # (n, keys)
            scores.append(s)
            raw_w.append(s.softmax(-1))
            scaled_w.append((s / math.sqrt(d)).softmax(-1))
        s, raw, scaled = torch.cat(scores), torch.cat(raw_w), torch.cat(scaled_w)
        out.append(Saturation(
            d=d, score_std=float(s.std()), scaled_std=float((s / math.sqrt(d)).std()),
            max_weight_raw=float(raw.max(-1).values.mean()),
            max_weight_scaled=float(scaled.max(-1).values.mean()),
            grad_raw=float(_jacobian_norm(raw).mean()),
            grad_scaled=float(_jacobian_norm(scaled).mean())))
    return out


def render_saturation(out: Console, rows: list[Saturation], *, keys: int, trials: int, seed: int) -> None:
    out.print(Text(f"q, k with independent N(0, 1) entries; {keys} keys per query; mean over "
                   f"{trials} queries (seed {seed})"))
    out.print(Text("max weight: the largest softmax weight (1/keys = uniform, 1 = saturated); "
                   "gradient: ‖∂softmax/∂scores‖ (near 0 = nothing left to learn from)"))
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for name in ("d", "std q·k", "std q·k/√d", "max weight raw", "max weight /√d",
                 "gradient raw", "gradient /√d"):
        table.add_column(name, justify="right")
    for r in rows:
        table.add_row(str(r.d), f"{r.score_std:.2f}", f"{r.scaled_std:.2f}",
                      f"{r.max_weight_raw:.3f}", f"{r.max_weight_scaled:.3f}",
                      f"{r.grad_raw:.3f}", f"{r.grad_scaled:.3f}")
    out.print(table)
