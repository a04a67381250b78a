"""One traced forward pass over one text: the only source of the numbers `qkv explain` shows.

Everything the explainer prints about the model comes from `Traced`, i.e. from the
traces the model's own forward recorded (`model(..., trace_rows=rows,
output_hidden_states=True)`) — never from a second, "similar" implementation. Only the
requested query rows are kept (`trace_rows`), so explaining one token holds
`O(layers · heads · s)` attention numbers, not `O(layers · heads · t · s)`.

`trace_layer` answers a question about one layer's whole map: the forward stops after that
layer (`LayerRows`, honoured by qkv's own stack and by a transformers model's adapter alike:
`stops_at_layer`) and keeps its q, k and every row's lse (O(t) per
head); `LayerLse.weights` then gives any head's rows, exactly as the reference path computes
them, a block of rows at a time — one head's map holds O(t · s) numbers, nothing else does.

Models are passed in, never loaded or cached here: a caller loads one with
[`qkv.load`][qkv.load] (eval mode) and keeps it as long as it likes.
"""

from __future__ import annotations

import numbers
import sys
import weakref
from dataclasses import dataclass

import torch

from qkv.attention.attention_mask import AttentionMask
from qkv.attention.functional import attention_trace
from qkv.attention.trace import LSE, LseTrace
from qkv.errors import QkvError
from qkv.text import is_blank, shown
from qkv.explain.finite import check_layers
from qkv.explain.select import Units, units_for
from qkv.explain.wording import ArgumentError, too_long
from qkv.models.protocol import SelfAttentionModel
from qkv.modules.stack import LayerRows
from qkv.modules.writes import Weights

# A block of query rows is computed at a time: about this many (rows × keys) numbers per head,
# so the reference path's intermediates (scores, scaled, masked, weights: four of them) stay near
# 4 × 16 MiB in float32 whatever the length.
BLOCK_NUMBERS = 1 << 22


@dataclass(frozen=True)
class Traced:
    """A text, its tokens, and what the model computed on it for the traced query rows.

    Attributes:
        text: the text as given.
        encoding: the tokenizer's `Encoding` (ids, tokens, offsets, word_ids, special).
        units: the tokens or words shown on screen.
        rows: (r,) the token positions whose attention rows were kept.
        hidden_states: num_layers + 1 tensors (1, t, E); `hidden_states[L]` enters layer L.
        traces: one `LayerTrace` per layer; `traces[L].self_attn.attention.weights` is
            (1, h, r, s).
    """

    text: str
    encoding: object
    units: Units
    rows: torch.Tensor
    hidden_states: tuple[torch.Tensor, ...]
    traces: list

    @property
    def tokens(self) -> list[str]:
        return list(self.encoding.tokens)

    def weights(self, layer: int) -> torch.Tensor:
        """(h, r, s): layer `layer`'s attention weights for the traced rows, every head."""
        return self.traces[layer].self_attn.attention.weights[0]

    def layer_weights(self) -> list[torch.Tensor]:
        """`weights` of every layer, in order: L tensors (h, r, s)."""
        return [self.weights(layer) for layer in range(len(self.traces))]


def num_layers(model) -> int:
    return len(model.layers)


def num_heads(model) -> int:
    """Heads per layer, read off the first layer whose attention qkv computes (a hybrid's
    linear-attention and state-space layers have none)."""
    return next(layer.self_attn.num_heads for layer in model.layers if layer.self_attn is not None)


def model_name(model) -> str:
    """How messages name `model` (every model of the protocol has a `name`)."""
    return str(model.name)


def check_model(model) -> None:
    """ArgumentError unless `model` is a self-attention model from `qkv.load` (the typed
    protocol [`SelfAttentionModel`][qkv.models.protocol.SelfAttentionModel]: layers, a tokenizer, a
    name …)."""
    if model in _CHECKED:
        return
    if not isinstance(model, SelfAttentionModel):
        raise ArgumentError("model", "{name} must be a model from qkv.load (with layers and a "
                            "tokenizer), got {value}", value=type(model).__name__)
    _CHECKED.add(model)


# Models that passed `check_model`: a runtime protocol check reads every attribute the protocol
# names (~50 µs), and one explanation asks it several times.
_CHECKED: "weakref.WeakSet" = weakref.WeakSet()


def check_index(name: str, value) -> None:
    """ArgumentError unless `value` is None or an int — `True` would count as 1, 2.0 as 2."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral)):
        raise ArgumentError(name, "{name} must be an int, got {value}", value=repr(value))


def check_layer_head(model, layer: int | None, head: int | None) -> None:
    """ArgumentError naming the value and the valid range when `layer`/`head` do not exist
    (or `model` is not a model)."""
    check_model(model)
    check_index("layer", layer)
    check_index("head", head)
    n_layers, n_heads = num_layers(model), num_heads(model)
    if layer is not None and not 0 <= layer < n_layers:
        raise ArgumentError("layer", "{name} {value} is out of range: {model} has {n} layers "
                            "(0–{last})", value=layer, model=model_name(model), n=n_layers,
                            last=n_layers - 1)
    if layer is not None and model.layers[layer].self_attn is None:
        kinds = ", ".join(m.kind.value for m in model.parts.layers[layer].mixers) or "nothing"
        raise ArgumentError("layer", "{name} {value} of {model} mixes its tokens by {kinds} "
                            "(transformers' own code), not by an attention qkv computes; choose a "
                            "layer with softmax attention", value=layer, model=model_name(model),
                            kinds=kinds)
    if head is not None and not 0 <= head < n_heads:
        raise ArgumentError("head", "{name} {value} is out of range: {model} has {n} heads per "
                            "layer (0–{last})", value=head, model=model_name(model), n=n_heads,
                            last=n_heads - 1)


def check_top(top: int) -> None:
    """ArgumentError unless `top` (how many of the largest weights to list) is at least 1."""
    check_index("top", top)
    if top is None or top < 1:
        raise ArgumentError("top", "{name} must be at least 1, got {value}", value=top)


def check_text(text: str) -> None:
    """QkvError for an empty or blank text (checked before a model is loaded)."""
    if not text or is_blank(text):  # zero-width and control characters are no words either
        raise QkvError(f"the text is empty ({shown(text)}); give a sentence, e.g. qkv explain "
                       "\"The dog found some pizza next to the baby and ate it\"")


def encode(model, text: str, *, unknown_ok: bool = False):
    """The tokenizer's Encoding of `text`; QkvError for an empty or blank text, one longer than
    the model takes (`too_long`), or (unless `unknown_ok`) one whose
    every token is the unknown token."""
    check_text(text)
    check_model(model)
    limit = model.tokenizer.max_length  # the most tokens the model takes (None: no limit)
    encoding = model.tokenizer.encode(text, max_length=None if limit is None else sys.maxsize)
    if limit is not None and len(encoding.ids) > limit:  # the one wording, not the tokenizer's
        raise too_long(len(encoding.ids), model_name(model), limit)
    if not encoding.ids:
        raise QkvError(f"the text {shown(text)} has no tokens for {model_name(model)}")
    if not unknown_ok and model.tokenizer.all_unknown(encoding):
        raise QkvError(f"every word of {shown(text)} is unknown to {model_name(model)} (each "
                       f"becomes {model.tokenizer.unk_token}), so its attention would say nothing "
                       f"about the text; give words from its vocabulary, or use another model")
    return encoding


def trace(model, text: str, rows: torch.Tensor | slice, *, words: bool = False,
          encoding=None, last_layer: int | None = None) -> Traced:
    """Run `model` on `text` once, keeping the attention rows `rows` of every layer/head.

    Args:
        rows: token positions (LongTensor) whose rows to keep, or `slice(None)` for all.
        words: show words instead of tokens (see `qkv.explain.select`).
        encoding: the text's Encoding when the caller already has it.
        last_layer: the last layer the caller reads: where the model allows it
            (`stops_at_layer`), the forward stops after it and `traces` /
            `hidden_states` end there (the model's head never runs).
    """
    encoding = encoding if encoding is not None else encode(model, text)
    ids = torch.tensor([encoding.ids], dtype=torch.long, device=device_of(model))  # (1, t)
    if last_layer is not None and stops_at_layer(model, last_layer):
        rows = LayerRows(last_layer, rows, earlier=True)  # the numbers of a whole trace
    with torch.no_grad():
        out = model(ids, torch.ones_like(ids), trace_rows=rows, output_hidden_states=True)
    rows = rows.rows if isinstance(rows, LayerRows) else rows
    check_layers(out.traces, model=model_name(model), output=out.hidden_states[-1])  # NaN: named
    positions = torch.arange(ids.shape[1], device=ids.device)[rows]
    return Traced(text=text, encoding=encoding, units=units_for(encoding, text, words),
                  rows=positions, hidden_states=tuple(out.hidden_states), traces=list(out.traces))


@dataclass(frozen=True)
class LayerLse:
    """One layer of one forward, kept at O(t) per head: what any of its weights is computed from.

    Attributes:
        text: as `Traced`'s.
        encoding: see `text`.
        units: see `text`.
        layer: the layer.
        record: its `LseTrace` — query (1, h, t, d), key (1, h_kv,
            s, d) as the kernel read them (after positions and norms), every row's lse, the mask
            description and the scale.
    """

    text: str
    encoding: object
    units: Units
    layer: int
    record: LseTrace

    def weights(self, heads: list[int], rows: torch.Tensor | None = None) -> torch.Tensor:
        """(len(heads), r, s): the weights of query `rows` (None: all) in each of `heads`
        (`block_weights`: the reference path, a block of
        rows at a time — so the (r, s) result is the only large tensor). Kept in the dtype the
        attention computed in (float32 for fp32, bf16 and fp16 models).
        """
        rec = self.record
        rows = torch.arange(rec.query.shape[2], device=rec.query.device) if rows is None else rows
        return block_weights(rec.query, rec.key, heads, rows, mask=rec.mask, scale=rec.scale)


def block_weights(query: torch.Tensor, key: torch.Tensor, heads: list[int], rows: torch.Tensor, *,
                  mask, scale: float | None) -> torch.Tensor:
    """(len(heads), r, s): the weights of query `rows` in each of `heads`, from a kept query
    (1, h, t, d), key (1, h_kv, s, d), mask description and scale — what
    [`LayerLse.weights`][qkv.explain.forward.LayerLse.weights] and a document's rows
    ([`Document.weights`][qkv.explain.long.document.Document.weights]) both ask.

    Each row is the softmax of its own scores by the reference path (what `trace_rows` runs),
    `BLOCK_NUMBERS` (rows × keys) numbers at a time: one head at a time where the mask is the
    same for every head (a layer's maps at 512 tokens peaked at 142 MiB above GPT-2's weights
    with every head in one call, 68 MiB one head at a time), every head in one call otherwise
    (a block or dense mask may differ between heads). exp(s − lse)
    from a recorded lse would add the rounding of lse, ~|lse| · eps relative (4 × the softmax's
    on MiniLM's layer 0), so the row is recomputed whole.
    """
    s = key.shape[2]
    plain = not isinstance(mask, AttentionMask) or (mask.block is None and mask.dense is None)
    groups = query.shape[1] // key.shape[1]
    out = None
    for n, head in enumerate(heads if plain else [None]):  # None: every head in one call
        q, k = (query, key) if head is None else \
            (query[:, head:head + 1], key[:, head // groups:head // groups + 1])  # (1, 1, t, d), (1, 1, s, d)
        step = max(1, BLOCK_NUMBERS // max(1, q.shape[1] * s))
        for start in range(0, len(rows), step):
            block = rows[start:start + step]
            w = attention_trace(q, k, k, mask=mask, scale=scale, rows=block,
                                enable_gqa=k.shape[1] != q.shape[1]).weights[0]  # (1 | h, r_block, s)
            if out is None:
                out = torch.empty(len(heads), len(rows), s, dtype=w.dtype, device=w.device)
            if head is None:
                out[:, start:start + len(block)] = w[heads]
            else:
                out[n, start:start + len(block)] = w[0]
    if out is None:
        out = torch.empty(len(heads), len(rows), s, device=query.device)
    return out


@dataclass(frozen=True)
class Stop:
    """`stops_at_layer`'s answer: true where a forward can stop after the layer; else `reason`
    says why not (one clause, about the model).

    Example:
        >>> bool(Stop()), bool(Stop("its layers run in its own loop")), Stop("x").reason
        (True, False, 'x')
    """

    reason: str = ""

    def __bool__(self) -> bool:
        return not self.reason


def stops_at_layer(model, layer: int) -> Stop:
    """Whether `model`'s forward can stop after `layer` keeping only what a
    [`LayerRows`][qkv.modules.stack.LayerRows] asks (that layer's rows, `LSE` or `Weights`, the
    earlier layers' `Writes`) — the one rule `trace(…, last_layer=)`, `trace_layer`,
    `row_weights` and a score attribution ask. True for qkv's own layers (a
    [`TransformerStack`][qkv.modules.TransformerStack]: `qkv.modules.stack.stop_note`) with no
    score bias (an lse record keeps q and k, not a bias) and for a transformers model (`qkv.hf.adapter.HFModel`: a hook ends its
    layer loop) where [`HFModel.stop_note`][qkv.hf.adapter.HFModel.stop_note] finds nothing in
    the way. Where it is False, the answer's `reason` says why and the caller traces whole.
    """
    return Stop(model.stop_note(layer))  # the model protocol's question (SelfAttentionModel)


def trace_layer(model, text: str, layer: int | None, *, words: bool = False,
                encoding=None) -> list[LayerLse]:
    """Run `model` on `text` through layer `layer` only, keeping that layer's q, k and lse
    (a list of one `LayerLse`); `layer=None`: the whole forward, every layer's.

    The layers after `layer` and the model's head never run (`LayerRows`); the layers
    before it run untraced, as a plain forward does. Needs `stops_at_layer` (for every
    layer with `layer=None`).

    Args:
        words: show words instead of tokens (see `qkv.explain.select`).
        encoding: the text's Encoding when the caller already has it.
    """
    encoding = encoding if encoding is not None else encode(model, text)
    ids = torch.tensor([encoding.ids], dtype=torch.long, device=device_of(model))  # (1, t)
    with torch.no_grad():
        out = model(ids, torch.ones_like(ids), trace_rows=LSE if layer is None else LayerRows(layer, LSE))
    units = units_for(encoding, text, words)
    layers = range(len(out.traces)) if layer is None else [layer]
    return [LayerLse(text=text, encoding=encoding, units=units, layer=i,
                     record=out.traces[i].self_attn) for i in layers]


def row_weights(model, ids: torch.Tensor, rows: torch.Tensor) -> list[torch.Tensor] | None:
    """Every layer's weights (h, r, s) for the query `rows`, from one forward that keeps nothing
    else (`Weights`: each layer's row trace is the one `trace_rows=rows` computes, its keys,
    values, inputs and residual dropped when the layer is done; the model's head never runs).

    None where that forward does not apply (a layer qkv's stack does not run:
    `stops_at_layer`) or where a weight is not finite — the caller's whole trace then runs,
    and names the first NaN.

    Args:
        ids: (1, t) token ids.
        rows: (r,) query positions.
    """
    last = num_layers(model) - 1
    if not all(stops_at_layer(model, layer) for layer in range(last + 1)):
        return None
    with torch.no_grad():
        out = model(ids, torch.ones_like(ids), trace_rows=LayerRows(last, Weights(rows), earlier=True))
    weights = [trace.self_attn.weights[0] for trace in out.traces]  # L × (h, r, s)
    return weights if all(bool(torch.isfinite(w).all()) for w in weights) else None


def device_of(model) -> torch.device:
    """The device `model`'s weights are on: where an explanation creates its tensors."""
    for p in model.parameters():
        return p.device
    return torch.device("cpu")
