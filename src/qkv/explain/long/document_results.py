"""What a [`Document`][qkv.explain.long.document.Document] answers, as typed results with a `kind`.

A Document's methods return tensors; what shows them by their `kind` (the rows of
`qkv.explain.kinds.KINDS` marked `document`: `qkv view --file`) gets these records,
each with a complete `to_dict()`. Every number is the Document's own — these only select and
label it:

* `overview` → `DocumentOverview`: `doc.explain(token=…)` (the same Overview
  [`qkv.explain.explain`][qkv.explain.explain] gives), without the document's text and token labels
  (sent once);
* `block_map` → `BlockMap`: `doc.block_map(layer, head, block)`, every tile's sum;
* `weight_rows` → `WeightRows`: `doc.weights(layer, head, rows)` for a run of
  query rows, cut to a run of keys (a zoomed region of the map);
* `received` → `KeysReceived`: `doc.received(layer, head)` and its largest keys.

Examples:
    >>> import qkv
    >>> from qkv.explain.long.document import document
    >>> doc = document(qkv.load("minilm"), "the cat sat on the mat " * 40)
    >>> block_map(doc, layer=0, head=0, block=128).to_dict()["shape"]
    [2, 2]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from qkv.attention.received import BLOCK
from qkv.explain.overview import Overview
from qkv.explain.wording import ArgumentError

MAX_ROWS = 512  # query rows in one weight_rows answer (rows × keys float32 travel to a page)
TOP = 10  # keys listed by received()
MAX_TILES = 1024  # tiles a side in one block_map answer (1024² float32 = 4 MB)


@dataclass(frozen=True)
class DocumentOverview:
    """`doc.explain(token=…)`'s [`Overview`][qkv.explain.overview.Overview], as a document sends it.

    `to_dict()` is the Overview's without `text`, `tokens`, `units` and `special` — the
    document's, the same for every token (`describe` holds them) — so a token switch in a
    book does not resend the book.
    """

    kind: ClassVar[str] = "document-overview"

    overview: Overview

    def to_dict(self) -> dict:
        d = self.overview.to_dict()
        for key in ("text", "tokens", "units", "special"):
            d.pop(key)
        return d | {"kind": self.kind}


@dataclass(frozen=True)
class BlockMap:
    """`tiles[I, J]`: the sum of one head's weights from query rows `I·block …` to keys
    `J·block …` (exact; row I sums to the number of its rows that see a key). `tokens`: N."""

    kind: ClassVar[str] = "block-map"
    values: ClassVar[str] = "tiles"  # the field holding the numbers (a viewer sends it as bytes)

    layer: int
    head: int
    block: int
    tokens: int
    tiles: torch.Tensor  # (⌈N/block⌉, ⌈N/block⌉) float32

    def header(self) -> dict:
        """Everything but `tiles`."""
        return {"kind": self.kind, "layer": self.layer, "head": self.head, "block": self.block,
                "tokens": self.tokens, "shape": list(self.tiles.shape)}

    def to_dict(self) -> dict:
        return self.header() | {"tiles": self.tiles.tolist()}


@dataclass(frozen=True)
class WeightRows:
    """One head's exact weights of query rows `rows[0] ≤ i < rows[1]` on keys
    `keys[0] ≤ j < keys[1]`: `weights` (rows, keys) float32 (a region of the map)."""

    kind: ClassVar[str] = "weight-rows"
    values: ClassVar[str] = "weights"

    layer: int
    head: int
    rows: tuple[int, int]
    keys: tuple[int, int]
    weights: torch.Tensor

    def header(self) -> dict:
        """Everything but `weights`."""
        return {"kind": self.kind, "layer": self.layer, "head": self.head, "rows": list(self.rows),
                "keys": list(self.keys), "shape": list(self.weights.shape)}

    def to_dict(self) -> dict:
        return self.header() | {"weights": self.weights.tolist()}


@dataclass(frozen=True)
class KeysReceived:
    """Each key's total weight Σ_i w_ij in one head (`received`, (N,) float32, over `rows`
    query rows) and the `top` keys that receive the most, as (token index, Σ_i w_ij)."""

    kind: ClassVar[str] = "document-received"
    values: ClassVar[str] = "received"

    layer: int
    head: int
    rows: int
    received: torch.Tensor
    top: list[tuple[int, float]]

    def header(self) -> dict:
        """Everything but `received`."""
        return {"kind": self.kind, "layer": self.layer, "head": self.head, "rows": self.rows,
                "top": [{"index": i, "received": v} for i, v in self.top]}

    def to_dict(self) -> dict:
        return self.header() | {"received": self.received.tolist()}


def describe(doc) -> dict:
    """What stays the same for every question about `doc`: its tokens (`units`: the labels an
    overview names them by), sizes and the methods it answers."""
    from qkv.explain.long.document import METHODS
    from qkv.explain.forward import model_name, num_layers
    from qkv.explain.select import units_for

    model, units = doc.model, units_for(doc.encoding, doc.text, False)
    return {"model": model_name(model), "units": units.labels, "special": list(units.special),
            "num_tokens": len(doc),
            "num_layers": num_layers(model), "num_heads": doc.layers[0].query.shape[0],
            "methods": list(METHODS), "record_bytes": doc.nbytes}


def overview(doc, *, token: str | None = None, method: str = "weight") -> DocumentOverview:
    """`doc.explain(token=token, method=method)` (the last token when `token` is None)."""
    return DocumentOverview(doc.explain(token=token, method=method))


def block_map(doc, *, layer: int, head: int, block: int = BLOCK) -> BlockMap:
    """Every (block × block) tile's sum of one head's weights: `block` from the smallest that
    makes at most `MAX_TILES` a side to the widest a tile can be (`check_block`)."""
    from qkv.explain.long.document import check_block

    n = len(doc)
    check_block(block, n)
    if -(-n // block) > MAX_TILES:
        raise ArgumentError("block", "{name} {value} makes {tiles} tiles a side for {n} tokens; at "
                            "most {most}: give a block of at least {least}", value=block,
                            tiles=-(-n // block), n=n, most=MAX_TILES, least=-(-n // MAX_TILES))
    return BlockMap(layer, head, block, n, doc.block_map(layer, head, block=block))


def _span(name: str, start: int, stop: int | None, n: int) -> tuple[int, int]:
    stop = n if stop is None else stop
    if not 0 <= start < stop <= n:
        raise ArgumentError(name, "{name} must be a run start < stop within 0–{n}, got "
                            "{value}", value=f"{start}–{stop}", n=n)
    return start, stop


def weight_rows(doc, *, layer: int, head: int, start: int, stop: int, key_start: int = 0,
                key_stop: int | None = None) -> WeightRows:
    """Query rows `start ≤ i < stop` (at most `MAX_ROWS`) of one head, on keys
    `key_start ≤ j < key_stop` (default: every key)."""
    n = len(doc)
    rows, keys = _span("rows", start, stop, n), _span("keys", key_start, key_stop, n)
    if rows[1] - rows[0] > MAX_ROWS:
        raise ArgumentError("rows", "{name}: at most {most} at once, got {value}",
                            most=MAX_ROWS, value=rows[1] - rows[0])
    w = doc.weights(layer, head, torch.arange(*rows))  # (r, N)
    return WeightRows(layer, head, rows, keys, w[:, keys[0]:keys[1]].contiguous())


def received(doc, *, layer: int, head: int, top: int = TOP) -> KeysReceived:
    """Each key's Σ_i w_ij in one head, and the `top` keys (ranked as
    [`top_received`][qkv.explain.long.document.Document.top_received] ranks them, from the same
    sums)."""
    got = doc.received(layer, head)  # (N,)
    values, index = got.topk(min(top, len(got)))
    return KeysReceived(layer, head, doc.layers[layer].query.shape[1], got,
                        [(int(i), float(v)) for i, v in zip(index, values)])


__all__ = ["BlockMap", "DocumentOverview", "KeysReceived", "WeightRows", "block_map", "describe",
           "overview", "received", "weight_rows"]
