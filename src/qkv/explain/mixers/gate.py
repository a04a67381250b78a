"""A gated attention output (qwen3_next, qwen3_5 full-attention layers): the gate as a step.

transformers' `Qwen3NextAttention` projects every query twice as wide: one half is the query,
the other a gate, and the heads' outputs are multiplied by sigmoid(gate) before W_O:

    head h at token i:   z_ih = Σ_j A_h[i, j] v_jh            (the softmax head, as any other)
                         y_ih = sigmoid(gate_ih) ⊙ z_ih       (per channel, in (0, 1))
    the layer's output:  Σ_h y_ih · W_O,hᵀ (+ bias)

So a head's contribution to the residual stream is its gated output through its slice of W_O: a
head with confident weights and a closed gate contributes little. The weights and z are the
layer's own attention call; the gate goes through the module's `q_proj` (the half it discards
for the query), and the tests check that the heads' contributions sum to the layer's output.
Letters: t tokens, h heads, d head width, m hidden width.

On a loaded model (qkv's attention, no eager call to read): `output_gate(attn)` reads the gate
the layer's attention declares (an `OutputGate`: its q_proj and W_O, found by the model side) —
what the contributions (`norm`, `alti`) multiply each head's vectors by — and `gated_head(model, text, layer=, head=, token=)` the gate's effect on
one head from the model's forward (`GatedHead`, the `gate` row of
`qkv.explain.kinds.KINDS`: the head's last step in `qkv explain`, the viewer's "Output gate"
panel).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from qkv.errors import QkvError
from qkv.explain.head_result import HeadResult
from qkv.explain.forward import check_layer_head, check_model, check_text, device_of, encode, model_name, trace
from qkv.explain.mixers.capture import causal_call
from qkv.explain.select import choose_in
from qkv.explain.wording import ArgumentError
from qkv.models.protocol import OutputGate, OutputGated
from qkv.rounding import close

KERNEL = "eager_attention_forward"  # the layer must run with attn_implementation="eager"


@dataclass(frozen=True)
class GatedOutput:
    """One text through a gated-output attention layer, in float64."""

    kind = "gate"
    weights: torch.Tensor      # (h, t, t) the layer's softmax maps
    head_output: torch.Tensor  # (t, h, d) z: each head's Σ_j A v_j, before the gate
    gate: torch.Tensor         # (t, h, d) sigmoid(gate logits), in (0, 1)
    w_o: torch.Tensor          # (m, h·d) the output projection
    bias: torch.Tensor | None  # (m,) its bias, which no head owns

    @property
    def heads(self) -> int:
        return self.weights.shape[0]

    def openness(self, head: int) -> torch.Tensor:
        """(t,) the mean gate of `head` at each token: 0 closed, 1 open."""
        return self.gate[:, head].mean(-1)

    def contribution(self, head: int, *, gated: bool = True) -> torch.Tensor:
        """(t, m) what `head` adds to the residual stream: (gate ⊙ z)·W_O,hᵀ (`gated=False`: z·W_O,hᵀ)."""
        d = self.head_output.shape[-1]
        z = self.head_output[:, head] * (self.gate[:, head] if gated else 1.0)  # (t, d)
        return z @ self.w_o[:, head * d: (head + 1) * d].T

    def kept(self, head: int) -> torch.Tensor:
        """(t,) ‖gated contribution‖ / ‖ungated contribution‖ per token: how much the gate lets through."""
        return self.contribution(head).norm(dim=-1) / self.contribution(head, gated=False).norm(dim=-1)


def read(module: torch.nn.Module, hidden_states: torch.Tensor, position_embeddings,
         dtype: torch.dtype = torch.float64) -> GatedOutput:
    """Run a gated-output attention layer (`Qwen3NextAttention`, `Qwen3_5Attention`) on one text.

    Args:
        module: the layer's `self_attn`, its config's `_attn_implementation` "eager".
        hidden_states: (1, t, hidden) its input, after the layer's norm.
        position_embeddings: (cos, sin) of positions 0 … t−1, as the model hands its layers.
        dtype: what the record holds (the layer runs in its own).
    """
    call = causal_call(module, KERNEL, hidden_states, position_embeddings)
    attn_output, weights = call.result  # (1, t, h, d), (1, h, t, t)
    bias, d = module.o_proj.bias, module.head_dim
    own = OutputGate(q_proj=module.q_proj, o_proj=module.o_proj,
                     heads=module.q_proj.out_features // (2 * d), head_dim=d)
    return GatedOutput(weights=weights[0].to(dtype), head_output=attn_output[0].to(dtype),
                       gate=own.gates(hidden_states[0]).to(dtype),
                       w_o=module.o_proj.weight.detach().to(dtype),
                       bias=None if bias is None else bias.detach().to(dtype))


# -- the gate of a loaded model's layer, as contributions and the head's panel read it ---------
def output_gate(attn) -> OutputGate | None:
    """The output gate a layer's attention `attn` declares (an
    [`OutputGated`][qkv.models.protocol.OutputGated]: a transformers layer's, found by the model
    side as it built the layer), or None: no gate, or qkv's own attention, which has none."""
    return attn.output_gate if isinstance(attn, OutputGated) else None


@dataclass(frozen=True)
class GatedHead(HeadResult):
    """Head `head` of a gated-output layer on `text`, from the model's own forward: at every token
    i the head's output z_i (the attention's Σ_j A_ij v_j), its gate sigmoid(gate_i), and what
    the head then writes to the residual stream, (g_i ⊙ z_i)·W_O,hᵀ, beside what it would write
    ungated, z_i·W_O,hᵀ.

    Attributes:
        units: the tokens. token: the query the head's steps show.
        gate: (d,) the gate at `token`, per channel, in (0, 1).
        openness: (t,) the mean gate at each token: 0 closed, 1 open.
        gated, ungated: (t,) ‖(g_i ⊙ z_i) W_O,hᵀ‖ and ‖z_i W_O,hᵀ‖.
        top_weight: the head's largest weight from `token` (a confident head may still be shut).
        error: max |Σ_h (g ⊙ z_h) W_O,hᵀ + b − the layer's output| over the text: the
            decomposition is the forward's (checked to rounding, `qkv.rounding.close`).
    """

    kind: ClassVar[str] = "gate"  # its row in qkv.explain.kinds.KINDS

    token: int
    gate: torch.Tensor
    openness: torch.Tensor
    gated: torch.Tensor
    ungated: torch.Tensor
    top_weight: float
    error: float

    @property
    def kept(self) -> torch.Tensor:
        """(t,) gated / ungated: the share of the head's write the gate lets through."""
        return self.gated / self.ungated.clamp_min(torch.finfo(self.ungated.dtype).tiny)

    def verdict(self) -> str:
        """One sentence: how much of this head's output reaches the residual stream at `token`."""
        kept = float(self.kept[self.token])
        what = ("closed: this head contributes little here, whatever its weights" if kept < 0.1 else
                "half shut: this head's contribution is damped" if kept < 0.5 else
                "open: this head's output mostly passes")
        return (f"at {self.units.labels[self.token]!r} the gate lets {100 * kept:.3g}% of head {self.head}'s "
                f"output through (its largest weight {self.top_weight:.3g}) — {what}")

    def to_dict(self) -> dict:
        return {"kind": self.kind, "model": self.model, "text": self.text, "units": self.units.labels,
                "layer": self.layer, "head": self.head, "token": self.token, "gate": self.gate.tolist(),
                "openness": self.openness.tolist(), "gated": self.gated.tolist(),
                "ungated": self.ungated.tolist(), "kept": self.kept.tolist(), "top_weight": self.top_weight,
                "error": self.error, "verdict": self.verdict()}


def gated_layers(model) -> list[int]:
    """The layers of `model` whose attention gates its heads' outputs (`output_gate`)."""
    return [i for i, layer in enumerate(model.layers)
            if layer.self_attn is not None and output_gate(layer.self_attn) is not None]


def gated_head(model, text: str, *, layer: int, head: int, token: str | int | None = None) -> GatedHead:
    """What the output gate of layer `layer` does to head `head` on `text` (see `GatedHead`).

    Raises:
        ArgumentError: layer, head or token out of range; a layer without an output gate.
        QkvError: the heads' gated outputs do not rebuild the layer's output (not this gate).
    """
    check_text(text)
    check_model(model)
    check_layer_head(model, layer, head)
    attn = model.layers[layer].self_attn
    gate = None if attn is None else output_gate(attn)
    if gate is None:
        kinds = "/".join(m.kind.value for m in model.parts.layers[layer].mixers) or "nothing"
        raise ArgumentError("layer", "{name} {value} of {model} has no output gate (it mixes by {kinds}); "
                            "Qwen3-Next / Qwen3.5 attention layers gate their heads", value=layer,
                            model=model_name(model), kinds=kinds)
    encoding = encode(model, text)
    units, choice = choose_in(token, encoding, text, words=False, role="token")
    seen: list[torch.Tensor] = []
    hook = attn.module.register_forward_hook(lambda _m, _a, out: seen.append(out[0][0].detach()))
    try:
        traced = trace(model, text, torch.tensor([choice.unit], device=device_of(model)), encoding=encoding)
    finally:
        hook.remove()
    tr = traced.traces[layer].self_attn
    d, h = gate.head_dim, gate.heads
    z = tr.heads[0].view(-1, h, d).double()  # (t, h, d) the heads' outputs before the gate
    g = gate.gates(tr.key_input[0]).double()  # (t, h, d): every token's layer input (self-attention)
    w = gate.out_weight().double()  # (h, d, E)
    written = gate.writes(tr.key_input[0], tr.heads[0]).transpose(0, 1)  # (t, h, E)
    error = float((written.sum(1) + gate.out_bias().double() - seen[0].double()).abs().max())
    if not close(written.sum(1) + gate.out_bias().double(), seen[0]):
        raise QkvError(f"layer {layer} of {model_name(model)}: the heads' gated outputs through W_O are "
                       f"{error:.3g} off the layer's output; not a gate qkv reads")
    return GatedHead(model=model_name(model), text=text, units=units, layer=layer, head=head,
                     token=choice.unit, gate=g[choice.unit, head], openness=g[:, head].mean(-1),
                     gated=written[:, head].norm(dim=-1), ungated=(z[:, head] @ w[head]).norm(dim=-1),
                     top_weight=float(tr.attention.weights[0, head, 0].max()), error=error)
