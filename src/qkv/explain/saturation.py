"""Why divide by √d_k: with unit-variance entries, q·k has standard deviation √d, so the
unscaled softmax saturates as d grows — one weight near 1, the rest near 0 — and its gradient
(the Jacobian `diag(w) − w wᵀ`) vanishes. Dividing the scores by √d keeps both steady.

Everything is computed in float64 from a seeded generator, so the figures are reproducible.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import ClassVar

import torch

from qkv.explain.wording import ArgumentError


@dataclass(frozen=True)
class Saturation:
    """Averages over the trials for one dimension d (weights are over `keys` keys)."""

    d: int
    score_std: float          # std of q·k (≈ √d)
    scaled_std: float         # std of q·k / √d (≈ 1)
    max_weight_raw: float     # mean largest softmax weight, unscaled scores
    max_weight_scaled: float  # the same with scores / √d
    grad_raw: float           # mean Frobenius norm of the softmax Jacobian, unscaled
    grad_scaled: float        # the same, scaled

    kind: ClassVar[str] = "saturation"  # its row in qkv.explain.kinds.KINDS

    def to_dict(self) -> dict:
        """The `kind` and the fields above, by name (`qkv softmax-demo --json` prints one per d)."""
        return {"kind": self.kind, **asdict(self)}


def _jacobian_norm(w: torch.Tensor) -> torch.Tensor:
    """‖diag(w) − w wᵀ‖_F for each row of w (n, k) → (n,)."""
    jac = torch.diag_embed(w) - w.unsqueeze(-1) * w.unsqueeze(-2)  # (n, k, k)
    return jac.flatten(1).norm(dim=-1)


def saturation(dims: list[int], *, keys: int = 10, trials: int = 2000, seed: int = 0) -> list[Saturation]:
    """One `Saturation` per dimension.

    Examples:
        >>> rows = saturation([4, 1024], trials=200)
        >>> rows[1].max_weight_raw > rows[0].max_weight_raw, abs(rows[1].max_weight_scaled - rows[0].max_weight_scaled) < 0.1
        (True, True)
    """
    if not dims or any(d < 1 for d in dims):
        raise ArgumentError("dims", "{name} must be positive whole numbers, got {value}", value=dims)
    if keys < 2:
        raise ArgumentError("keys", "{name} must be at least 2, got {value}", value=keys)
    if trials < 1:
        raise ArgumentError("trials", "{name} must be at least 1, got {value}", value=trials)
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
