"""`value-zeroing` (Mohebbi et al., 2023, "Quantifying Context Mixing in Transformers"): how
much token i's output changes when token j's value vector is removed.

For each layer ℓ and each key j, the layer is run again on its unchanged input with v_j = 0 in
every head (the values, not the keys: token j still takes its share of the softmax, it hands over
nothing); token i's output x̃_i^{¬j} is compared with the unchanged run's x̃_i:

    C^ℓ_ij = 1 − cos(x̃_i, x̃_i^{¬j}),   rows normalised to sum 1,   R^ℓ = C^ℓ R^{ℓ−1}

The whole layer runs (attention, residual, norms, feed-forward), through the model's own
modules: one forward of a batch of t + 1 copies of the text, with
`Interventions` passed to the forward — copy j's value of token j zeroed, and
every copy given the plain copy's (t's) input to each layer — so each layer's variants start from
the unperturbed hidden states, and the comparison shares one kernel and its roundings. Cost: one
forward of t + 1 copies.
"""

from __future__ import annotations

import torch

from qkv.explain.contributions.base import Matrices, Method, check_layers
from qkv.explain.finite import check_layers as check_finite
from qkv.modules import Interventions

FORMULA = "C_ij ∝ 1 − cos(x̃_i, x̃_i with v_j = 0 in every head); R^ℓ = C^ℓ R^{ℓ−1}"


def matrices(model, ids: torch.Tensor, rows: torch.Tensor | None = None,
             target_text: str | None = None) -> Matrices:
    """Each layer's C^ℓ (t, t), before rollout, from one forward of a batch of t + 1 copies
    (`METHOD.run` rolls them out).

    Copy j (< t) has v_j zeroed in every layer; copy t is the plain text. Every layer's input is
    patched with the plain copy's (`Interventions.inputs`), so each layer's variants start from
    the unchanged hidden states, exactly as re-running that layer alone would; the layers'
    outputs are the stack's `hidden_states[ℓ + 1]` (what each layer computed, before a patch).
    """
    check_layers(model, "value-zeroing")
    t, n_layers = ids.shape[1], len(model.layers)
    keep = torch.ones(t + 1, t)  # (copy, token): copy j zeroes token j's value in every head
    keep[torch.arange(t), torch.arange(t)] = 0
    plain = lambda x: x[t:].expand_as(x)  # noqa: E731  (t + 1, t, E): every copy gets copy t's
    # layer 0's copies are the embeddings of one text: equal already, nothing to patch
    edits = Interventions(values={i: keep for i in range(n_layers)},
                          inputs={i: plain for i in range(1, n_layers)})
    batch = ids.expand(t + 1, -1)  # (t + 1, t)
    with torch.no_grad():
        out = model(batch, torch.ones_like(batch), output_hidden_states=True, interventions=edits)
    outputs = out.hidden_states[1:]  # L tensors (t + 1, t, E)
    check_finite((), model=model.name, output=outputs[-1])
    return Matrices([_matrix(o, t) for o in outputs])


def _matrix(out: torch.Tensor, t: int) -> torch.Tensor:
    """(t, t) C from one layer's outputs (t + 1, t, E): copies 0 … t − 1 zeroed, copy t plain."""
    base, zeroed = out[t], out[:t].transpose(0, 1)  # (i, E), (i, j, E)
    c = 1 - torch.cosine_similarity(zeroed, base.unsqueeze(1), dim=-1)  # (i, j)
    # An output the zeroing did not touch (a later token under a causal mask) changed by
    # nothing; cos(x, x) is 1 only to a rounding, so say 0 exactly.
    c = torch.where((zeroed == base.unsqueeze(1)).all(-1), 0.0, c.clamp_min(0))
    return c / c.sum(-1, keepdim=True).clamp_min(torch.finfo(c.dtype).tiny)


METHOD = Method(name="value-zeroing", per="layer", formula=FORMULA, matrices=matrices,
                cost="t + 1 runs of every layer, batched (≈ t + 1 forwards); (t × t) per layer")
