"""One head's whole attention map over a text — what a heat map of the head draws.

Unlike [`qkv.explain.explain_head`][qkv.explain.explain_head], which traces one query row, this
keeps every row: O(t · s) numbers for one head and nothing else of that size. The forward stops
after the layer asked for and keeps that layer's q, k and lse (`qkv.explain.forward.trace_layer`,
O(t) per head); the head's rows are then its softmax rows by the reference path, a block at a time,
in the dtype the attention computed in (float32 for fp32/bf16/fp16 models).
[`attention_maps`][qkv.explain.maps.attention_maps] with `layer=L` gives one layer's heads the same
way; without it, every layer's from one forward. With `words=True` the map is regrouped into words
(into a word summed, from a word averaged; see `qkv.explain.select`).

A transformers model behind qkv's attention stops after the layer too (its layer loop is cut by
a hook); where it cannot — the layer mixes by transformers' own code, or its scores carry a bias,
a soft cap or sinks that an lse record does not keep — it is traced whole, every row of every
layer, and `stops_at_layer` says why.

Before the forward, each entry point asks the cost model
([`map_cost`][qkv.explain.cost.map_cost]) what the request would hold at its peak, and refuses in
one line what exceeds the memory available, pointing to
[`document`][qkv.explain.long.document.document] (O(N) memory) for a long text.
"""

from __future__ import annotations

from typing import ClassVar

from dataclasses import dataclass

import torch

from qkv.explain.cost import EVERY, HEAD, LAYER, available_bytes, check_fits, map_cost
from qkv.explain.head_result import HeadResult
from qkv.explain.cross import cross_pass
from qkv.explain.forward import (
    check_layer_head, check_text, device_of, encode, model_name, num_heads, num_layers, stops_at_layer, trace, trace_layer,
)
from qkv.explain.finite import NonFiniteError
from qkv.explain.mixer_maps import effective_layer, mixer_map, softmax_rows
from qkv.explain.wording import ArgumentError
from qkv.models.protocol import capabilities_of
from qkv.explain.select import Units, group_columns, group_rows


@dataclass(frozen=True)
class AttentionMap(HeadResult):
    """Head `head` of layer `layer`: `weights` (U, U), rows from, columns to `units`
    (float32 for fp32, bf16 and fp16 models: the dtype the attention computed in)."""

    kind: ClassVar[str] = "map"  # its row in qkv.explain.kinds.KINDS

    weights: torch.Tensor

    def to_dict(self) -> dict:
        """`weights[i][j]`: from unit i to unit j (finite: every row sums to 1)."""
        return {"kind": self.kind, "model": self.model, "text": self.text, "units": self.units.labels,
                "words": self.units.words, "layer": self.layer, "head": self.head,
                "weights": self.weights.tolist()}


def attention_map(model, text: str, *, layer: int, head: int, words: bool = False) -> AttentionMap:
    """The (U, U) attention map of one head on `text`, as the forward computed it.

    Raises:
        ArgumentError: `layer`/`head` out of range. QkvError: an empty text; a text whose map
            would take more memory than is available
            ([`map_cost`][qkv.explain.cost.map_cost]; the message names the length, the estimate
            and the memory, and points to [`document`][qkv.explain.long.document.document]).

    Examples:
        >>> import qkv
        >>> m = attention_map(qkv.load("minilm"), "the cat sat", layer=0, head=0)
        >>> m.units.labels, m.weights.shape, m.weights.sum(-1).allclose(torch.ones(5))
        (['[CLS]', 'the', 'cat', 'sat', '[SEP]'], torch.Size([5, 5]), True)
    """
    check_text(text)
    if effective_layer(model, layer):  # linear / state-space: the exact o = M·v (qkv.explain.mixer_maps)
        return mixer_map(model, text, layer=layer, head=head, words=words)
    check_layer_head(model, layer, head)
    _check_cost(model, text, HEAD, layer, words)
    units, w = _layer_weights(model, text, layer, [head], words)  # (1, t, s)
    return AttentionMap(model=model_name(model), text=text, units=units, layer=layer,
                        head=head, weights=w[0])


def _check_cost(model, text: str, request: str, layer: int | None, words: bool) -> None:
    """QkvError, one line, when `request`'s maps of `text` would take more memory than is
    available ([`map_cost`][qkv.explain.cost.map_cost], checked before the forward runs); a
    text longer than the model takes is named first (`encode`)."""
    t = len(encode(model, text).ids)
    check_fits(model, map_cost(model, t, request, layer=layer, words=words),
               available_bytes(device_of(model)))  # the maps are made where the model runs


def _layer_weights(model, text: str, layer: int, heads: list[int], words: bool):
    """(units, (len(heads), U, U)): some heads of one layer, from a forward that stops there
    (`stops_at_layer`), else from a whole traced forward."""
    if stops_at_layer(model, layer):
        (rec,) = trace_layer(model, text, layer, words=words)
        units, w = rec.units, rec.weights(heads)  # (H, t, s)
        _check_finite(model, text, layer, w)
    else:
        traced = trace(model, text, slice(None), words=words)
        units, w = traced.units, traced.weights(layer)[heads]  # (H, t, s)
    if words:
        w = group_rows(group_columns(w, units), units)  # (H, U, U)
    return units, w


@dataclass(frozen=True)
class AttentionMaps:
    """Every head's map from one forward: `weights` (L, H, U, U), rows from, columns to `units`
    — or, with `layer` set, that layer's heads alone: `weights` (1, H, U, U).

    [`head`][qkv.explain.maps.AttentionMaps.head] gives one head as the
    [`AttentionMap`][qkv.explain.maps.AttentionMap]
    [`attention_map`][qkv.explain.maps.attention_map] returns.

    An encoder-decoder's maps (from one teacher-forced forward) add: `target_units` (the t
    target tokens, the queries), `cross` (L, H, t, s): decoder row j — the position that
    produces target token j — over the s source `units`, and `decoder` (L, H, t, t): the
    decoder's self-attention; `weights` is then the encoder's self-attention (L_enc, H, s, s).
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
    layer: int | None = None

    def to_dict(self) -> dict:
        """`weights[l][h][i][j]`: layer l, head h, from unit i to unit j (and, for an
        encoder-decoder, `cross[l][h][j][i]` from target token j to source token i,
        `decoder[l][h][j][k]`)."""
        doc = {"kind": self.kind, "model": self.model, "text": self.text, "units": self.units.labels,
               "words": self.units.words, "weights": self.weights.tolist()}
        if self.layer is not None:  # weights[0] is that layer's
            doc["layer"] = self.layer
        if self.cross is not None:
            doc |= {"target_units": self.target_units.labels, "cross": self.cross.tolist(),
                    "decoder": self.decoder.tolist()}
        return doc

    def head(self, layer: int, head: int) -> AttentionMap:
        """Head `head` of layer `layer` (one the maps hold: `self.layer` when it is set)."""
        first = 0 if self.layer is None else self.layer
        if not 0 <= layer - first < self.weights.shape[0]:
            raise ArgumentError("layer", "{name} {value} is not among these maps' layers "
                                "({first}–{last})", value=layer, first=first,
                                last=first + self.weights.shape[0] - 1)
        return AttentionMap(model=self.model, text=self.text, units=self.units, layer=layer,
                            head=head, weights=self.weights[layer - first, head])


def attention_maps(model, text: str, *, layer: int | None = None, words: bool = False,
                   target: str | None = None) -> AttentionMaps:
    """Every layer's and head's (U, U) map on `text` from one forward (what a viewer keeps),
    or, with `layer`, that layer's heads: a forward that stops after it.

    O(L · H · t · s) numbers (O(H · t · s) for one layer): one forward instead of one per head.
    The weights are in the dtype the attention computed in (float32 for fp32/bf16/fp16 models).

    For a model with cross-attention (an encoder-decoder), `text` is the source and the forward
    is teacher-forced on `target` — tokenised as the model trains on it
    (`tokenizer(text_target=target)`, end-of-sequence included, shifted behind the decoder start
    token by the model's own forward) — or, with `target=None`, on the model's own greedy
    translation; `.cross` is (L, H, t, s) (see [`AttentionMaps`][qkv.explain.maps.AttentionMaps]).

    Raises:
        ArgumentError: `target` given to a model without cross-attention, empty, or longer
            than the model's positions; `words=True` or `layer` with an encoder-decoder;
            `layer` out of range.
        QkvError: a text whose maps would take more memory than is available
            ([`map_cost`][qkv.explain.cost.map_cost]; one line naming the length, the estimate and
            the memory, pointing to [`document`][qkv.explain.long.document.document]).

    Examples:
        >>> import qkv
        >>> ms = attention_maps(qkv.load("minilm"), "the cat sat")
        >>> ms.weights.shape, torch.equal(ms.head(2, 3).weights,
        ...                               attention_map(qkv.load("minilm"), "the cat sat", layer=2, head=3).weights)
        (torch.Size([6, 12, 5, 5]), True)
        >>> attention_maps(qkv.load("minilm"), "the cat sat", layer=2).weights.shape
        torch.Size([1, 12, 5, 5])
    """
    check_text(text)
    caps = capabilities_of(model)
    if caps.cross_attention:
        if layer is not None:
            raise ArgumentError("layer", "{name} picks a self-attention layer; an encoder-decoder's "
                                "maps come from one teacher-forced forward (leave {name} out)")
        return _seq2seq_maps(model, text, words=words, target=target)
    if target is not None:
        raise ArgumentError("target", "{name} is for encoder-decoders (the translation to "
                            "teacher-force); {model} has no cross-attention: leave {name} out",
                            model=model_name(model))
    check_layer_head(model, layer, None)
    _check_cost(model, text, EVERY if layer is None else LAYER, layer, words)
    heads = list(range(num_heads(model)))  # layer 0 of a hybrid may mix by a linear layer
    if layer is not None:
        units, w = _layer_weights(model, text, layer, heads, words)
        return AttentionMaps(model=model_name(model), text=text, units=units, weights=w[None],
                             layer=layer)  # (1, H, U, U)
    if all(stops_at_layer(model, i) for i in range(num_layers(model))):
        # one forward keeping every layer's q, k, lse (O(L · t) per head), then each layer's maps
        records = trace_layer(model, text, None, words=words)
        units, w = records[0].units, torch.stack([r.weights(heads) for r in records])  # (L, H, t, s)
        _check_finite(model, text, num_layers(model) - 1, w.flatten(0, 1))
    else:
        traced = trace(model, text, slice(None), words=words)
        units, w = traced.units, torch.stack(softmax_rows(model, traced))  # (L, H, t, s); zeros where no softmax mixes
    if words:
        w = group_rows(group_columns(w, units), units)  # (L, H, U, U)
    return AttentionMaps(model=model_name(model), text=text, units=units, weights=w)


def _check_finite(model, text: str, layer: int, w: torch.Tensor) -> None:
    """NonFiniteError naming the first layer and head that computed NaN or infinity, when `w`
    (H, t, s) is not finite: the first such row is traced again through every layer up to
    `layer` (`qkv.explain.finite.check_layers` names where it starts).

    Each row's sum finds them: weights are in [0, 1], so a row sums to at most s unless it holds
    NaN or ±infinity — (H, t) numbers, where `~isfinite(w)` would make a float and two bool
    temporaries of w's size (1.5× a float32 map: +6 GiB beside a 32k-token map)."""
    bad = ~torch.isfinite(w.sum(-1))  # (H, t)
    if not bool(bad.any()):
        return
    row = int(bad.any(0).nonzero()[0])
    trace(model, text, torch.tensor([row], device=w.device), last_layer=layer)  # raises, named
    raise NonFiniteError(f"{model_name(model)} computes non-finite attention weights in layer "
                         f"{layer} (row {row})")


def _seq2seq_maps(model, text: str, *, words: bool, target: str | None) -> AttentionMaps:
    """An encoder-decoder's maps from one teacher-forced forward
([`qkv.explain.cross.cross_pass`][qkv.explain.cross.cross_pass])."""
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
