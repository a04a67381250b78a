"""The causal check of a score attribution: take one component out of the key's residual and
run the model again.

A component b of layer ℓ's input at the key's position j is subtracted from what enters layer ℓ
there (the forward's own `interventions=`: `Interventions.inputs[ℓ]`, a function of the
input; nothing else changes). The attribution predicts the new score

    s'_ij = s_ij − Σ_a terms[a, b]

exactly when the key is a linear function of the layer's input: a post-norm layer (BERT,
MiniLM: the attention reads x itself). In a pre-norm layer the norm in front of the attention
recomputes its scale on the edited vector; the prediction is then the frozen-scale one, and
`scale_ratio` (σ before / σ after, of the key's norm) says by how much the forward's differs
(for an RMSNorm with no biases downstream — Llama — k' = ratio · (k − k_b) exactly).

Examples:
    >>> import qkv
    >>> from qkv.explain import score_attribution
    >>> lm = qkv.load("lm")
    >>> a = score_attribution(lm, "baka bela dima fona baka bela dima fona", layer=1, head=0,
    ...                       token=7, key=4)
    >>> r = remove_component(lm, a, "L0.H1")
    >>> r.measured < r.before                     # the previous-token head's write was the key
    True
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from qkv.explain.circuits.norms import linearise
from qkv.explain.circuits.residual import stream
from qkv.explain.contributions.base import run
from qkv.explain.wording import ArgumentError
from qkv.modules.intervention import Interventions


@dataclass(frozen=True)
class Removal:
    """One component taken out of the key's residual.

    Attributes:
        component: the component removed.
        before: the attribution's forward score.
        predicted: `before` − its column of `terms`.
        measured: the forward's score with it removed.
        exact: whether the prediction is exact (the layer's attention reads its input with no
            norm in front).
        scale_ratio: σ/σ' of the key's norm in front of the attention (1.0 when there is none).
    """

    component: str
    before: float
    predicted: float
    measured: float
    exact: bool
    scale_ratio: float


@torch.no_grad()
def remove_component(model, attribution, component: str) -> Removal:
    """Run `attribution`'s text again with key-side `component` removed from the key's
    input to its layer → `Removal`."""
    names = attribution.key_components
    if component not in names:
        raise ArgumentError("component", "{name} {value!r} is not one of the key's components "
                            "({known})", value=component, known=", ".join(names))
    b = names.index(component)
    layer, head, i, j = (attribution.layer, attribution.head, attribution.token_index,
                         attribution.key_index)
    ids = torch.tensor([model.tokenizer.encode(attribution.text).ids])
    fwd = run(model, ids, torch.tensor([i]))
    part = stream(model, fwd, layer, torch.tensor([j])).parts[b, 0]  # (E,)
    x = fwd.hidden_states[layer][0, j]
    delta = torch.zeros_like(fwd.hidden_states[layer])  # (1, t, E)
    delta[0, j] = part.to(delta.dtype)
    edited = run_edited(model, ids, i, layer, delta)
    att = edited.traces[layer].self_attn.attention
    measured = float(att.scores[0, head, 0, j]) * float(att.scale)
    lay = model.layers[layer]
    ratio = 1.0
    if lay.norm_first:
        before = linearise(lay.norm1, x[None]).scale[0]
        after = linearise(lay.norm1, (x - part.to(x.dtype))[None]).scale[0]
        ratio = float((after / before).mean())  # γ cancels: σ/σ'
    return Removal(component=component, before=attribution.score,
                   predicted=attribution.score - float(attribution.terms[:, b].sum()),
                   measured=measured, exact=not lay.norm_first, scale_ratio=ratio)


def run_edited(model, ids: torch.Tensor, row: int, layer: int, delta: torch.Tensor):
    """The model's traced forward (row `row`) with `delta` (1, t, E) subtracted from what
    enters layer `layer` — through `Interventions.inputs`."""
    edits = Interventions(inputs={layer: lambda x: x - delta})
    return model(ids, torch.ones_like(ids), trace_rows=torch.tensor([row]),
                 output_hidden_states=True, interventions=edits)


__all__ = ["Removal", "remove_component", "run_edited"]
