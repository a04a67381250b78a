"""`flow` (Abnar & Zuidema, 2020, "Quantifying Attention Flow in Transformers", attention
flow): how much can flow from input token j to token i after layer ℓ through the layers' mixing.

The layers form a graph: node (ℓ, i) is token i after layer ℓ (ℓ = 0: the input), and each
edge (ℓ − 1, j) → (ℓ, i) has the capacity Â^ℓ_ij = ½ Ā^ℓ_ij + ½ δ_ij — rollout's matrix
(`rollout`). Where rollout multiplies the matrices (every path counts, weighted by the
product of its weights), flow asks for the **maximum flow** from (0, j) to (ℓ, i): paths share
the edges' capacities, so a heavy single path is not counted twice.

    F^ℓ_ij = maxflow((0, j) → (ℓ, i))   in the graph of layers 0 … ℓ

One max-flow problem per (layer, key) for the token's row: L · t problems on graphs of up to
(L + 1) · t nodes and L · t² edges, solved with networkx (a dependency of torch, pure Python).
That finishes in seconds only for short texts, so `flow` refuses texts longer than
`MAX_TOKENS` tokens (measured on this project's machine, L = 6: 14 tokens 0.7 s, 32
tokens 17 s, for one token's row).
"""

from __future__ import annotations

import torch

from qkv.explain.contributions.base import Method, Scores, run
from qkv.explain.contributions.rollout import layer_matrices as rollout_matrices
from qkv.explain.wording import ArgumentError

FORMULA = "F^ℓ_ij = max-flow from input j to token i after layer ℓ, capacities ½Ā^ℓ + ½I"

#: The longest text ``flow`` takes, in tokens: about 5 s for one token's row on a 6-layer model.
MAX_TOKENS = 24


def check_length(model, t: int) -> None:
    """ArgumentError for a text longer than `MAX_TOKENS` tokens."""
    if t > MAX_TOKENS:
        raise ArgumentError("method", "{name} 'flow' does not apply to a text of {t} tokens: it "
                            "solves one max-flow problem per layer and key, which takes seconds "
                            "only up to {limit} tokens; {method} rollout is its fast relative",
                            t=t, limit=MAX_TOKENS)


def flows(mats: list[torch.Tensor], rows: torch.Tensor) -> torch.Tensor:
    """(L, r, t): F^ℓ for the rows `rows`, from the layers' capacity matrices (t, t)."""
    import networkx as nx  # torch depends on it; imported here, as only flow needs it

    t = mats[0].shape[0]
    out = torch.zeros(len(mats), len(rows), t, dtype=torch.float64)
    graph = nx.DiGraph()
    for layer, cap in enumerate(mats, 1):
        cap = cap.double().tolist()
        for i in range(t):
            for j in range(t):
                if cap[i][j] > 0:
                    graph.add_edge((layer - 1, j), (layer, i), capacity=cap[i][j])
        for r, i in enumerate(rows.tolist()):
            for j in range(t):
                if graph.has_node((0, j)) and graph.has_node((layer, i)):
                    out[layer - 1, r, j] = nx.maximum_flow_value(graph, (0, j), (layer, i))
    return out


def compute(model, ids: torch.Tensor, rows: torch.Tensor, target_text: str | None = None) -> Scores:
    """(L, r, t): row `rows` of F^1 … F^L."""
    check_length(model, ids.shape[1])
    rows = torch.as_tensor(rows)
    mats = rollout_matrices(run(model, ids, slice(None)))
    return Scores(method="flow", per="layer", rows=rows, scores=flows(mats, rows))


METHOD = Method(name="flow", per="layer", formula=FORMULA, compute=compute,
                cost=f"L · t max-flow problems (networkx); texts of at most {MAX_TOKENS} tokens")
