"""Lightning attention (minimax) as a matrix: linear attention with a fixed decay per head.

transformers' `MiniMaxLightningAttention` computes, blockwise, per head with slope s:

    o_i = Σ_{j ≤ i} exp(−s·(i − j)) · (q_i · k_j) · v_j

(q, k, v = act(x·W_qkv) split per head; no softmax, no scaling), so M[i, j] =
exp(−s(i−j))·q_i·k_j — `decayed_products` with G_i = −s·i.
The layer computes this inline in its forward (no kernel function to record), so q, k, v are
read through the module's own `qkv_proj` and `act_fn`, and its output before the norm from
the input of its `norm` (a hook held for the one call), which the tests compare with M·v.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from qkv.errors import QkvError
from qkv.explain.mixers.delta_rule import check_query
from qkv.explain.mixers.linear import EffectiveAttention, decayed_products, decayed_row


@dataclass(frozen=True)
class Lightning(EffectiveAttention):
    """One text through a lightning-attention layer, per head, in float64. Letters: t, h, d."""

    kind = "lightning"
    query: torch.Tensor   # (t, h, d)
    key: torch.Tensor     # (t, h, d)
    value: torch.Tensor   # (t, h, d)
    slope: torch.Tensor   # (h,) the decay rate s: a step multiplies the state by exp(−s)
    output: torch.Tensor  # (t, h, d) the layer's output before its norm and output gate

    @property
    def heads(self) -> int:
        return self.value.shape[1]

    def values(self, head: int) -> torch.Tensor:
        return self.value[:, head]

    def _log_decay(self, head: int) -> torch.Tensor:
        t = self.value.shape[0]
        return -self.slope[head] * torch.arange(t, dtype=self.slope.dtype)  # (t,)

    def matrix(self, head: int) -> torch.Tensor:
        """(t, t) M with o = M·v: exp(−s(i−j))·q_i·k_j below the diagonal."""
        return decayed_products(self.query[:, head], self.key[:, head], self._log_decay(head))

    def row(self, head: int, query: int) -> torch.Tensor:
        """(t,) row `query` of `matrix` in O(t·d)."""
        check_query(query, self.value.shape[0])
        return decayed_row(self.query[query, head], self.key[:, head], self._log_decay(head), query)


def read(module: torch.nn.Module, hidden_states: torch.Tensor, dtype: torch.dtype = torch.float64) -> Lightning:
    """Run a `MiniMaxLightningAttention` layer on one text and return what it mixed.

    Args:
        module: the layer's `self_attn` where its type is `MiniMaxLightningAttention`.
        hidden_states: (1, t, hidden) its input, after the layer's norm.
        dtype: what the record holds and its matrices compute in (the layer runs in its own).
    """
    b, t, _ = hidden_states.shape
    if b != 1:
        raise QkvError(f"one text at a time: the batch holds {b}")
    h, d = module.num_attention_heads, module.head_dim
    seen: list[torch.Tensor] = []
    hook = module.norm.register_forward_pre_hook(lambda _m, args: seen.append(args[0].detach()))
    try:
        with torch.no_grad():
            module(hidden_states, position_embeddings=None, attention_mask=None)
            qkv = module.act_fn(module.qkv_proj(hidden_states))  # (1, t, h·3d)
    finally:
        hook.remove()
    q, k, v = qkv[0].to(dtype).reshape(t, h, 3 * d).split(d, dim=-1)  # (t, h, d) each
    return Lightning(query=q, key=k, value=v, slope=module.slope_rate.detach().to(dtype).reshape(h),
                     output=seen[0][0].to(dtype).reshape(t, h, d))
