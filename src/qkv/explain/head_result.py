"""The fields every one-head result on one text names, once (`HeadResult`).

An attention map, an effective map, a gated head's record and an indexer's selection each say
which model, text, units, layer and head they are about; they extend this record.
"""

from __future__ import annotations

from dataclasses import dataclass

from qkv.explain.select import Units


@dataclass(frozen=True)
class HeadResult:
    """Head `head` of layer `layer` of `model` (its name) on `text`, its rows and columns `units`.

    Examples:
        >>> issubclass(__import__("qkv.explain.maps", fromlist=["AttentionMap"]).AttentionMap, HeadResult)
        True
    """

    model: str
    text: str
    units: Units
    layer: int
    head: int


__all__ = ["HeadResult"]
