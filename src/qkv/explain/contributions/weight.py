"""`weight`: the attention weights themselves, A^{ℓ,h}_ij — what `qkv explain` always showed.

A weight says how much of head h's *average* token i takes from token j, not how much token j
changes token i: a heavy weight on a short value vector moves little (see `norm`).

On a hybrid model only the softmax layers have weights: a linear-attention or state-space
layer's effective map (`qkv.explain.mixer_maps.mixer_map`) is signed and its rows need not
sum to 1, so it is no share of attention to rank beside them — those layers are left out
(`Scores.unscored`) and the rankings say so.
"""

from __future__ import annotations

import torch

from qkv.explain.contributions.base import Method, Scores, run

FORMULA = "A^{ℓ,h}_ij, the softmax weight (every row sums to 1)"


def compute(model, ids: torch.Tensor, rows: torch.Tensor, target_text: str | None = None) -> Scores:
    """(L, h, r, s): every layer's weights for the query rows `rows`, from one forward.

    Examples:
        >>> import qkv
        >>> model = qkv.load("minilm")
        >>> ids = torch.tensor([model.tokenizer.encode("the cat sat").ids])
        >>> compute(model, ids, torch.tensor([3])).scores.shape      # 6 layers, 12 heads, 5 keys
        torch.Size([6, 12, 1, 5])
    """
    fwd = run(model, ids, rows)
    traced = [None if tr.self_attn is None else tr.self_attn.attention.weights[0] for tr in fwd.traces]
    first = next(w for w in traced if w is not None)  # (h, r, s); qkv.load needs one softmax layer
    unscored = tuple(i for i, w in enumerate(traced) if w is None)  # a hybrid's linear / SSM layers
    weights = torch.stack([first.new_zeros(first.shape) if w is None else w for w in traced])  # (L, h, r, s)
    return Scores(method="weight", per="head", rows=torch.as_tensor(rows), scores=weights,
                  unscored=unscored)


def from_document(doc, rows: torch.Tensor) -> Scores:
    """(L, h, r, N): the weights of `rows`, recomputed from a long document's saved q and k."""
    weights = torch.stack([doc.row_weights(layer, rows) for layer in range(len(doc.layers))])
    return Scores(method="weight", per="head", rows=rows, scores=weights)


METHOD = Method(name="weight", per="head", formula=FORMULA, compute=compute, raw=True,
                document=from_document, cost="one forward (the overview's)", hybrid=True)
