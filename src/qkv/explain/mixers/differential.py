"""Differential attention (diffllama): two softmax maps, λ, and their difference as the map.

transformers' `DiffLlamaAttention` runs one softmax per attention head (H of them) and pairs
head p with head p + H/2 (p < H/2): differential head p outputs, before its group norm,

    o_p = (A_p − λ·A_{p+H/2}) · [v_a | v_b]          λ = exp(λ_q1·λ_k1) − exp(λ_q2·λ_k2) + λ_init

with [v_a | v_b] the two value heads it reads, side by side (2·d channels). So the map of a
differential head is W_p = A_p − λ A_{p+H/2}: signed, its rows sum to 1 − λ. The group norm
(RMS over the 2·d channels, times 1 − λ_init) comes after and is not part of the map.

Both softmax maps are the layer's own weights (its first attention call returns all H); the
values and λ are read from the same call and the module's λ parameters. `read` records the calls
of transformers' eager kernel; `read_traced` the calls of qkv's own attention, for a layer of a
model from `qkv.load` (which runs qkv's attention, not eager): the same record either way.
Letters: t tokens, p differential heads (H/2), d a value head's width.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from qkv.errors import QkvError
from qkv.explain.mixers.capture import kernel_calls
from qkv.explain.mixers.linear import EffectiveAttention

KERNEL = "eager_attention_forward"  # the layer must run with attn_implementation="eager"


@dataclass(frozen=True)
class Differential(EffectiveAttention):
    """One text through a differential-attention layer, in float64."""

    kind = "differential"
    first: torch.Tensor    # (p, t, t) A_p, the positive softmax map
    second: torch.Tensor   # (p, t, t) A_{p+H/2}, the map subtracted
    lam: float             # λ, one per layer
    lambda_init: float     # λ_init = 0.8 − 0.6·exp(−0.3·layer): the group norm's output is × (1 − λ_init)
    value: torch.Tensor    # (t, p, 2d) the values head p reads: [v_a | v_b]
    output: torch.Tensor   # (t, p, 2d) the layer's own combination, before its group norm

    @property
    def heads(self) -> int:
        return self.first.shape[0]

    def values(self, head: int) -> torch.Tensor:
        return self.value[:, head]

    def matrix(self, head: int) -> torch.Tensor:
        """(t, t) W = A_first − λ·A_second: o = W·[v_a | v_b]; rows sum to 1 − λ."""
        return self.first[head] - self.lam * self.second[head]

    def map_lambda(self) -> float:
        """λ: M = A_first − λ·A_second."""
        return self.lam


def read(module: torch.nn.Module, hidden_states: torch.Tensor, position_embeddings) -> Differential:
    """Run a `DiffLlamaAttention` layer on one text, causally, and return both maps and λ.

    Args:
        module: the layer's `self_attn`, its config's `_attn_implementation` "eager".
        hidden_states: (1, t, hidden) its input, after the layer's norm.
        position_embeddings: (cos, sin) of positions 0 … t−1, as the model hands its layers.
    """
    b, t, _ = hidden_states.shape
    if b != 1:
        raise QkvError(f"one text at a time: the batch holds {b}")
    mask = torch.full((t, t), torch.finfo(hidden_states.dtype).min, dtype=hidden_states.dtype).triu(1)
    seen: list[torch.Tensor] = []
    hook = module.groupnorm.register_forward_pre_hook(lambda _m, args: seen.append(args[0].detach()))
    try:
        calls = kernel_calls(module, KERNEL, hidden_states, position_embeddings=position_embeddings,
                             attention_mask=mask[None, None])
    finally:
        hook.remove()
    if len(calls) != 2:
        raise QkvError(f"{type(module).__name__} made {len(calls)} attention calls, not the two of differential attention")
    first_call, second_call = calls
    weights = first_call.result[1][0].double()  # (H, t, t)
    H = weights.shape[0]
    p, n_rep = H // 2, module.num_key_value_groups
    v_a = first_call.arguments["value"][0].double().repeat_interleave(n_rep, dim=0)[:p]   # (p, t, d)
    v_b = second_call.arguments["value"][0].double().repeat_interleave(n_rep, dim=0)[:p]  # (p, t, d)
    return Differential(first=weights[:p], second=weights[p:], lam=_lam(module), lambda_init=float(module.lambda_init),
                        value=torch.cat([v_a, v_b], dim=-1).transpose(0, 1), output=seen[0][0].double())


def read_traced(module: torch.nn.Module, hidden_states: torch.Tensor, **call) -> Differential:
    """`read`'s record from a layer that runs qkv's attention (a model from `qkv.load`).

    The layer is run once more on `hidden_states` with the arguments of its call in the
    forward (`call`: position embeddings, the mask; the cache is left out, so nothing is
    appended to it) inside a `qkv.hf.trace.Recording` of every row: its two attention calls
    give the weights (H, t, t) and each call's values, as the eager kernel's do for `read`.

    Raises:
        QkvError: a batch of more than one text, or not the two calls of differential attention.
    """
    b, t, _ = hidden_states.shape
    if b != 1:
        raise QkvError(f"one text at a time: the batch holds {b}")
    call = {k: v for k, v in call.items() if k not in ("cache", "past_key_values")}
    # imported here: qkv.hf registers with transformers (seconds), which every command would pay
    from qkv.hf.trace import Recording, recording

    rec = Recording(keys={id(module): 0}, rows=slice(None))  # the second call is kept as (0, 1)
    seen: list[torch.Tensor] = []
    hook = module.groupnorm.register_forward_pre_hook(lambda _m, args: seen.append(args[0].detach()))
    try:
        with torch.no_grad(), recording(rec):
            module(hidden_states, **call)
    finally:
        hook.remove()
    if set(rec.traces) != {0, (0, 1)}:
        raise QkvError(f"{type(module).__name__} made {len(rec.traces)} attention calls, not the two of differential attention")
    weights = rec.traces[0].weights[0].double()  # (H, t, t)
    H = weights.shape[0]
    p = H // 2
    v_a, v_b = (_per_query_head(rec.traces[key].value[0].double(), H)[:p] for key in (0, (0, 1)))  # (p, t, d) each
    return Differential(first=weights[:p], second=weights[p:], lam=_lam(module), lambda_init=float(module.lambda_init),
                        value=torch.cat([v_a, v_b], dim=-1).transpose(0, 1), output=seen[0][0].double())


def _per_query_head(value: torch.Tensor, heads: int) -> torch.Tensor:
    """(heads, t, d): a call's values (h_v, t, d), each repeated for the query heads that read it."""
    return value.repeat_interleave(heads // value.shape[0], dim=0)


def _lam(module: torch.nn.Module) -> float:
    """λ = exp(λ_q1·λ_k1) − exp(λ_q2·λ_k2) + λ_init, from the module's parameters."""
    with torch.no_grad():
        return float(torch.exp((module.lambda_q1 * module.lambda_k1).sum())
                     - torch.exp((module.lambda_q2 * module.lambda_k2).sum()) + module.lambda_init)
