"""A gated short convolution (lfm2, lfm2_moe) as a matrix per channel.

transformers' `Lfm2ShortConv` projects x to three streams B, C, x̃ (per channel c) and computes

    y_t = C_t ⊙ ( Σ_{k<K} w_k ⊙ (B ⊙ x̃)_{t−K+1+k}  + bias )

a depthwise causal convolution of width K between two input-dependent gates. Each channel is
its own mixer, linear in its values x̃ (up to the bias term C_t·bias, kept apart as `offset`):

    M_c[t, j] = C_tc · w_c[K−1−(t−j)] · B_jc        for 0 ≤ t − j < K, else 0

— a causal band K tokens wide. The convolution's input and output are the layer's own
`causal_conv1d_fn` call; B, C, x̃ go through its `in_proj` (the tests check B ⊙ x̃ is that
call's input). Letters: t tokens, D channels, K the kernel width.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from qkv.errors import QkvError
from qkv.explain.mixers.capture import kernel_call
from qkv.explain.mixers.delta_rule import check_query
from qkv.explain.mixers.linear import EffectiveAttention

KERNEL = "causal_conv1d_fn"


@dataclass(frozen=True)
class ShortConv(EffectiveAttention):
    """One text through a gated short convolution, per channel, in float64."""

    kind = "short_conv"
    B: torch.Tensor        # (t, D) the input gate
    C: torch.Tensor        # (t, D) the output gate
    x: torch.Tensor        # (t, D) the values
    weight: torch.Tensor   # (D, K) the depthwise kernel, oldest tap first
    offset: torch.Tensor   # (t, D) C_t·bias: what the layer adds that no value carries (0 without a bias)
    output: torch.Tensor   # (t, D, 1) the layer's own y, before its out_proj

    @property
    def heads(self) -> int:
        return self.x.shape[1]

    def values(self, head: int) -> torch.Tensor:
        """(t, 1) channel `head`'s values."""
        return self.x[:, head: head + 1]

    def rebuilt(self, head: int) -> torch.Tensor:
        """(t, 1) channel `head`'s output as M·x + offset (the bias term C·bias reaches no value)."""
        return self.matrix(head) @ self.values(head) + self.offset[:, head: head + 1]

    def matrix(self, head: int) -> torch.Tensor:
        """(t, t) the banded M of channel `head`: y = M·x + offset."""
        t, K = self.x.shape[0], self.weight.shape[1]
        lag = torch.arange(t)[:, None] - torch.arange(t)[None, :]  # (t, t) t − j
        inside = (lag >= 0) & (lag < K)
        taps = self.weight[head][(K - 1 - lag).clamp(0, K - 1)] * inside  # (t, t) w[K−1−(t−j)] in the band
        return self.C[:, head, None] * taps * self.B[None, :, head]

    def row(self, head: int, query: int) -> torch.Tensor:
        """(t,) row `query`: at most K non-zero weights."""
        check_query(query, self.x.shape[0])
        K = self.weight.shape[1]
        out = torch.zeros(self.x.shape[0], dtype=self.x.dtype)
        first = max(0, query - K + 1)
        j = torch.arange(first, query + 1)
        out[first: query + 1] = self.C[query, head] * self.weight[head][K - 1 - (query - j)] * self.B[first: query + 1, head]
        return out


def read(module: torch.nn.Module, hidden_states: torch.Tensor) -> ShortConv:
    """Run an `Lfm2ShortConv` layer (the layer's `conv`) on one text and return what it mixed.

    Args:
        module: the short-convolution mixer.
        hidden_states: (1, t, hidden) its input, after the layer's norm.
    """
    b, t, _ = hidden_states.shape
    if b != 1:
        raise QkvError(f"one text at a time: the batch holds {b}")
    call = kernel_call(module, KERNEL, hidden_states)
    with torch.no_grad():
        B, C, x = module.in_proj(hidden_states)[0].double().T.chunk(3, dim=0)  # (D, t) each
    weight = call.arguments["weight"].detach().double()  # (D, K)
    bias = call.arguments.get("bias")
    conv = call.result[0].detach().double()  # (D, t) the convolution's output
    offset = torch.zeros_like(C) if bias is None else C * bias.detach().double()[:, None]
    return ShortConv(B=B.T, C=C.T, x=x.T, weight=weight, offset=offset.T, output=(C * conv).T[..., None])
