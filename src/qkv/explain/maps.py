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

from qkv.explain.cross import cross_pass
from qkv.explain.forward import check_layer_head, check_text, model_name, trace
from qkv.explain.mixer_maps import effective_layer, mixer_map, softmax_rows
from qkv.explain.wording import ArgumentError
from qkv.models.protocol import capabilities_of
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
    if effective_layer(model, layer):  # linear / state-space: the exact o = M·v (qkv.explain.mixer_maps)
        return mixer_map(model, text, layer=layer, head=head, words=words)
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

    An encoder-decoder's maps (from one teacher-forced forward) add: ``target_units`` (the t
    target tokens, the queries), ``cross`` (L, H, t, s): decoder row j — the position that
    produces target token j — over the s source ``units``, and ``decoder`` (L, H, t, t): the
    decoder's self-attention; ``weights`` is then the encoder's self-attention (L_enc, H, s, s).
    All three are None for a model without cross-attention.
    """

    kind: ClassVar[str] = "maps"  # its row in qkv.explain.kinds.KINDS

    model: str
    text: str
    units: Units
    weights: torch.Tensor
    target_units: Units | None = None
    cross: torch.Tensor | None = None
    decoder: torch.Tensor | None = None

    def to_dict(self) -> dict:
        """``weights[l][h][i][j]``: layer l, head h, from unit i to unit j (and, for an
        encoder-decoder, ``cross[l][h][j][i]`` from target token j to source token i,
        ``decoder[l][h][j][k]``)."""
        doc = {"kind": self.kind, "model": self.model, "text": self.text, "units": self.units.labels,
               "words": self.units.words, "weights": self.weights.tolist()}
        if self.cross is not None:
            doc |= {"target_units": self.target_units.labels, "cross": self.cross.tolist(),
                    "decoder": self.decoder.tolist()}
        return doc

    def head(self, layer: int, head: int) -> AttentionMap:
        return AttentionMap(model=self.model, text=self.text, units=self.units, layer=layer,
                            head=head, weights=self.weights[layer, head])


def attention_maps(model, text: str, *, words: bool = False, target: str | None = None) -> AttentionMaps:
    """Every layer's and head's (U, U) map on ``text`` from one forward (what a viewer keeps).

    O(L · H · t · s) numbers: one forward instead of one per head.

    For a model with cross-attention (an encoder-decoder), ``text`` is the source and the forward
    is teacher-forced on ``target`` — tokenised as the model trains on it
    (``tokenizer(text_target=target)``, end-of-sequence included, shifted behind the decoder start
    token by the model's own forward) — or, with ``target=None``, on the model's own greedy
    translation; ``.cross`` is (L, H, t, s) (see :class:`AttentionMaps`).

    Raises:
        ArgumentError: ``target`` given to a model without cross-attention, empty, or longer
            than the model's positions; ``words=True`` with an encoder-decoder.

    Example:
        >>> import qkv
        >>> ms = attention_maps(qkv.load("minilm"), "the cat sat")
        >>> ms.weights.shape, torch.equal(ms.head(2, 3).weights,
        ...                               attention_map(qkv.load("minilm"), "the cat sat", layer=2, head=3).weights)
        (torch.Size([6, 12, 5, 5]), True)
    """
    check_text(text)
    caps = capabilities_of(model)
    if caps.cross_attention:
        return _seq2seq_maps(model, text, words=words, target=target)
    if target is not None:
        raise ArgumentError("target", "{name} is for encoder-decoders (the translation to "
                            "teacher-force); {model} has no cross-attention: leave {name} out",
                            model=model_name(model))
    traced = trace(model, text, slice(None), words=words)
    w = torch.stack(softmax_rows(model, traced)).double()  # (L, H, t, s); zeros where no softmax mixes
    if words:
        w = group_rows(group_columns(w, traced.units), traced.units)  # (L, H, U, U)
    return AttentionMaps(model=model_name(model), text=text, units=traced.units, weights=w)


def _seq2seq_maps(model, text: str, *, words: bool, target: str | None) -> AttentionMaps:
    """An encoder-decoder's maps from one teacher-forced forward (:func:`qkv.explain.cross.cross_pass`)."""
    if words:
        raise ArgumentError("words", "{name} groups a self-attention model's tokens; an "
                            "encoder-decoder's maps are per token (leave {name} out)")
    cp = cross_pass(model, text, target)
    def units(labels, special):
        return Units(labels=list(labels), groups=[(i,) for i in range(len(labels))],
                     special=list(special), words=False, num_tokens=len(labels))
    return AttentionMaps(model=model_name(model), text=text, weights=cp.encoder.double(),  # (L_enc, H, s, s)
                         units=units(cp.source, [False] * len(cp.source)),
                         target_units=units(cp.target, cp.special),
                         cross=cp.cross.double(), decoder=cp.decoder.double())  # (L, H, t, s), (L, H, t, t)
