"""DeepSeek sparse attention (deepseek_v32, glm_moe_dsa): which keys the indexer let through, and why.

Before its MLA attention, the layer's indexer scores every visible key for each query,

    index[i, j] = Σ_g w_ig · relu(scale · q_ig · k_j)         (g: the indexer's own heads)

keeps the top k keys of each row and masks the rest, so the attention's softmax runs over the
selected keys only. This record keeps the index scores (and their per-indexer-head terms), the
keys the layer selected (its indexer's own output), the layer's attention weights over them, and
for a key left out, by how much its index score missed the cut (the lowest selected score).

The selection and the weights are the layer's (the indexer's returned indices and the eager
attention call); the index scores are recomputed in float64 through the indexer's submodules,
with q and k rotated by the indexer's own RoPE call — the indexer computes them in float32 and
returns only the indices. Letters: t tokens, g indexer heads, h attention heads.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from qkv.errors import QkvError
from qkv.explain.mixers.capture import causal_call, causal_mask, kernel_calls
from qkv.explain.mixers.delta_rule import check_query

KERNEL = "eager_attention_forward"  # the layer must run with attn_implementation="eager"
# The RoPE functions transformers' indexers call (half-split for deepseek_v32, interleaved for glm_moe_dsa).
ROPE_FUNCTIONS = ("apply_rotary_pos_emb", "apply_rotary_pos_emb_interleave")


@dataclass(frozen=True)
class SparseRow:
    """One query's selection: the keys 0 … query, their index scores, the cut and the weights."""

    query: int
    scores: torch.Tensor      # (query+1,) the indexer's score of each visible key
    selected: list[int]       # the keys the layer attended, by decreasing index score
    cutoff: float | None      # the lowest selected score; None when every visible key was selected
    weights: torch.Tensor     # (h, query+1) the attention weights (0 on the keys left out)

    def missed_by(self, key: int) -> float:
        """How far `key`'s index score fell below the cut (0.0 for a selected key, and for a key
        left out at a tie with the cut: relu makes exact ties at 0 common, and transformers' top-k
        then chooses among them by position, not score)."""
        if key in self.selected or self.cutoff is None:
            return 0.0
        if not 0 <= key <= self.query:
            raise QkvError(f"key {key} is not visible from query {self.query} (causal: 0 ≤ key ≤ query)")
        return self.cutoff - float(self.scores[key])

    def to_dict(self) -> dict:
        return {"kind": "sparse_row", "query": self.query, "scores": self.scores.tolist(),
                "selected": self.selected, "cutoff": self.cutoff, "weights": self.weights.tolist()}


@dataclass(frozen=True)
class SparseIndexed:
    """One text through a sparse (indexed) attention layer, in float64."""

    kind = "sparse"
    terms: torch.Tensor       # (g, t, t) w_ig · relu(scale · q_ig · k_j), zero above the diagonal
    selected: torch.Tensor    # (t, t) bool: the layer's selection, visible keys only
    weights: torch.Tensor     # (h, t, t) the layer's attention weights
    topk: int

    @property
    def scores(self) -> torch.Tensor:
        """(t, t) the index scores Σ_g terms, −inf above the diagonal."""
        t = self.selected.shape[0]
        above = torch.ones(t, t, dtype=torch.bool).triu(1)
        return self.terms.sum(0).masked_fill(above, float("-inf"))

    def row(self, query: int) -> SparseRow:
        """What the indexer did for `query`."""
        check_query(query, self.selected.shape[0])
        scores = self.scores[query, : query + 1]
        chosen = self.selected[query, : query + 1].nonzero().flatten()
        chosen = chosen[scores[chosen].argsort(descending=True)].tolist()
        cutoff = None if len(chosen) == query + 1 else float(scores[chosen].min())
        return SparseRow(query=query, scores=scores, selected=chosen, cutoff=cutoff,
                         weights=self.weights[:, query, : query + 1])


def read(module: torch.nn.Module, hidden_states: torch.Tensor, position_embeddings) -> SparseIndexed:
    """Run a sparse-attention layer (`DeepseekV32Attention`, `GlmMoeDsaAttention`) on one text.

    Args:
        module: the layer's `self_attn` (with its `indexer`), `_attn_implementation` "eager".
        hidden_states: (1, t, hidden) its input, after the layer's norm.
        position_embeddings: (cos, sin) of positions 0 … t−1, as the model hands its layers.
    """
    t = hidden_states.shape[1]
    with _indexer_call(module.indexer) as seen:
        call = causal_call(module, KERNEL, hidden_states, position_embeddings)
    (given, indices), = seen
    selected = torch.zeros(t, t, dtype=torch.bool)
    selected[torch.arange(t)[:, None], indices[0].long()] = True
    selected &= torch.ones(t, t, dtype=torch.bool).tril()
    return SparseIndexed(terms=_index_terms(module.indexer, given), selected=selected,
                         weights=call.result[1][0].double(), topk=indices.shape[-1])


def index_terms(module: torch.nn.Module, hidden_states: torch.Tensor, position_embeddings) -> torch.Tensor:
    """(g, t, t) `SparseIndexed.terms` of a sparse-attention layer run once on one text, under
    any attention implementation (qkv's included): the index scores alone, not the weights."""
    with _indexer_call(module.indexer) as seen, torch.no_grad():
        module(hidden_states, position_embeddings=position_embeddings, attention_mask=causal_mask(hidden_states))
    (given, _), = seen
    return _index_terms(module.indexer, given)


@contextmanager
def _indexer_call(indexer: torch.nn.Module):
    """A list of (the indexer's arguments by name, its returned top-k indices (1, t, k)), one per
    call inside the `with`."""
    names = ("hidden_states", "q_resid", "position_embeddings", "attention_mask", "position_ids")
    seen: list[tuple] = []
    hook = indexer.register_forward_hook(
        lambda _m, args, kwargs, out: seen.append(({**dict(zip(names, args)), **kwargs}, out)), with_kwargs=True)
    try:
        yield seen
    finally:
        hook.remove()


def _index_terms(indexer: torch.nn.Module, given: dict) -> torch.Tensor:
    """(g, t, t) the indexer's per-head terms in float64; q, k rotated by its own RoPE call."""
    x, q_resid = given["hidden_states"], given["q_resid"]
    _, t, _ = x.shape
    g, D, dr = indexer.n_heads, indexer.head_dim, indexer.qk_rope_head_dim
    modeling = sys.modules[type(indexer).__module__]
    # which RoPE function the indexer's modeling file (transformers') defines, not a model part
    for name in (n for n in ROPE_FUNCTIONS if hasattr(modeling, n)):
        calls = kernel_calls(indexer, name, x, **{k: v for k, v in given.items() if k != "hidden_states"})
        if calls:
            q_rot, k_rot = (r.double() for r in calls[0].result)  # (1, t, g, dr), (1, t, 1, dr)
            break
    else:
        raise QkvError(f"{type(indexer).__name__} calls none of {', '.join(ROPE_FUNCTIONS)}")
    with torch.no_grad():
        q_pass = indexer.wq_b(q_resid).view(t, g, D)[..., dr:].double()  # (t, g, D − dr)
        k_pass = indexer.k_norm(indexer.wk(x)).view(t, D)[..., dr:].double()  # (t, D − dr)
        w = indexer.weights_proj(x)[0].double() * g ** -0.5  # (t, g)
    q = torch.cat([q_rot[0], q_pass], dim=-1)  # (t, g, D)
    k = torch.cat([k_rot[0, :, 0], k_pass], dim=-1)  # (t, D)
    relu = torch.relu(torch.einsum("igd,jd->gij", q, k) * indexer.softmax_scale)  # (g, t, t)
    return (w.T[:, :, None] * relu).tril()
