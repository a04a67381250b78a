"""`norm` (Kobayashi et al., 2020, "Attention is Not Only a Weight"): how long a vector each
key actually sends.

Per head the output of token i is `Σ_j A_ij f^h(h_j)` (see `base`), so token j's share
is the vector `A_ij f^h(h_j)` and its size

    per head:   ‖A^{ℓ,h}_ij f^h(h_j)‖ = A^{ℓ,h}_ij ‖f^h(h_j)‖
    per layer:  ‖Σ_h A^{ℓ,h}_ij f^h(h_j)‖

A head that puts 0.86 of its weight on [CLS] moves little if [CLS]'s `f^h` is short. Where
the layer gates its heads' outputs (Qwen3-Next / 3.5), `f^h` depends on the query too:
`f_i^h(h_j) = (sigmoid(gate_ih) ⊙ v_j) W_O^h` (`base.head_vectors`), so a head with high
weights and a closed gate contributes little. On a hybrid the layers no softmax mixes are left
out (`Scores.unscored`, as `weight` does). The terms are exact: `Σ_h Σ_j A_ij f^h(h_j) + b_O` *is* the attention block's output
(`terms` returns them; the tests rebuild the block's output from them).

Cost: one forward plus one (s × d) · (d × E) product per head and layer — the size of the
output projection applied to every token once more.
"""

from __future__ import annotations

import torch

from qkv.explain.contributions.base import Method, Scores, check_layers, has_output, head_vectors, run
from qkv.explain.wording import ArgumentError

FORMULA = "‖A^{ℓ,h}_ij f^h(h_j)‖ per head; ‖Σ_h A^{ℓ,h}_ij f^h(h_j)‖ per layer"


def terms(attn, trace) -> torch.Tensor:
    """(h, r, s, E): the vectors A^h_ij f^h(h_j) for the traced rows i of one layer.

    Summed over heads and keys, plus `out_proj`'s bias, they are the block's output rows.
    """
    a = trace.attention.weights[0]  # (h, r, s)
    return a.unsqueeze(-1) * head_vectors(attn, trace)  # (h, r, s, E)


def compute(model, ids: torch.Tensor, rows: torch.Tensor, target_text: str | None = None) -> Scores:
    """Per-head norms (L, h, r, s) and per-layer norms (L, r, s) for the query rows `rows`.

    Examples:
        >>> import qkv
        >>> model = qkv.load("minilm")
        >>> ids = torch.tensor([model.tokenizer.encode("the cat sat").ids])
        >>> s = compute(model, ids, torch.tensor([3]))
        >>> s.scores.shape, s.layer_scores.shape
        (torch.Size([6, 12, 1, 5]), torch.Size([6, 1, 5]))
    """
    fwd = run(model, ids, rows)
    per_head, per_layer = [], []
    with torch.no_grad():
        for layer, tr in zip(model.layers, fwd.traces):
            if tr.self_attn is None:  # a hybrid's linear / SSM layer: left out
                per_head.append(None)
                per_layer.append(None)
                continue
            a = tr.self_attn.attention.weights[0]  # (h, r, s)
            f = head_vectors(layer.self_attn, tr.self_attn)  # (h, r or 1, s, E)
            per_head.append(a * f.norm(dim=-1))  # (h, r, s): A ≥ 0, so ‖A f‖ = A‖f‖
            per_layer.append(torch.einsum("hrs,hse->rse", a, f[:, 0]).norm(dim=-1) if f.shape[1] == 1
                             else torch.einsum("hrs,hrse->rse", a, f).norm(dim=-1))  # (r, s)
    unscored = tuple(i for i, w in enumerate(per_head) if w is None)
    head0 = next(w for w in per_head if w is not None)  # qkv.load needs one softmax layer
    return Scores(method="norm", per="head", rows=torch.as_tensor(rows),
                  scores=torch.stack([head0.new_zeros(head0.shape) if w is None else w for w in per_head]),
                  layer_scores=torch.stack([head0.new_zeros(head0.shape[1:]) if w is None else w for w in per_layer]),
                  unscored=unscored)


def from_document(doc, rows: torch.Tensor) -> Scores:
    """(L, h, r, N): A_ij ‖f^h(h_j)‖ from a long document's record (the value norms it kept)."""
    scores = torch.stack([doc.row_weights(layer, rows) * rec.value_norms.unsqueeze(1)  # (h, r, N)
                          for layer, rec in enumerate(doc.layers)])
    return Scores(method="norm", per="head", rows=rows, scores=scores)


def check_applies(model) -> None:
    """ArgumentError unless every softmax layer's output projection W_O is known (`out_proj`,
    or the projection after an output gate)."""
    check_layers(model, "norm", hybrid=True)
    for layer in model.layers:
        if layer.self_attn is not None and not has_output(layer.self_attn):
            raise ArgumentError("method", "{name} 'norm' does not apply to {model}: it needs each "
                                "head's output projection W_O (f^h(h_j) = v_j W_O^h), and no "
                                "projection reading the heads' outputs was found in its layers",
                                model=model.name)


METHOD = Method(name="norm", per="head", formula=FORMULA, compute=compute, document=from_document,
                applies=check_applies, hybrid=True, cost="one forward + f^h(h_j) for every key (the output projection once more)")
