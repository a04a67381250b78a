"""`rollout` (Abnar & Zuidema, 2020, "Quantifying Attention Flow in Transformers"): attention
followed back through the layers.

The residual connection carries each token on past the attention, so each layer's head-averaged
weights are mixed half and half with the identity, and the layers are multiplied:

    Â^ℓ = ½ Ā^ℓ + ½ I,   Ā^ℓ = (1/h) Σ_h A^{ℓ,h}
    R^ℓ = Â^ℓ R^{ℓ−1},   R^0 = I

Row i of R^ℓ says how much of token i after layer ℓ comes from each input token. Rows sum to 1.

Memory: every layer's full (t × t) matrix (the row of R^ℓ needs all of R^{ℓ−1}), so the
forward traces every row: O(L · h · t²) numbers, not the O(L · h · t) of the per-head methods.

`flow` (`flow`) is the paper's max-flow variant over the same capacities.
"""

from __future__ import annotations

import torch

from qkv.explain.contributions.base import Matrices, Method, Scores, run

FORMULA = "R^ℓ = (½Ā^ℓ + ½I) R^{ℓ−1}, R^0 = I, Ā^ℓ the head mean of A^{ℓ,h}"


def layer_matrices(fwd) -> list[torch.Tensor]:
    """Each layer's Â^ℓ = ½Ā^ℓ + ½I (t, t), from a forward that traced every row (flow reads them too)."""
    out = []
    for tr in fwd.traces:
        mean = tr.self_attn.attention.weights[0].mean(0)  # (t, s), t = s
        out.append(0.5 * mean + 0.5 * torch.eye(mean.shape[-1], dtype=mean.dtype))
    return out


def matrices(model, ids: torch.Tensor, rows: torch.Tensor, target_text: str | None = None) -> Matrices:
    """Every layer's Â^ℓ (t, t) from one forward tracing every row; `METHOD.run` rolls them out.

    Examples:
        >>> import qkv
        >>> model = qkv.load("minilm")
        >>> ids = torch.tensor([model.tokenizer.encode("the cat sat").ids])
        >>> s = METHOD.run(model, ids, torch.tensor([3]))
        >>> s.scores.shape, bool(s.scores.sum(-1).sub(1).abs().max() < 1e-5)
        (torch.Size([6, 1, 5]), True)
    """
    return Matrices(layer_matrices(run(model, ids, slice(None))))


def from_document(doc, rows: torch.Tensor) -> Scores:
    """(L, r, N): rows `rows` of R^1 … R^L from a long document's record, never a matrix:
    e_rows Â^ℓ … Â^1 as row vectors times each layer's attention (`doc.through`), restarted for
    each ℓ (the product runs from the top layer down) — L(L+1)/2 sweeps over the keys, O(N) memory."""
    start = torch.zeros(len(rows), len(doc), dtype=torch.float64)
    start[torch.arange(len(rows)), rows] = 1.0  # (r, N)
    out = []
    for top in range(len(doc.layers)):
        v = start
        for layer in range(top, -1, -1):  # v ← v Â^layer = ½ v Ā + ½ v
            v = 0.5 * doc.through(layer, v).double().mean(0) + 0.5 * v
        out.append(v.float())
    return Scores(method="rollout", per="layer", rows=rows, scores=torch.stack(out))


METHOD = Method(name="rollout", per="layer", formula=FORMULA, matrices=matrices,
                document=from_document,
                cost="one forward tracing every row; (t × t) per layer")
