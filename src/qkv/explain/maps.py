"""One head's whole attention map over a text — what a heat map of the head draws.

Unlike :func:`qkv.explain.explain_head`, which traces one query row, this keeps every row:
O(t · s) numbers for one head (the forward still traces all heads of all layers for those rows).
With ``words=True`` the map is regrouped into words (into a word summed, from a word averaged;
see :mod:`qkv.explain.select`).
"""

from __future__ import annotations

from typing import ClassVar

from dataclasses import dataclass

import torch

from qkv.explain.forward import check_layer_head, check_text, model_name, trace
from qkv.explain.select import Units, group_columns, group_rows


@dataclass(frozen=True)
class AttentionMap:
    """Head ``head`` of layer ``layer``: ``weights`` (U, U), rows from, columns to ``units``."""

    kind: ClassVar[str] = "map"  # its row in qkv.explain.kinds.KINDS

    model: str
    text: str
    units: Units
    layer: int
    head: int
    weights: torch.Tensor

    def to_dict(self) -> dict:
        """``weights[i][j]``: from unit i to unit j (finite: every row sums to 1)."""
        return {"kind": self.kind, "model": self.model, "text": self.text, "units": self.units.labels,
                "words": self.units.words, "layer": self.layer, "head": self.head,
                "weights": self.weights.tolist()}


def attention_map(model, text: str, *, layer: int, head: int, words: bool = False) -> AttentionMap:
    """The (U, U) attention map of one head on ``text``, as the forward computed it.

    Raises:
        ArgumentError: ``layer``/``head`` out of range. QkvError: an empty text.

    Example:
        >>> import qkv
        >>> m = attention_map(qkv.load("minilm"), "the cat sat", layer=0, head=0)
        >>> m.units.labels, m.weights.shape, m.weights.sum(-1).allclose(torch.ones(5, dtype=torch.float64))
        (['[CLS]', 'the', 'cat', 'sat', '[SEP]'], torch.Size([5, 5]), True)
    """
    check_text(text)
    check_layer_head(model, layer, head)
    traced = trace(model, text, slice(None), words=words)
    w = traced.weights(layer)[head].double()  # (t, s)
    if words:
        w = group_rows(group_columns(w, traced.units), traced.units)  # (U, U)
    return AttentionMap(model=model_name(model), text=text, units=traced.units, layer=layer,
                        head=head, weights=w)


@dataclass(frozen=True)
class AttentionMaps:
    """Every head's map from one forward: ``weights`` (L, H, U, U), rows from, columns to ``units``.

    :meth:`head` gives one head as the :class:`AttentionMap` :func:`attention_map` returns.
    """

    kind: ClassVar[str] = "maps"  # its row in qkv.explain.kinds.KINDS

    model: str
    text: str
    units: Units
    weights: torch.Tensor

    def to_dict(self) -> dict:
        """``weights[l][h][i][j]``: layer l, head h, from unit i to unit j."""
        return {"kind": self.kind, "model": self.model, "text": self.text, "units": self.units.labels,
                "words": self.units.words, "weights": self.weights.tolist()}

    def head(self, layer: int, head: int) -> AttentionMap:
        return AttentionMap(model=self.model, text=self.text, units=self.units, layer=layer,
                            head=head, weights=self.weights[layer, head])


def attention_maps(model, text: str, *, words: bool = False) -> AttentionMaps:
    """Every layer's and head's (U, U) map on ``text`` from one forward (what a viewer keeps).

    O(L · H · t · s) numbers: one forward instead of one per head.

    Example:
        >>> import qkv
        >>> ms = attention_maps(qkv.load("minilm"), "the cat sat")
        >>> ms.weights.shape, torch.equal(ms.head(2, 3).weights,
        ...                               attention_map(qkv.load("minilm"), "the cat sat", layer=2, head=3).weights)
        (torch.Size([6, 12, 5, 5]), True)
    """
    check_text(text)
    traced = trace(model, text, slice(None), words=words)
    w = torch.stack(traced.layer_weights()).double()  # (L, H, t, s)
    if words:
        w = group_rows(group_columns(w, traced.units), traced.units)  # (L, H, U, U)
    return AttentionMaps(model=model_name(model), text=text, units=traced.units, weights=w)
