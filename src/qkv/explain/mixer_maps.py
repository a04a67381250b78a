"""One head's map on a layer that no softmax mixes: the exact effective attention o = M·v.

A hybrid model's linear-attention and state-space layers (Gated DeltaNet, KDA, lightning,
Mamba-2, a gated short convolution) have no softmax rows, but each head's output is linear in
its values: o = M·v with one (t × t) matrix M per head — causal, signed, rows need not sum to 1
(`qkv.explain.mixers`). So is differential attention's (DiffLlama): its softmax maps combine
into one signed map per head pair, M = A₁ − λ·A₂ (its registry entry's `traced` reader).
`attention_map` asks `effective_layer` and hands such a layer here; `mixer_map` returns M as an `EffectiveMap` (kind `map`, drawn by the
same panel with a diverging scale and its row sums).

Where the numbers come from: the model's own forward (`qkv.explain.forward.trace`) runs
once with a hook on the layer's mixer (`layers[L].parts.mixers[i].module`, the protocol's
part) keeping its input — the normed hidden state — and its output for that call; the mixer's
registered reader (`MIXERS`, keyed by the part's `MixerKind`) then
runs the module on exactly that input. The construction refuses the result unless the reader's
run returned the forward's output bit for bit (the same computation, not a similar one) and
M·v rebuilds the module's own mixing output to rounding (`qkv.rounding.close`); the
largest difference is kept in `error`, as `explain_head` keeps its float64 re-check.

Examples:
    >>> m = mixer_map(qkv.load("path/to/qwen3_5"), "the cat sat", layer=0, head=1)  # doctest: +SKIP
    >>> m.weights.triu(1).abs().max(), m.row_sums                                    # doctest: +SKIP
    (tensor(0., dtype=torch.float64), tensor([...]))
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import ClassVar

import torch

from qkv.errors import QkvError
from qkv.explain.head_result import HeadResult
from qkv.explain.forward import check_index, check_model, check_text, model_name, trace
from qkv.explain.mixers import MIXERS
from qkv.explain.mixers import mixer as registered
from qkv.explain.select import group_columns, group_rows
from qkv.explain.wording import ArgumentError, Message
from qkv.models.protocol import Mixer
from qkv.rounding import close


@dataclass(frozen=True)
class EffectiveMap(HeadResult):
    """Head `head` of a linear or state-space `mixer` of layer `layer`: `weights` (U, U)
    the exact M with o = M·v (signed, causal; a row's sum is not 1), rows from, columns to
    `units`.

    Fields beyond [`AttentionMap`][qkv.explain.maps.AttentionMap]'s: `mixer` the mixer's kind
    (`MixerKind` value), `mixer_index` its place among the layer's mixers, `heads` how many
    heads (value heads, or channels of a short convolution) it has, `error` max |M·v − o| over
    every head against the module's own mixing output o (float64 M, the forward's float32 o),
    `lam` differential attention's λ (M = A₁ − λ·A₂; None for the other kinds).
    """

    kind: ClassVar[str] = "map"  # drawn by the map's row of qkv.explain.kinds.KINDS

    weights: torch.Tensor
    mixer: str
    mixer_index: int
    heads: int
    error: float
    lam: float | None = None

    @property
    def row_sums(self) -> torch.Tensor:
        """(U,) each row's sum: what a value constant over the keys is multiplied by."""
        return self.weights.sum(-1)

    def marks(self) -> dict:
        """What tells a reader this is no softmax map (`effective`: draw it on a diverging
        scale) and `row_sums[i]` to print beside row i; the viewer's answer carries them too."""
        return {"effective": True, "mixer": self.mixer, "mixer_index": self.mixer_index,
                "heads": self.heads, "row_sums": self.row_sums.tolist(), "error": self.error,
                **({} if self.lam is None else {"lambda": self.lam})}

    def to_dict(self) -> dict:
        """`weights[i][j]` from unit i to unit j — signed — and `marks`."""
        return {"kind": self.kind, "model": self.model, "text": self.text, "units": self.units.labels,
                "words": self.units.words, "layer": self.layer, "head": self.head,
                "weights": self.weights.tolist(), **self.marks()}


def effective_layer(model, layer) -> bool:
    """Whether layer `layer` of `model` has no mixer whose map is softmax rows (a linear,
    state-space or differential-attention layer, or a feed-forward-only one): `mixer_map`
    answers it. False for an index that is no layer (the caller's checks name it).

    Raises:
        ArgumentError: `model` is no self-attention model from `qkv.load`."""
    check_model(model)
    parts = model.parts
    if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < len(parts.layers):
        return False
    return all(_signed(m) for m in parts.layers[layer].mixers)


def _signed(part: Mixer) -> bool:
    """Whether `part`'s map is an effective M (o = M·v, signed), not softmax rows: a linear or
    state-space kind, or a softmax variant whose registry entry combines its maps (`traced`)."""
    entry = MIXERS.get(part.kind.value)  # plain softmax attention has no entry
    return not part.kind.softmax or (entry is not None and entry.traced is not None)


def mixer_map(model, text: str, *, layer: int, head: int, mixer: int | None = None,
              words: bool = False) -> EffectiveMap:
    """The exact (U, U) effective attention M of one head of a linear or state-space mixer.

    Args:
        layer: the layer. head: the mixer's head (a value head; a channel of a short convolution).
        mixer: which of the layer's mixers (`model.parts.layers[L].mixers`); None: its one
            non-softmax mixer (Falcon-H1's and Zamba2's layers run Mamba-2 beside attention:
            `mixer=1`).
        words: regroup into words (into a word summed, from a word averaged).

    Raises:
        ArgumentError: a layer, head or mixer out of range; a mixer whose weights are softmax
            rows ([`qkv.explain.attention_map`][qkv.explain.attention_map] draws those); a
            feed-forward-only layer.
        QkvError: the mixer's reader refuses the module, or its run is not the forward's.
    """
    check_text(text)
    check_model(model)
    for name, value in (("layer", layer), ("head", head), ("mixer", mixer)):
        check_index(name, value)
    if head is None:
        raise ArgumentError("head", "{name} is required: which head's map (from 0)")
    index, part = layer_mixer(model, layer, mixer)
    entry = registered(part.kind.value)
    with keeping({layer: part}) as seen:
        # a `traced` reader re-runs the layer on qkv's attention, every row traced: so is the
        # forward, for the re-run to be the same computation (a traced row is the reference path's)
        traced = trace(model, text, slice(None) if entry.traced is not None else torch.tensor([0]), words=words)
    record, error = checked_record(model, layer, part, seen[layer])
    if not 0 <= head < record.heads:
        raise ArgumentError("head", "{name} {value} is out of range: layer {layer}'s {kind} has "
                            "{n} heads (0–{last})", value=head, layer=layer, kind=part.kind.value,
                            n=record.heads, last=record.heads - 1)
    M = record.matrix(head)  # (t, t)
    if words:
        M = group_rows(group_columns(M, traced.units), traced.units)  # (U, U)
    return EffectiveMap(model=model_name(model), text=text, units=traced.units, layer=layer,
                        head=head, weights=M, mixer=part.kind.value, mixer_index=index,
                        heads=record.heads, error=error,
                        lam=record.map_lambda())


def softmax_rows(model, traced) -> list[torch.Tensor]:
    """Every layer's traced softmax weights (h, r, s), zeros for a layer that no softmax mixes
    (`effective_layer`: its map is `mixer_map`'s, per head, asked for one at a time)
    — what [`qkv.explain.attention_maps`][qkv.explain.attention_maps] stacks (L, h, r, s) for a
    hybrid model."""
    rows = [None if tr.self_attn is None else tr.self_attn.attention.weights[0] for tr in traced.traces]
    first = next(w for w in rows if w is not None)  # (h, r, s); qkv.load needs one softmax layer
    return [first.new_zeros(first.shape) if w is None else w for w in rows]


def check_softmax_everywhere(model, what: str) -> None:
    """ArgumentError (one line, about `model`) naming the first layer that no softmax mixes,
    for `what` (a probe, head outputs) that reads every layer's softmax weights and is not run
    on a hybrid's other layers yet."""
    for i, parts in enumerate(model.parts.layers):
        if not any(m.kind.softmax for m in parts.mixers):
            kinds = "/".join(m.kind.value for m in parts.mixers) or "nothing (a feed-forward-only layer)"
            raise ArgumentError("model", "{what} reads every layer's softmax weights, but layer {i} of "
                                "{value} mixes its tokens by {kinds}; on a hybrid, ask attention_map(…, "
                                "layer={i}) for its effective map", what=what, i=i, value=model_name(model),
                                kinds=kinds)


def unscored_note(model, layers: tuple[int, ...]) -> Message | None:
    """Why a ranking by attention weights leaves `layers` out (a hybrid's layers that no
    softmax mixes), naming each one's kinds; None when none is left out.

    The rankings (`qkv explain`, `qkv heads`) compare heads by softmax weights, shares of 1;
    an effective map's rows are signed and need not sum to 1, so they are not ranked beside them.
    """
    if not layers:
        return None
    named = ", ".join(f"{i} ({'/'.join(m.kind.value for m in model.parts.layers[i].mixers) or 'feed-forward only'})"
                      for i in layers)
    return Message("not ranked: layers {named} have no softmax weights (a linear or state-space "
                   "layer's effective map is signed and its rows need not sum to 1: see "
                   "attention_map(…, layer=L))", named=named)


def layer_mixer(model, layer: int, index: int | None) -> tuple[int, Mixer]:
    """(its index, the mixer) of layer `layer` that `mixer_map` reads; ArgumentError
    naming the layer's kinds otherwise."""
    if layer is None or not 0 <= layer < len(model.layers):
        n = len(model.layers)
        raise ArgumentError("layer", "{name} {value} is out of range: {model} has {n} layers (0–{last})",
                            value=layer, model=model_name(model), n=n, last=n - 1)
    mixers = model.parts.layers[layer].mixers
    if not mixers:
        raise ArgumentError("layer", "{name} {value} of {model} is a feed-forward-only layer: nothing "
                            "mixes its tokens, so it has no attention map; choose a layer with a mixer",
                            value=layer, model=model_name(model))
    if index is None:
        found = [i for i, m in enumerate(mixers) if _signed(m)]
        if not found:
            raise ArgumentError("layer", "{name} {value} of {model} mixes its tokens by softmax "
                                "attention ({kinds}): attention_map draws its rows",
                                value=layer, model=model_name(model),
                                kinds=", ".join(m.kind.value for m in mixers))
        index = found[0]
    if not 0 <= index < len(mixers):
        raise ArgumentError("mixer", "{name} {value} is out of range: layer {layer} has {n} mixers "
                            "({kinds})", value=index, layer=layer, n=len(mixers),
                            kinds=", ".join(m.kind.value for m in mixers))
    if not _signed(mixers[index]):
        raise ArgumentError("mixer", "{name} {value} of layer {layer} is {kind}, softmax rows: "
                            "attention_map draws them", value=index, layer=layer,
                            kind=mixers[index].kind.value)
    return index, mixers[index]


@contextmanager
def keeping(parts: dict[int, Mixer]):
    """{layer: what it kept}: within the `with`, what each mixer of `parts` ({layer: mixer}) is
    handed and returns in the forward, for `checked_record` to read."""
    seen: dict[int, dict] = {i: {} for i in parts}
    handles = [h for i, part in parts.items()
               for h in (part.module.register_forward_pre_hook(_keep_input(seen[i]), with_kwargs=True),
                         part.module.register_forward_hook(_keep_output(seen[i], "forward")))]
    try:
        yield seen
    finally:
        for h in handles:
            h.remove()


def checked_record(model, layer: int, part: Mixer, seen: dict):
    """(the registered reader's record of `part` on what `keeping` kept, max |M·v − o|): the
    reader re-runs the module on the forward's own input, checked to be that forward's."""
    record = _read(model, layer, part, registered(part.kind.value), seen)
    return record, _rebuilds(model, layer, part, record)


def _keep_input(seen: dict):
    def hook(module, args, kwargs):
        seen.setdefault("input", args[0] if args else kwargs["hidden_states"])
        seen.setdefault("call", {k: v for k, v in kwargs.items() if k != "hidden_states"})
    return hook


def _keep_output(seen: dict, key: str):
    def hook(module, args, output):
        seen.setdefault(key, output[0] if isinstance(output, tuple) else output)
    return hook


def _read(model, layer: int, part: Mixer, entry, seen: dict):
    """The registered reader's record of `part` on the forward's own input, checked to be that
    forward's computation: the module's output on the re-run is the forward's, bit for bit."""
    if "input" not in seen:
        raise QkvError(f"layer {layer} of {model_name(model)}: its {part.kind.value} mixer did not run "
                       f"in the forward")
    if not entry.effective and entry.traced is None:
        raise QkvError(f"layer {layer} of {model_name(model)}: {part.kind.value} has no effective map")
    handle = part.module.register_forward_hook(_keep_output(seen, "rerun"))
    try:
        x = seen["input"].detach()
        record = entry.read(part.module, x) if entry.traced is None else entry.traced(part.module, x, **seen["call"])
    except QkvError as e:
        raise QkvError(f"layer {layer} of {model_name(model)} ({part.kind.value}, "
                       f"{type(part.module).__name__}): {e}") from None
    finally:
        handle.remove()
    if not torch.equal(seen["rerun"], seen["forward"]):
        raise QkvError(f"layer {layer} of {model_name(model)}: its {part.kind.value} mixer run on the "
                       f"forward's input did not return the forward's output; no map is read from "
                       f"another computation")
    return record


def _rebuilds(model, layer: int, part: Mixer, record) -> float:
    """max |M·v (+ what no value carries) − o| over every head, o the module's mixing output
    (`EffectiveAttention.rebuilt`); QkvError unless within rounding (`qkv.rounding.close`) of
    the float32 output."""
    worst = 0.0
    for h in range(record.heads):
        got = record.rebuilt(h)  # (t, d)
        want = record.output[:, h]  # (t, d)
        if not close(got, want.float()):
            raise QkvError(f"layer {layer} of {model_name(model)}: head {h}'s {part.kind.value} map M·v "
                           f"is off the module's output by {float((got - want).abs().max()):.3g}; "
                           f"not an exact map")
        worst = max(worst, float((got - want).abs().max()))
    return worst


__all__ = ["EffectiveMap", "check_softmax_everywhere", "checked_record", "effective_layer", "keeping", "layer_mixer",
           "mixer_map", "softmax_rows", "unscored_note"]
