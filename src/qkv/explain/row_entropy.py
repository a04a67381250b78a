"""How focused each query is in one head: the entropy of every row of the head's map.

Row i of a head's map is where query i looks (it sums to 1). Its Shannon entropy in bits says how
spread that look is: 0 bits is all weight on one key, log2(k) bits an even spread over k keys. The
overview shows it for the selected token in every head; this is every token in one head, beside
the key each row weights most.

Examples:
    >>> import qkv
    >>> r = row_entropy(qkv.load("minilm"), "the cat sat", layer=0, head=0)
    >>> len(r.entropy), bool((r.entropy >= 0).all()), bool((r.entropy <= r.bound + 1e-9).all())
    (5, True, True)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from qkv.explain.maps import AttentionMap, attention_map
from qkv.explain.overview import entropy_bits


@dataclass(frozen=True)
class RowEntropy:
    """One head's map ([`AttentionMap`][qkv.explain.maps.AttentionMap]) read by its rows: `entropy`
    (U,) float64 bits of each row, `argmax` (U,) the key each row weights most."""

    kind: ClassVar[str] = "row-entropy"  # its row in qkv.explain.kinds.KINDS

    map: AttentionMap

    @property
    def entropy(self) -> torch.Tensor:
        return entropy_bits(self.map.weights.double())  # (U, U) → (U,)

    @property
    def argmax(self) -> torch.Tensor:
        return self.map.weights.argmax(-1)  # (U,)

    @property
    def bound(self) -> float:
        """log2(U): the entropy of a row spread evenly over every key."""
        return math.log2(len(self.map.units))

    def to_dict(self) -> dict:
        """`entropy[i]` bits of row i; `argmax[i]` its most-weighted key; `bound` log2(U)."""
        m = self.map
        return {"kind": self.kind, "model": m.model, "text": m.text, "units": m.units.labels,
                "words": m.units.words, "layer": m.layer, "head": m.head, "bound": self.bound,
                "entropy": self.entropy.tolist(), "argmax": self.argmax.tolist(),
                "max_weight": self.map.weights.max(-1).values.tolist()}


def row_entropy(model, text: str, *, layer: int, head: int, words: bool = False) -> RowEntropy:
    """The entropy of every row of one head's map, from the forward's own map
    ([`attention_map`][qkv.explain.maps.attention_map]; `words=True`: over words)."""
    return RowEntropy(attention_map(model, text, layer=layer, head=head, words=words))
