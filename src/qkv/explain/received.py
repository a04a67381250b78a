"""How much attention each key receives in one head: column sums of the head's map.

Row i of a head's map is where query i looks (it sums to 1); column j summed over every query,
`received[j] = Σ_i w_ij`, is how much of the head's attention lands on key j. The column sums
add up to the number of query rows U, and a key no query looks at receives 0. A "sink" token
(the first token of a decoder, `[SEP]` in BERT) shows as a column receiving far more than 1.

Examples:
    >>> import qkv
    >>> r = attention_received(qkv.load("minilm"), "the cat sat", layer=0, head=0)
    >>> len(r.received), round(float(r.received.sum()), 6)           # U keys, Σ = U rows
    (5, 5.0)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from qkv.explain.maps import AttentionMap, attention_map


@dataclass(frozen=True)
class AttentionReceived:
    """One head's map ([`AttentionMap`][qkv.explain.maps.AttentionMap]) read by its columns:
    `received` (U,) float64, Σ over the query rows of each key's weight."""

    kind: ClassVar[str] = "received"  # its row in qkv.explain.kinds.KINDS

    map: AttentionMap

    @property
    def received(self) -> torch.Tensor:
        return self.map.weights.sum(0)  # (U, U) → (U,): summed over the query rows

    def to_dict(self) -> dict:
        """`received[j]` = Σ_i w_ij; `rows`: how many queries that sums over."""
        m = self.map
        return {"kind": self.kind, "model": m.model, "text": m.text, "units": m.units.labels,
                "words": m.units.words, "layer": m.layer, "head": m.head, "rows": len(m.units),
                "received": self.received.tolist()}


def attention_received(model, text: str, *, layer: int, head: int,
                       words: bool = False) -> AttentionReceived:
    """Each key's total weight Σ_i w_ij in one head, from the forward's own map
    ([`attention_map`][qkv.explain.maps.attention_map]; `words=True`: over words)."""
    return AttentionReceived(attention_map(model, text, layer=layer, head=head, words=words))
