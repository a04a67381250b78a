"""The overview: for one token (or word), every layer and head, ranked by its largest weight.

Ranking rule: heads are sorted by the **largest weight** in the chosen token's row (most focused
first); the entropy of the row (in bits) is shown beside it as a second measure of spread.

Which heads stand out: the word that most heads put their largest weight on — not counting the
token itself, its immediate neighbours (position heads) or special tokens ([CLS]/[SEP], where
heads park attention they do not need) — is the *focus*; heads whose largest weight is on it are
highlighted. ``--to WORD`` names the focus instead.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch

from qkv.explain.select import Units, group_columns

RANKING = "largest weight in the row (most focused first); entropy in bits beside it"


@dataclass(frozen=True)
class HeadRow:
    """One head's attention from the chosen unit, over the units shown.

    Fields:
        layer, head: counting from 0.
        weights: (U,) the row of weights over units (sums to 1).
        top: the ``k`` largest as (unit index, weight), largest first.
        entropy: of ``weights``, in bits.
    """

    layer: int
    head: int
    weights: torch.Tensor
    top: list[tuple[int, float]]
    entropy: float

    @property
    def max_weight(self) -> float:
        return self.top[0][1]

    @property
    def argmax(self) -> int:
        return self.top[0][0]


@dataclass(frozen=True)
class Overview:
    """Every head's row for the chosen unit, ranked; and the highlighted focus unit."""

    units: Units
    unit: int
    rows: list[HeadRow]
    focus: int | None
    focus_reason: str

    def highlighted(self, row: HeadRow) -> bool:
        return self.focus is not None and row.argmax == self.focus


def entropy_bits(p: torch.Tensor) -> torch.Tensor:
    """Shannon entropy of distributions along the last dim, in bits (0·log 0 = 0).

    Example:
        >>> entropy_bits(torch.tensor([0.5, 0.5, 0.0])).item()
        1.0
    """
    p = p.double()
    logs = torch.where(p > 0, torch.log2(p.clamp_min(1e-300)), torch.zeros_like(p))
    return -(p * logs).sum(-1)


def unit_rows(weights: torch.Tensor, units: Units) -> torch.Tensor:
    """Token-level rows of one unit (..., r, s) → its unit-level row (..., U).

    The r rows are the tokens of the chosen unit: averaged (weights *from* a word), then the
    columns summed per unit (weights *into* a word).
    """
    return group_columns(weights.mean(dim=-2), units)


def head_rows(per_layer: list[torch.Tensor], units: Units, k: int) -> list[HeadRow]:
    """One :class:`HeadRow` per (layer, head), in layer/head order.

    Args:
        per_layer: for each layer, the traced weights (h, r, s) of the chosen unit's tokens.
    """
    out = []
    for layer, w in enumerate(per_layer):
        rows = unit_rows(w.double(), units)  # (h, U)
        ent = entropy_bits(rows)
        values, index = rows.topk(min(k, rows.shape[-1]), dim=-1)  # (h, k)
        for head in range(rows.shape[0]):
            top = [(int(i), float(v)) for i, v in zip(index[head], values[head])]
            out.append(HeadRow(layer, head, rows[head], top, float(ent[head])))
    return out


def rank(rows: list[HeadRow]) -> list[HeadRow]:
    """Most focused first; ties by layer, then head, so the order is deterministic."""
    return sorted(rows, key=lambda r: (-round(r.max_weight, 12), r.layer, r.head))


def _heads(n: int) -> str:
    return "the 1 head" if n == 1 else f"the {n} heads"


def choose_focus(rows: list[HeadRow], units: Units, unit: int) -> tuple[int | None, str]:
    """The unit most heads point at, other than the chosen one, its neighbours, specials."""
    plain = [u for u in range(len(units)) if not units.special[u]]
    position = plain.index(unit) if unit in plain else None
    near = {unit}
    if position is not None:
        near |= {plain[p] for p in (position - 1, position + 1) if 0 <= p < len(plain)}
    votes = Counter(r.argmax for r in rows if not units.special[r.argmax] and r.argmax not in near)
    if not votes:
        return None, "no head puts its largest weight on a word away from the token"
    # Most heads first; ties go to the larger summed weight, then the earlier word.
    strength = Counter()
    for r in rows:
        strength[r.argmax] += r.max_weight
    focus = max(votes, key=lambda u: (votes[u], strength[u], -u))
    return focus, (f"highlighted: {_heads(votes[focus])} whose largest weight is on "
                   f"{units.labels[focus]!r}, the {units.kind} most heads point to (not counting "
                   f"{units.labels[unit]!r} itself, its neighbours or [CLS]/[SEP]); "
                   f"choose another with --to")


def overview(per_layer: list[torch.Tensor], units: Units, unit: int, *, k: int = 3,
             focus: int | None = None, layer: int | None = None) -> Overview:
    """Rank every head by how it spreads the chosen unit's attention.

    Args:
        per_layer: for each layer, the traced weights (h, r, s) for the r tokens of ``unit``.
        units: the units shown; ``unit`` is the chosen one.
        k: how many of the largest weights to keep per head.
        focus: a unit to highlight (``--to``); None picks it as the module docstring says.
        layer: keep only this layer's heads.

    Example:
        >>> from qkv.explain.select import token_units
        >>> from types import SimpleNamespace as E
        >>> u = token_units(E(tokens=["a", "b", "c"], special=[0, 0, 0]))
        >>> w = [torch.tensor([[[0.125, 0.125, 0.75]], [[0.5, 0.25, 0.25]]])]   # 1 layer, 2 heads, r=1
        >>> ov = overview(w, u, 2, k=1)
        >>> [(r.layer, r.head, r.top) for r in ov.rows]
        [(0, 0, [(2, 0.75)]), (0, 1, [(0, 0.5)])]
    """
    rows = head_rows(per_layer, units, k)
    if layer is not None:
        rows = [r for r in rows if r.layer == layer]
    if focus is None:
        focus, reason = choose_focus(rows, units, unit)
    else:
        n = sum(r.argmax == focus for r in rows)
        reason = f"highlighted: {_heads(n)} whose largest weight is on {units.labels[focus]!r} (--to)"
    return Overview(units=units, unit=unit, rows=rank(rows), focus=focus, focus_reason=reason)


def overview_json(ov: Overview, *, tokens: list[str], model: str, text: str) -> dict:
    """Every number of the overview, for ``--json``."""
    return {
        "model": model,
        "text": text,
        "tokens": tokens,
        "units": ov.units.labels,
        "words": ov.units.words,
        "word_rule": "weights into a word summed over its tokens, from a word averaged"
        if ov.units.words else None,
        "unit_index": ov.unit,
        "unit": ov.units.labels[ov.unit],
        "token_indices": list(ov.units.groups[ov.unit]),
        "ranking": RANKING,
        "focus": ov.units.labels[ov.focus] if ov.focus is not None else None,
        "heads": [
            {"layer": r.layer, "head": r.head, "max_weight": r.max_weight,
             "argmax": ov.units.labels[r.argmax], "entropy_bits": r.entropy,
             "highlighted": ov.highlighted(r),
             "top": [{"index": i, "unit": ov.units.labels[i], "weight": w} for i, w in r.top],
             "weights": r.weights.tolist()}
            for r in ov.rows
        ],
    }
