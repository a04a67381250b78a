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
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from qkv.explain.mixers.capture import causal_call

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
    bias = module.o_proj.bias
    return GatedOutput(weights=weights[0].to(dtype), head_output=attn_output[0].to(dtype),
                       gate=gates(module, hidden_states[0]).to(dtype),
                       w_o=module.o_proj.weight.detach().to(dtype),
                       bias=None if bias is None else bias.detach().to(dtype))


def gated(module: torch.nn.Module, heads: int, head_dim: int) -> bool:
    """Whether `module` gates its heads' outputs as `Qwen3NextAttention` does: a `q_proj` twice
    as wide as its h·d queries (each head's d query rows, then its d gate rows) and an `o_proj`
    reading the h·d gated outputs."""
    q, o = getattr(module, "q_proj", None), getattr(module, "o_proj", None)
    return isinstance(q, torch.nn.Linear) and isinstance(o, torch.nn.Linear) \
        and q.out_features == 2 * heads * head_dim and o.in_features == heads * head_dim


def gates(module: torch.nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    """(n, h, d) sigmoid(gate logits) at the n rows of `hidden_states` (n, hidden), the layer's
    input after its norm: the half of `q_proj` the query discards, in the layer's dtype."""
    d = module.head_dim
    with torch.no_grad():
        _, gate = module.q_proj(hidden_states).view(hidden_states.shape[0], -1, 2 * d).chunk(2, dim=-1)
    return torch.sigmoid(gate)


def head_writes(module: torch.nn.Module, hidden_states: torch.Tensor,
                head_output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """((h, n, m) each head's gated write (gate ⊙ z)·W_O,hᵀ, o_proj's bias (m,) or None), float64,
    at n rows: `hidden_states` (n, hidden) the layer's input there after its norm, `head_output`
    (n, h·d) the heads' z (the attention call's output) there."""
    g = gates(module, hidden_states).double()  # (n, h, d)
    n, h, d = g.shape
    z = head_output.double().view(n, h, d) * g  # (n, h, d)
    w = module.o_proj.weight.detach().double().view(-1, h, d)  # (m, h, d)
    bias = module.o_proj.bias
    return torch.einsum("nhd,mhd->hnm", z, w), None if bias is None else bias.detach().double()
