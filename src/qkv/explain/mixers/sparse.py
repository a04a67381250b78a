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

Two ways in: `read(module, hidden_states, position_embeddings)` runs one eager layer (the
mixer tests); `indexed(model, text, layer=, head=, token=)` reads one query off a loaded model's
own forward (qkv's attention) as an `IndexedSelection` — the `indexed` row of
`qkv.explain.kinds.KINDS`, which `qkv explain --layer L --head H`, `qkv show indexed` and the
viewer's "Indexer" panel show.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import ClassVar

import torch

from qkv.errors import QkvError
from qkv.explain.head_result import HeadResult
from qkv.explain.forward import check_layer_head, check_model, check_text, device_of, encode, model_name, trace
from qkv.explain.mixers.capture import causal_call, causal_mask, kernel_calls
from qkv.explain.mixers.delta_rule import check_query
from qkv.explain.select import choose_in
from qkv.explain.wording import ArgumentError
from qkv.models.protocol import MixerKind

KERNEL = "eager_attention_forward"  # the layer must run with attn_implementation="eager"


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
        return sparse_row(query, self.scores[query, : query + 1], self.selected[query, : query + 1],
                          self.weights[:, query, : query + 1])


def sparse_row(query: int, scores: torch.Tensor, selected: torch.Tensor, weights: torch.Tensor) -> SparseRow:
    """One query's `SparseRow` from its visible keys' `scores` (query+1,), the `selected` mask
    (query+1,) and the heads' `weights` (h, query+1): the selection ordered by decreasing score,
    the cut its lowest score (None when every visible key was kept)."""
    chosen = selected.nonzero().flatten()
    chosen = chosen[scores[chosen].argsort(descending=True)].tolist()
    cutoff = None if len(chosen) == query + 1 else float(scores[chosen].min())
    return SparseRow(query=query, scores=scores, selected=chosen, cutoff=cutoff, weights=weights)


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
    call inside the `with`; the generation cache the model hands it is left out (a re-run must
    not append its keys again)."""
    names = ("hidden_states", "q_resid", "position_embeddings", "attention_mask", "position_ids")
    seen: list[tuple] = []
    hook = indexer.register_forward_hook(
        lambda _m, args, kwargs, out: seen.append(({**dict(zip(names, args)), **kwargs, "cache": None}, out)), with_kwargs=True)
    try:
        yield seen
    finally:
        hook.remove()


def _index_terms(indexer: torch.nn.Module, given: dict) -> torch.Tensor:
    """(g, t, t) the indexer's per-head terms in float64; q, k rotated by its own RoPE call."""
    from qkv.hf.kernels import ROPE_FUNCTIONS, rope_functions  # imported here: qkv.hf registers with transformers

    x, q_resid = given["hidden_states"], given["q_resid"]
    _, t, _ = x.shape
    g, D, dr = indexer.n_heads, indexer.head_dim, indexer.qk_rope_head_dim
    for name in rope_functions(indexer):
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


# -- one query of a loaded model's indexed layer: what `qkv explain` and the viewer show -------
@dataclass(frozen=True)
class IndexedSelection(HeadResult):
    """What the indexer of layer `layer` did for the query `token` of `text`, and the weights
    head `head` then put on the keys it let through — read from the model's own forward.

    Attributes:
        units: the tokens (the index works on tokens, never words).
        token: the query's position; its visible keys are 0 … token.
        topk: how many keys the indexer keeps per query (the config's `index_topk`).
        row: the indexer's scores of the visible keys, the selection (by decreasing score), the
            cut and every head's weights (`SparseRow`).
        head: the head whose weights `weights` are.
        weights: (token+1,) the weights head `head` computed in the forward over the visible
            keys: 0 on every key left out.
    """

    kind: ClassVar[str] = "indexed"  # its row in qkv.explain.kinds.KINDS

    token: int
    topk: int
    row: SparseRow

    @property
    def weights(self) -> torch.Tensor:
        return self.row.weights[self.head]

    def missed(self) -> list[float | None]:
        """For each visible key: None when selected, else by how much its index score fell
        below the cut (`SparseRow.missed_by`)."""
        chosen = set(self.row.selected)
        return [None if j in chosen else self.row.missed_by(j) for j in range(self.token + 1)]

    def to_dict(self) -> dict:
        return {"kind": self.kind, "model": self.model, "text": self.text, "units": self.units.labels,
                "layer": self.layer, "head": self.head, "token": self.token, "topk": self.topk,
                "scores": self.row.scores.tolist(), "selected": self.row.selected,
                "cutoff": self.row.cutoff, "missed": self.missed(), "weights": self.weights.tolist()}


def indexed_part(model, layer: int):
    """The indexed (sparse) mixer of layer `layer` (`model.parts`), or None: the layer selects
    no keys."""
    parts = model.parts.layers[layer]
    return next((m for m in parts.mixers if m.kind is MixerKind.SPARSE), None)


def indexed_layers(model) -> list[int]:
    """The layers of `model` with an indexer (`indexed_part`)."""
    return [i for i in range(len(model.parts.layers)) if indexed_part(model, i) is not None]


def indexed(model, text: str, *, layer: int, head: int = 0, token: str | int | None = None) -> IndexedSelection:
    """The indexer's scores, selection and cut for the query `token` at layer `layer`, and head
    `head`'s weights over the selected keys, from one forward of `model` on `text`.

    The selection is the indexer's own output in that forward (its top-k indices, the keys
    qkv's attention then let through) and the weights the forward's traced row; the scores are
    recomputed in float64 from the indexer's inputs in that forward (`_index_terms`).

    Raises:
        ArgumentError: layer, head or token out of range; a layer without an indexer.
    """
    check_text(text)
    check_model(model)
    check_layer_head(model, layer, head)
    part = indexed_part(model, layer)
    if part is None:
        kinds = "/".join(m.kind.value for m in model.parts.layers[layer].mixers) or "nothing"
        raise ArgumentError("layer", "{name} {value} of {model} has no indexer (it mixes by {kinds}); "
                            "indexed (sparse) attention selects keys in DeepSeek V3.2 / GLM-DSA layers",
                            value=layer, model=model_name(model), kinds=kinds)
    encoding = encode(model, text)
    units, choice = choose_in(token, encoding, text, words=False, role="token")
    with _indexer_call(part.module.indexer) as seen:
        traced = trace(model, text, torch.tensor([choice.unit], device=device_of(model)), encoding=encoding)
    (given, indices), = seen  # indices (1, t, topk): the indexer's own selection
    i, t = choice.unit, len(encoding.ids)
    selected = torch.zeros(t, dtype=torch.bool)
    selected[indices[0, i].long().clamp(0, t - 1)] = True
    selected = selected[: i + 1]  # a query shorter than top-k is handed keys past itself, masked
    weights = traced.weights(layer)[:, 0, : i + 1].double()  # (h, i+1) the forward's own row
    if (weights[:, ~selected] != 0).any():
        raise QkvError(f"layer {layer} of {model_name(model)}: the forward's weights at token {i} fall "
                       f"on keys its indexer left out; the selection read is not the one attended")
    scores = _index_terms(part.module.indexer, given).sum(0)[i, : i + 1]  # (i+1,)
    return IndexedSelection(model=model_name(model), text=text, units=units, layer=layer, head=head,
                            token=i, topk=indices.shape[-1], row=sparse_row(i, scores, selected, weights))
