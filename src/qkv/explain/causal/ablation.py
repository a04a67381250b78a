"""No projection (`qkv explain --no-projection`): attention with q = k = v = x, without W_Q,
W_K, W_V.

A seed claims that without the projections a token always attends most to itself. Token i
puts its largest score on itself exactly when `x_i · x_i > x_i · x_j` for every other j, i.e.
`‖x_i‖² > ‖x_i‖ ‖x_j‖ cos θ_ij` — which fails whenever some other vector is longer enough
in x_i's direction. So the claim depends on the vectors' norms; this module measures it on
the vectors that really enter each layer of a model, beside the same figure for the learned
heads (fraction of (head, token) pairs whose largest weight is on the token itself).

The no-projection attention is computed by [`qkv.attention_trace`][qkv.attention_trace] on the
forward's own traced inputs, with the usual 1/√E scaling (E = the model width). `no_projection` is
the entry point for a model and a text.
"""

from __future__ import annotations

from typing import ClassVar

from dataclasses import dataclass

import torch

from qkv.attention import attention_trace
from qkv.explain.forward import check_layer_head, encode, model_name, trace

RULE = "largest weight on the token itself; no projection: q = k = v = x, scale 1/sqrt(E)"


@dataclass(frozen=True)
class LayerSelf:
    """One layer's self-attention figures.

    Attributes:
        layer: counting from 0.
        plain_self: (t,) bool — without projections, token i's largest weight is on itself.
        plain_target: (t,) the position each token attends to most without projections.
        learned_self: (h, t) bool — the same for each learned head.
        norms: (t,) ‖x_i‖ of the vectors entering the layer's attention.
    """

    layer: int
    plain_self: torch.Tensor
    plain_target: torch.Tensor
    learned_self: torch.Tensor
    norms: torch.Tensor

    @property
    def plain_rate(self) -> float:
        return float(self.plain_self.double().mean())

    @property
    def learned_rate(self) -> float:
        return float(self.learned_self.double().mean())


@dataclass(frozen=True)
class NoProjection:
    """Every layer's self-attention figures for one text — what `no_projection` returns.

    Attributes:
        model: what was run.
        width: E, the model width (the scale is 1/√E).
        text: the text as given.
        tokens: its tokens.
        layers: one `LayerSelf` per layer (only `layer`'s when one was asked for).
    """

    kind: ClassVar[str] = "no-projection"  # its row in qkv.explain.kinds.KINDS

    model: str
    text: str
    tokens: list[str]
    width: int
    layers: list[LayerSelf]

    def to_dict(self) -> dict:
        """Every figure (what `qkv explain TEXT --no-projection --json` prints)."""
        return {"kind": self.kind,
            "model": self.model,
            "text": self.text,
            "tokens": self.tokens,
            "rule": RULE,
            "layers": [
                {"layer": s.layer, "no_projection_self_rate": s.plain_rate,
                 "learned_self_rate": s.learned_rate,
                 "no_projection_self": s.plain_self.tolist(),
                 "no_projection_target": s.plain_target.tolist(),
                 "learned_self_per_head": s.learned_self.double().mean(-1).tolist(),
                 "norms": s.norms.tolist()}
                for s in self.layers
            ],
        }


def no_projection_weights(x: torch.Tensor) -> torch.Tensor:
    """softmax(x xᵀ / √E) for x (t, E): the weights (t, t) with q = k = v = x.

    Examples:
        >>> x = torch.tensor([[1.0, 0.0], [3.0, 0.0]])      # the second vector is longer
        >>> no_projection_weights(x).argmax(-1).tolist()    # so both tokens pick it
        [1, 1]
    """
    x = x.double()[None]  # (1, t, E): one "head"
    return attention_trace(x, x, x).weights[0]  # (t, t)


def layer_self(layer: int, x: torch.Tensor, learned: torch.Tensor) -> LayerSelf:
    """Self-attention figures of one layer.

    Args:
        x: (t, E) the vectors the layer projects into queries/keys/values.
        learned: (h, t, t) the layer's traced weights for every token (all rows).
    """
    t = x.shape[0]
    own = torch.arange(t)
    plain = no_projection_weights(x)  # (t, t)
    return LayerSelf(layer=layer, plain_self=plain.argmax(-1) == own,
                     plain_target=plain.argmax(-1), learned_self=learned.argmax(-1) == own,
                     norms=x.double().norm(dim=-1))


def ablation(traces: list) -> list[LayerSelf]:
    """Per layer, from traces that kept every query row (`trace_rows=slice(None)`)."""
    out = []
    for layer, tr in enumerate(traces):
        sa = tr.self_attn
        if sa.attention.weights.shape[-2] != sa.attention.weights.shape[-1]:
            raise ValueError("the ablation needs every query row traced (trace_rows=slice(None))")
        out.append(layer_self(layer, sa.query_input[0], sa.attention.weights[0]))
    return out


def no_projection(model, text: str, *, layer: int | None = None) -> NoProjection:
    """How often each token of `text` attends most to itself, without and with projections.

    One forward pass keeping every query row (O(layers · heads · t · s) numbers).

    Raises:
        ArgumentError: `layer` out of range. QkvError: an empty text.

    Examples:
        >>> import qkv
        >>> r = no_projection(qkv.load("minilm"), "The dog found some pizza next to the baby and ate it")
        >>> len(r.layers), r.layers[0].plain_self.shape        # 6 layers, one flag per token
        (6, torch.Size([14]))
    """
    encoding = encode(model, text)
    check_layer_head(model, layer, None)
    traced = trace(model, text, slice(None), encoding=encoding)
    layers = ablation(traced.traces)
    if layer is not None:
        layers = [layers[layer]]
    return NoProjection(model=model_name(model), text=text, tokens=traced.tokens,
                        width=traced.hidden_states[0].shape[-1], layers=layers)
