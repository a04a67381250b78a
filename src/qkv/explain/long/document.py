"""A long text explained exactly at O(N) memory: one forward, then any token, row, column or tile.

[`document`][qkv.explain.long.document.document] runs the model's own forward once with
`trace_rows=LSE` (`qkv.modules.lse_trace`): every attention call keeps its queries and keys (after
rotary positions), each row's log-sum-exp and its mask description — O(L · (h + h_kv) · N · d)
numbers, never an N × N matrix. Every later question is answered from those, blockwise, exactly:

```text
w_ij = exp(q_i · k_j · scale − lse_i)      (0 where the model's mask excludes j)
```

* [`Document.explain`][qkv.explain.long.document.Document.explain] — the
  [`Overview`][qkv.explain.overview.Overview] that [`qkv.explain.explain`][qkv.explain.explain]
  gives for a token (the same rows, ranking, focus and sink), without another forward: rows of q·kᵀ
  for the token, O(L · h · N);
* [`Document.weights`][qkv.explain.long.document.Document.weights] — chosen rows of one head, (rows,
  N);
* [`Document.received`][qkv.explain.long.document.Document.received] — each key's total received
  weight Σ_i w_ij (N,), the score KV-cache eviction methods such as H2O keep;
* [`Document.block_map`][qkv.explain.long.document.Document.block_map] — the sum of every (block ×
  block) tile, (⌈N/b⌉, ⌈N/b⌉): the whole map of a book at a glance;
* [`Document.scores`][qkv.explain.long.document.Document.scores] — a contribution method for one
  token's rows, for the methods that declare how to read the record (`METHODS`: the weights; `norm`,
  w_ij ‖f^h(h_j)‖ from the value norms kept from the forward; `rollout`, row vectors multiplied
  through the layers' attention, O(N) memory);
* [`Document.sinks`][qkv.explain.long.document.Document.sinks],
  [`Document.column`][qkv.explain.long.document.Document.column] — the weight every row puts on one
  key (the first token: the attention sink), O(N · d).

Each honours the mask the forward used (causal, a sliding window, packed documents, any block
mask), read from the record, not re-derived.

Examples:
    >>> import qkv
    >>> from qkv.explain.long.document import document
    >>> model = qkv.load("minilm")
    >>> doc = document(model, "the cat sat on the mat " * 40)   # 240 words + [CLS], [SEP]
    >>> doc.received(0, 0).shape, doc.block_map(0, 0, block=128).shape
    (torch.Size([242]), torch.Size([2, 2]))
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from qkv.attention.block_mask import BlockMask, block_mask_for
from qkv.attention import received as _received
from qkv.attention.received import BLOCK, attention_block_sums, attention_received
from qkv.errors import QkvError
from qkv.explain import contributions
from qkv.explain.mixer_maps import check_softmax_everywhere
from qkv.explain.contributions.base import Scores, out_weight
from qkv.explain.cost import (  # the cost model; named here too, where a document's callers look
    FIRST_CALL_BYTES, TOKEN_BYTES, available_bytes, document_cost, estimate_bytes, forward_bytes, gib as _gib, memory_allowed,
    tokenizing_bytes)
from qkv.explain.forward import block_weights, check_layer_head, check_top, encode, model_name, num_layers
from qkv.explain.overview import Overview, overview_of
from qkv.explain.select import choose, choose_in
from qkv.explain.wording import ArgumentError, too_long
from qkv.modules.intervention import Interventions
from qkv.modules.lse_trace import LSE
from qkv.text import clean_text

#: The contribution methods a Document answers from its record (those that declare ``document``;
#: the others re-run the model).
METHODS = tuple(name for name, m in contributions.METHODS.items() if m.document is not None)


@dataclass(frozen=True)
class LayerRecord:
    """One layer's self-attention, kept at O(N): what every weight is recomputed from.

    Attributes:
        query: (h, t, d) the queries the kernel read (after positions).
        key: (h_kv, s, d) the keys, likewise.
        lse: (h, t) each row's log-sum-exp (float32; −inf for a row with no key).
        mask: the [`AttentionMask`][qkv.attention.AttentionMask] the forward used.
        scale: the scores' scale, None for 1/√d.
        value_norms: (h, s) ‖f^h(h_j)‖ = ‖v^h_j W_O^h‖, what `norm` multiplies the weights by.
    """

    query: torch.Tensor
    key: torch.Tensor
    lse: torch.Tensor
    mask: object
    scale: float | None
    value_norms: torch.Tensor

    @property
    def enable_gqa(self) -> bool:
        return self.key.shape[0] != self.query.shape[0]


class Document:
    """A text after one recorded forward; answers about any token, exactly, in O(N) memory.

    Built by [`document`][qkv.explain.long.document.document]. Fields: `model`, `text`, `encoding`
    (the tokenizer's), `layers` (one [`LayerRecord`][qkv.explain.long.document.LayerRecord] per
    layer). Layers and heads count from 0.
    """

    def __init__(self, model, text: str, encoding, layers: list[LayerRecord]):
        self.model, self.text, self.encoding, self.layers = model, text, encoding, layers
        self._masks: dict = {}

    # -- sizes -------------------------------------------------------------------------------
    @property
    def tokens(self) -> list[str]:
        return list(self.encoding.tokens)

    def __len__(self) -> int:
        """N, the number of tokens."""
        return len(self.encoding.ids)

    @property
    def nbytes(self) -> int:
        """What the record holds, in bytes (queries, keys, lse, value norms of every layer)."""
        return sum(x.numel() * x.element_size() for r in self.layers
                   for x in (r.query, r.key, r.lse, r.value_norms))

    # -- the mask ----------------------------------------------------------------------------
    def block_mask(self, layer: int) -> BlockMask:
        """Layer `layer`'s mask as a [`BlockMask`][qkv.attention.BlockMask] (built once, shared by
        layers that use the same description)."""
        rec = self.layers[layer]
        key = id(rec.mask)
        if key not in self._masks:
            h, t = rec.query.shape[:2]
            self._masks[key] = block_mask_for(rec.mask, 1, h, t, rec.key.shape[1],
                                              device=rec.query.device)
        return self._masks[key]

    def _check(self, layer: int, head: int | None = None) -> LayerRecord:
        for name, value in (("layer", layer), ("head", head)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                raise ArgumentError(name, "{name} must be an int, got {value!r}", value=value)
        check_layer_head(self.model, layer, head)
        return self.layers[layer]

    def _kw(self, layer: int) -> dict:
        rec = self.layers[layer]
        return dict(block_mask=self.block_mask(layer), scale=rec.scale, enable_gqa=rec.enable_gqa)

    # -- weights, columns, sums ----------------------------------------------------------------
    def weights(self, layer: int, head: int, rows: int | Sequence[int] | torch.Tensor) -> torch.Tensor:
        """(len(rows), N): the exact weights of query `rows` in one head (float32).

        Examples:
            >>> doc.weights(0, 0, [5, 9]).sum(-1)                      # doctest: +SKIP
            tensor([1.0000, 1.0000])
        """
        self._check(layer, head)
        return self._all_heads(layer, rows, head)[0]

    def row_weights(self, layer: int, rows: Sequence[int] | torch.Tensor) -> torch.Tensor:
        """(h, r, N): every head's exact weights of query `rows` in layer `layer`."""
        self._check(layer)
        return self._all_heads(layer, rows)

    def through(self, layer: int, v: torch.Tensor) -> torch.Tensor:
        """(h, r, N): v A^{ℓ,h} for row vectors v (r, N) over the query rows — each head's
        attention applied without forming it: O(h · r · N · d) time, O(N) memory."""
        rec = self._check(layer)
        return attention_received(rec.query[None], rec.key[None], rec.lse[None], row_weights=v,
                                  **self._kw(layer))[0]

    def _all_heads(self, layer: int, rows, head: int | None = None) -> torch.Tensor:
        """(h, r, N): every head's weights of `rows` ((1, r, N): head `head`'s), by
        `qkv.explain.forward.block_weights` on the recorded q and k (the
        reference path that `trace_rows` runs, a block of rows at a time)."""
        rec = self.layers[layer]
        index = row_index(rows, rec.query.shape[1])
        heads = list(range(rec.query.shape[0])) if head is None else [head]
        return block_weights(rec.query[None], rec.key[None], heads, index, mask=rec.mask,
                             scale=rec.scale)  # (h or 1, r, N)

    def received(self, layer: int, head: int) -> torch.Tensor:
        """(N,): Σ_i w_ij, the total weight each key receives from every query row (exact).

        Under a causal mask the first token receives from every row; later ones from fewer.
        """
        rec = self._check(layer, head)
        return attention_received(rec.query[None], rec.key[None], rec.lse[None], heads=[head],
                                  **self._kw(layer))[0, 0]

    def block_map(self, layer: int, head: int, block: int = BLOCK) -> torch.Tensor:
        """(⌈N/block⌉, ⌈N/block⌉): the sum of the weights in every (block × block) tile (exact).

        Row I of tiles sums to the number of its rows that see a key (block, or fewer at the end).
        `block`: 1 … max(N, 128) ([`check_block`][qkv.explain.long.document.check_block]).
        """
        rec = self._check(layer, head)
        check_block(block, len(self))
        return attention_block_sums(rec.query[None], rec.key[None], rec.lse[None], heads=[head],
                                    block=block, **self._kw(layer))[0, 0]

    def column(self, layer: int, key: int) -> torch.Tensor:
        """(h, N): the weight every query row of every head puts on key `key` — O(h · N · d).

        0 where the mask hides `key` from a row.
        """
        rec = self._check(layer)
        return column_weights(rec, self.block_mask(layer), key, rec.key.shape[1])

    def sinks(self) -> torch.Tensor:
        """(L, h): the mean weight the rows put on the first token, per layer and head — how much
        each head parks on the attention sink (Xiao et al., 2023); exact, O(L · h · N · d)."""
        return torch.stack([self.column(layer, 0).double().mean(-1).float()
                            for layer in range(len(self.layers))])

    def top_received(self, layer: int, head: int, k: int = 10) -> list[tuple[int, float]]:
        """The `k` keys that receive the most weight in one head, as (token index, Σ_i w_ij)."""
        check_top(k)
        got = self.received(layer, head)
        values, index = got.topk(min(k, len(got)))
        return [(int(i), float(v)) for i, v in zip(index, values)]

    # -- contributions for one token -----------------------------------------------------------
    def scores(self, rows: Sequence[int] | torch.Tensor,
               method: str = contributions.DEFAULT) -> Scores:
        """A contribution method's [`Scores`][qkv.explain.contributions.Scores] for query `rows`,
        by the method's own `document` (one of `METHODS`; each says how it reads the record
        at O(N) — e.g. `rollout` as row vectors times each layer's attention, never a matrix).
        """
        m = contributions.check_method(self.model, method)
        if m.document is None:
            raise ArgumentError("method", "{name} {value!r} re-runs the model; a document answers "
                                "{known} from its one forward (use qkv.explain.explain on a shorter "
                                "text)", value=m.name, known=", ".join(METHODS))
        return m.document(self, row_index(rows, len(self)))

    def explain(self, token: str | int | None = None, *, words: bool = False, top: int = 3,
                to: str | None = None, layer: int | None = None,
                method: str = contributions.DEFAULT) -> Overview:
        """The [`Overview`][qkv.explain.overview.Overview] of one token — what
        [`qkv.explain.explain`][qkv.explain.explain] gives for `(model, text, token=…)` — from the
        record.

        Arguments as [`qkv.explain.explain`][qkv.explain.explain] (`method` one of `METHODS`).

        Examples:
            >>> ov = doc.explain(token="mat")                           # doctest: +SKIP
            >>> len(ov.rows) == doc.model.num_layers * doc.model.num_heads    # doctest: +SKIP
            True
        """
        check_top(top)
        check_layer_head(self.model, layer, None)
        units, choice = choose_in(token, self.encoding, self.text, words=words, role="token")
        focus = None if to is None else choose(to, units, role="to").unit
        scores = self.scores(units.groups[choice.unit], method)
        return overview_of(self.model, self.text, self.encoding, units, choice, scores,
                           focus=focus, top=top, layer=layer)


def column_weights(rec: LayerRecord, bm: BlockMask, key: int, n: int,
                   rows: torch.Tensor | None = None) -> torch.Tensor:
    """(h, t): the weight each recorded query row of every head puts on key `key` (of `n`),
    exp(q·k·scale − lse), 0 where the mask `bm` hides the key from a row. `rows`: the recorded
    rows' positions in the whole text (a rank's own under sharding; None = all of them)."""
    if not isinstance(key, int) or isinstance(key, bool) or not 0 <= key < n:
        raise QkvError(f"key must be a token index in 0–{n - 1}, got {key!r}")
    groups = rec.query.shape[0] // rec.key.shape[0]
    scale = rec.scale if rec.scale is not None else 1.0 / math.sqrt(rec.query.shape[-1])
    k = rec.key[:, key].repeat_interleave(groups, 0).float()  # (h, d)
    scores = torch.einsum("htd,hd->ht", rec.query.float(), k) * scale  # (h, t)
    lse = rec.lse.masked_fill(torch.isneginf(rec.lse), float("inf"))
    keep = _column_mask(bm, key, rec.query.shape[0])  # (h | 1, N)
    keep = keep if rows is None else keep[:, rows]  # (h | 1, t)
    return (scores - lse).exp().masked_fill(~keep, 0.0)


def _column_mask(bm: BlockMask, key: int, h: int) -> torch.Tensor:
    """(h or 1, t) bool: which query rows may see key `key` under `bm`."""
    rows, c = [], key // bm.block_size
    for r in range(bm.kinds.shape[-2]):
        rows.append(bm.dense_block(r, c, c + 1)[0, :, :, key - c * bm.block_size])  # (H', bq)
    return torch.cat(rows, -1) if rows else torch.zeros(1, 0, dtype=torch.bool)


def check_block(block, n: int) -> int:
    """`block` when it is a tile side of an `n`-token document
    (`qkv.attention.received.check_block`: 1 … max(n, 128)); ArgumentError naming `block`
    and the limit otherwise."""
    try:
        return _received.check_block(block, n)
    except ValueError as e:
        raise ArgumentError("block", "{value}", value=str(e)) from None


def row_index(rows, n: int) -> torch.Tensor:
    """(r,) the token indices `rows` (an int, ints, or an integer tensor) of an `n`-token
    text, at most `n` of them; QkvError naming `rows` otherwise — a float is no index
    (`torch.long` would truncate 1.9 to 1), and more rows than the text would repeat them."""
    try:
        index = torch.as_tensor(rows).reshape(-1)
    except (TypeError, ValueError, RuntimeError, OverflowError):
        index = None
    if index is None or index.dtype in (torch.bool, torch.uint8) or index.is_floating_point() \
            or index.is_complex() or len(index) > n:
        raise QkvError(f"rows must be at most {n} token indices in 0–{n - 1} (ints), got "
                       f"{_shown(rows)}")
    try:
        return torch.arange(n)[index.long()]
    except IndexError:
        raise QkvError(f"rows must be token indices in 0–{n - 1}, got {_shown(rows)}") from None


def _shown(rows) -> str:
    if isinstance(rows, torch.Tensor):
        return f"a {rows.dtype} tensor of shape {tuple(rows.shape)}"
    text = repr(rows)
    return text if len(text) <= 80 else text[:77] + "..."


# -- building one ----------------------------------------------------------------------------------
def encoded(model, text: str | bytes, *, have: int | None = None):
    """(text, the tokenizer's Encoding): bytes decoded as UTF-8; QkvError for anything but a
    text, an empty one, more tokens than the model takes, or — before the tokenizer runs — a
    text whose tokenising alone needs more than `have` bytes
    ([`tokenizing_bytes`][qkv.explain.cost.tokenizing_bytes])."""
    text = clean_text(text) if isinstance(text, (bytes, bytearray)) else text
    if not isinstance(text, str):
        raise QkvError(f"text must be a str or UTF-8 bytes, got {type(text).__name__}")
    clean_text(text)  # a lone surrogate is named here, not deep in the tokenizer
    need = tokenizing_bytes(text)
    if have is not None and need > have:
        raise QkvError(f"tokenising a text of {len(text.encode()) / 1e6:.1f} MB needs about "
                       f"{_gib(need)} but {_gib(have)} is available; give a shorter text")
    encoding = encode(model, text)  # empty text; more tokens than the tokenizer's limit
    n = len(encoding.ids)
    limit = model.tokenizer.max_length  # the protocol's: the most tokens the model takes
    if limit is not None and n > limit:
        raise too_long(n, model_name(model), limit)
    return text, encoding


def document(model, text: str | bytes, *, memory_limit: int | None = None,
             progress: Callable[[str, int, int], None] | None = None) -> Document:
    """Run `model` once over `text`, keeping what every later question needs at O(N).

    Args:
        model: a self-attention model from [`qkv.load`][qkv.load] (decoders and encoders alike).
        text: the text (`str`, or UTF-8 `bytes` as read from a file).
        memory_limit: the most bytes the whole run may hold at once, tokens included (default:
            the memory available now); checked before the tokenizer runs
            ([`tokenizing_bytes`][qkv.explain.cost.tokenizing_bytes]) and again, with N
            known, before the forward
            ([`estimate_bytes`][qkv.explain.cost.estimate_bytes]).
        progress: called as `progress(stage, done, total)` while it works — `"tokenising"`
            (0 of 1, then 1 of 1), `"forward"` (layer ℓ entered: ℓ of L) and `"recording"`
            (ℓ of L layers kept) — e.g. to draw bars (`qkv view --file` does on a terminal).

    Raises:
        QkvError: an empty text, bytes that are not UTF-8, more tokens than the model takes,
            more memory than `memory_limit` (the message says how much it would take), a
            model whose attention has a score bias (ALiBi) the blockwise kernel cannot take.

    Cost: one forward with the blockwise kernel (it returns the lse), about as long as an
    untraced forward; memory O(L · (h + 2 h_kv) · N · d).
    """
    tell = progress if progress is not None else (lambda stage, done, total: None)
    check_softmax_everywhere(model, "document()")  # a hybrid's linear layers keep no lse to record
    have = memory_allowed(memory_limit)
    tell("tokenising", 0, 1)
    text, encoding = encoded(model, text, have=have)
    tell("tokenising", 1, 1)
    n = len(encoding.ids)
    need = document_cost(model, n).bytes
    if have is not None and need > have:
        raise QkvError(f"a document of {n} tokens needs about {_gib(need)} for "
                       f"{model_name(model)}'s {num_layers(model)} layers (its tokens; queries, keys "
                       f"and values of every layer; one layer's work) but {_gib(have)} is "
                       f"available; give a shorter text")
    ids = torch.tensor([encoding.ids], dtype=torch.long)  # (1, N)
    kwargs = {}
    if "logits_to_keep" in inspect.signature(model.forward).parameters:
        kwargs["logits_to_keep"] = 1  # the logits (N × vocabulary) are not needed
    if progress is not None:  # told through the forward's own per-layer argument: no hook
        kwargs["interventions"] = _layers_told(tell, num_layers(model))
    with torch.no_grad():
        try:
            out = model(ids, torch.ones_like(ids), trace_rows=LSE, **kwargs)
        except ValueError as e:
            if "blockwise" in str(e) and "bias" in str(e):
                raise QkvError(f"{model_name(model)} adds a score bias (ALiBi) to its attention; "
                               f"a document needs the blockwise kernel, which takes none") from None
            raise
        tell("forward", num_layers(model), num_layers(model))
        layers = []
        for layer, tr in zip(model.layers, out.traces):
            layers.append(layer_record(layer.self_attn, tr.self_attn))
            tell("recording", len(layers), num_layers(model))
    check_finite_record(model, layers)
    return Document(model, text, encoding, layers)


def _layers_told(tell, L: int) -> Interventions:
    """Interventions that change nothing and tell `("forward", ℓ, L)` as layer ℓ is entered."""
    def entering(layer: int):
        def same(x: torch.Tensor) -> torch.Tensor:
            tell("forward", layer, L)
            return x
        return same

    return Interventions(inputs={layer: entering(layer) for layer in range(L)})


def layer_record(attn, trace) -> LayerRecord:
    """One layer's [`LayerRecord`][qkv.explain.long.document.LayerRecord] from its `LseTrace` (batch
    1); the values are reduced to their norms after the output projection, one head at a time (O(N ·
    E) at once)."""
    v = trace.value[0]  # (h_kv, s, dv)
    w = out_weight(attn)  # (h, dv, E)
    groups = attn.num_heads // v.shape[0]
    norms = torch.stack([(v[h // groups] @ w[h].to(v.dtype)).norm(dim=-1)
                         for h in range(attn.num_heads)]).float()  # (h, s)
    return LayerRecord(query=trace.query[0], key=trace.key[0], lse=trace.lse[0], mask=trace.mask,
                       scale=trace.scale, value_norms=norms)


def check_finite_record(model, layers: list[LayerRecord]) -> None:
    """QkvError naming the first layer and head whose log-sum-exp is NaN (a broken model)."""
    for i, rec in enumerate(layers):
        bad = torch.isnan(rec.lse).any(-1)  # (h,)
        if bool(bad.any()):
            head = int(bad.nonzero()[0])
            raise QkvError(f"layer {i}, head {head} of {model_name(model)}: the attention is NaN "
                           f"(the model computes NaN on this text)")


__all__ = ["Document", "FIRST_CALL_BYTES", "LayerRecord", "METHODS", "TOKEN_BYTES", "available_bytes", "check_block", "document",
           "encoded", "estimate_bytes", "forward_bytes", "memory_allowed", "row_index",
           "tokenizing_bytes"]
