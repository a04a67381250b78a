"""Every layer's map on a probe's sequences — a hybrid's linear, state-space and differential
layers through their exact effective attention, so a probe ranks every layer's heads.

A softmax layer's map is its weights (rows non-negative, summing to 1). A layer no softmax mixes
has an exact effective map M instead (o = M·v, `qkv.explain.mixer_maps`): signed, rows need not
sum to 1, so its raw entries are not comparable with weights. The probes read such a row as the
shares of its absolute weight,

    share[i, j] = |M[i, j]| / Σ_j' |M[i, j']|

— the softmax weights themselves on a softmax row, and on any row numbers in [0, 1] summing to 1
whose uniform chance is the softmax's. That is the documented rule by which one ranking holds
every layer; the sign is dropped (a head that subtracts its target ranks as one that adds it).

Where the numbers come from: one forward per sequence (the effective readers take one text),
with the layer's mixer hooked for that call as `mixer_map` does, its registered reader run on
the forward's own input and checked there (the re-run equals the forward bit for bit, M·v
rebuilds the mixing output to rounding).

Examples:
    >>> absolute_shares(torch.tensor([[[1.0, 0.0], [-0.5, 1.5]]]))
    tensor([[[1.0000, 0.0000],
             [0.2500, 0.7500]]])
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from qkv.explain import forward
from qkv.explain.finite import check_layers
# mixer_map's own hooks, choice of mixer, checked re-run and rebuild check: one text's map is
# read here exactly as attention_map reads it, for each probe sequence
from qkv.explain.mixer_maps import checked_record, effective_layer, keeping, layer_mixer


def absolute_shares(M: torch.Tensor) -> torch.Tensor:
    """(…, t, t) each row of `M` as the shares of its absolute weight (a zero row stays zero)."""
    a = M.abs()
    return a / a.sum(-1, keepdim=True).clamp_min(torch.finfo(a.dtype).tiny)


@dataclass(frozen=True)
class LayerMaps:
    """What a probe reads of every layer (L layers, b sequences of t tokens).

    Attributes:
        weights: per layer (b, h, t, t): softmax weights, or an effective map's absolute shares;
            None for a layer with nothing to score (feed-forward only).
        mixers: each layer's scored mixer kind ("" for none).
        effective: the layers read through an effective map.
        unscored: (layer, why) of what is not scored.
    """

    weights: list[torch.Tensor | None]
    mixers: tuple[str, ...]
    effective: tuple[int, ...] = ()
    unscored: tuple[tuple[int, str], ...] = ()

    @classmethod
    def softmax(cls, model, weights: list[torch.Tensor]) -> "LayerMaps":
        """Every layer a softmax layer: its weights as they are."""
        return cls(weights, tuple(_kinds(p) for p in model.parts.layers))

    @staticmethod
    def stack(scores: list[torch.Tensor | None]) -> torch.Tensor:
        """(L, h_max) per-layer scores (h_L,), NaN where a layer has fewer heads or none."""
        width = max(s.shape[0] for s in scores if s is not None)
        out = torch.full((len(scores), width), float("nan"), dtype=torch.float64)
        for i, s in enumerate(scores):
            if s is not None:
                out[i, : s.shape[0]] = s
        return out


def _kinds(parts) -> str:
    return "/".join(m.kind.value for m in parts.mixers)


def plain_softmax(model) -> bool:
    """Whether every layer of `model` has softmax rows and nothing else mixes its tokens (no
    effective layer, no mixer beside its attention): its traced weights are every map."""
    layers = model.parts.layers
    return not any(effective_layer(model, i) or any(not m.kind.softmax for m in p.mixers)
                   for i, p in enumerate(layers))


def layer_maps(model, ids: torch.Tensor) -> LayerMaps:
    """Every layer's map on `ids` (b, t) of a model with layers no softmax mixes (see the
    module doc). QkvError where a layer's reader refuses its module or its run is not the
    forward's; `NonFiniteError` for a forward that computes NaN/inf."""
    layers = model.parts.layers
    chosen = {i: layer_mixer(model, i, None)[1] for i in range(len(layers)) if layers[i].mixers and effective_layer(model, i)}
    per_layer: list[list[torch.Tensor]] = [[] for _ in layers]
    for row in ids.split(1):  # (1, t): an effective reader takes one text
        with keeping(chosen) as seen, torch.no_grad():
            out = model(row, torch.ones_like(row), trace_rows=slice(None), output_hidden_states=True)
        check_layers(out.traces, model=forward.model_name(model), output=out.hidden_states[-1])
        for i, trace in enumerate(out.traces):
            if i in chosen:
                record, _ = checked_record(model, i, chosen[i], seen[i])
                M = torch.stack([record.matrix(h) for h in range(record.heads)])  # (h, t, t)
                per_layer[i].append(absolute_shares(M)[None])
            elif trace is not None and trace.self_attn is not None:
                per_layer[i].append(trace.self_attn.attention.weights)
    weights = [torch.cat(w) if w else None for w in per_layer]
    mixers = tuple(chosen[i].kind.value if i in chosen else
                   next((m.kind.value for m in p.mixers if m.kind.softmax), "") for i, p in enumerate(layers))
    unscored = tuple((i, "feed-forward only: nothing mixes its tokens") for i, p in enumerate(layers) if not p.mixers)
    unscored += tuple((i, f"its {m.kind.value} mixer beside the attention (its heads are not in this table's "
                          f"columns; mixer_map(…, layer={i}, mixer={k}) draws them)")
                      for i, p in enumerate(layers) if i not in chosen
                      for k, m in enumerate(p.mixers) if not m.kind.softmax)
    return LayerMaps(weights, mixers, tuple(sorted(chosen)), tuple(sorted(unscored)))


__all__ = ["LayerMaps", "absolute_shares", "layer_maps", "plain_softmax"]
