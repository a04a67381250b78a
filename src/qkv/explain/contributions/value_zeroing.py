"""``value-zeroing`` (Mohebbi et al., 2023, "Quantifying Context Mixing in Transformers"): how
much token i's output changes when token j's value vector is removed.

For each layer ℓ and each key j, the layer is run again on the same input with v_j = 0 in every
head (the values, not the keys: token j still takes its share of the softmax, it hands over
nothing); token i's output x̃_i^{¬j} is compared with the unchanged run's x̃_i:

    C^ℓ_ij = 1 − cos(x̃_i, x̃_i^{¬j}),   rows normalised to sum 1,   R^ℓ = C^ℓ R^{ℓ−1}

The whole layer runs (attention, residual, norms, feed-forward), through the model's own
module: a forward hook on ``self_attn.v_proj`` zeroes row j of its output. The t variants and
the unchanged run are one batch of t + 1 (so the comparison shares one kernel and its
roundings): per layer t + 1 runs of one layer, i.e. about t + 1 forwards in all.
"""

from __future__ import annotations

import torch

from qkv.attention.masks import AttentionMask
from qkv.explain.contributions.base import Forward, Method, Scores, check_layers, rollout, run

FORMULA = "C_ij ∝ 1 − cos(x̃_i, x̃_i with v_j = 0 in every head); R^ℓ = C^ℓ R^{ℓ−1}"


def _batched(value, b: int):
    """A layer's keyword argument for a batch of b: tensors and masks with batch 1 repeated."""
    if isinstance(value, torch.Tensor) and value.ndim and value.shape[0] == 1:
        return value.expand(b, *value.shape[1:])
    if isinstance(value, AttentionMask) and value.key_padding is not None:
        return value.with_(key_padding=value.key_padding.expand(b, -1))
    return value


def layer_matrix(layer, x: torch.Tensor, call: dict) -> torch.Tensor:
    """(t, t) C for one layer: ``x`` (1, t, E) its input, ``call`` the keyword arguments the
    stack called it with (its mask)."""
    t = x.shape[1]
    keep = torch.ones(t + 1, t, 1, dtype=x.dtype, device=x.device)  # variant j zeroes token j
    keep[torch.arange(t), torch.arange(t)] = 0  # the last variant zeroes nothing

    def zero_values(module, args, output):
        return output * keep  # (t + 1, t, h_kv·d)

    kwargs = {k: _batched(v, t + 1) for k, v in call.items() if k not in ("trace_rows", "kv_cache")}
    handle = layer.self_attn.v_proj.register_forward_hook(zero_values)
    try:
        out = layer(x.expand(t + 1, -1, -1), **kwargs).hidden  # (t + 1, t, E)
    finally:
        handle.remove()
    base, zeroed = out[t], out[:t]  # (t, E), (j, i, E)
    zeroed = zeroed.transpose(0, 1)  # (i, j, E)
    c = 1 - torch.cosine_similarity(zeroed, base.unsqueeze(1), dim=-1)  # (i, j)
    # An output the zeroing did not touch (a later token under a causal mask) changed by
    # nothing; cos(x, x) is 1 only to a rounding, so say 0 exactly.
    c = torch.where((zeroed == base.unsqueeze(1)).all(-1), 0.0, c.clamp_min(0))
    return c / c.sum(-1, keepdim=True).clamp_min(torch.finfo(c.dtype).tiny)


def matrices(model, ids: torch.Tensor, fwd: Forward | None = None) -> list[torch.Tensor]:
    """Each layer's C^ℓ (t, t), before rollout."""
    check_layers(model, "value-zeroing")
    fwd = fwd if fwd is not None else run(model, ids, None)
    with torch.no_grad():
        return [layer_matrix(layer, fwd.hidden_states[i], fwd.layer_calls[i])
                for i, layer in enumerate(model.layers)]


def compute(model, ids: torch.Tensor, rows: torch.Tensor, target_text: str | None = None) -> Scores:
    """(L, r, s): row ``rows`` of R^1 … R^L.

    Example:
        >>> import qkv
        >>> model = qkv.load("minilm")
        >>> ids = torch.tensor([model.tokenizer.encode("the cat sat").ids])
        >>> s = compute(model, ids, torch.tensor([3]))
        >>> s.scores.shape, bool(s.scores.sum(-1).sub(1).abs().max() < 1e-5)
        (torch.Size([6, 1, 5]), True)
    """
    rolled = rollout(matrices(model, ids))
    return Scores(method="value-zeroing", per="layer", rows=torch.as_tensor(rows),
                  scores=torch.stack([r[rows] for r in rolled]))


METHOD = Method(name="value-zeroing", per="layer", formula=FORMULA, compute=compute,
                cost="t + 1 runs of every layer, batched (≈ t + 1 forwards); (t × t) per layer")
