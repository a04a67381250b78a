"""Why does the query of "it" line up with the key of "pizza"? One attention score, split.

Head h of layer ℓ scores key j for query i as s_ij = (q_i · k_j) / √d. Every step from the
layer's input to q and k is linear once each norm is frozen at the scale the forward computed
(`norms`), and RoPE is a rotation (linear at each position), so with the layer's input
split by component (`residual`: x_i = Σ_a x_{i,a}, `bias` last):

```text
q_i = Σ_a q_a,   q_a = rot_i( n_q( norm1(x_{i,a}) · W_Q^h ) )       (+ b_Q, β in bias)
k_j = Σ_b k_b,   k_b = rot_j( n_k( norm1(x_{j,b}) · W_K^h ) )
s_ij = Σ_a Σ_b terms[a, b],     terms[a, b] = (q_a · k_b) / √d
```

(n_q, n_k: the per-head query/key norms where the model has them, frozen the same way.) A
soft-capped model (Gemma 2) applies c·tanh(s/c) after: `terms` sum to the score *before* the
cap (`capped` is the score after). A score bias (ALiBi) is no component: `score_bias`.

An MLA head (DeepSeek V2/V3, Kimi; the attention of the sparse layers of V3.2 and GLM-DSA)
makes q and k through latents (`latent.py`): the same split, each side through W_QA, its
RMSNorm frozen, W_QB (and W_KVA, its norm, W_KB), with RoPE as the layer's own rotation matrix
per position; its terms come as the content part (q_nope · k_nope) plus the position part
(RoPE) too (`latent`). A sparse layer's indexer only chooses the keys: a chosen key's score
splits as above, a key it left out has weight 0 and is refused in one line with its miss margin.
A gated head (Qwen3-Next, 3.5) is gated after its weights: its score splits as any head's.

`score_attribution` does this for one (query, key) pair; with `key=None` for the whole
row: every key's split over the key-side components (query side summed), O(N · C) memory.

Examples:
    >>> import qkv
    >>> from qkv.explain import score_attribution
    >>> minilm = qkv.load("minilm")
    >>> a = score_attribution(minilm, "The dog found some pizza next to the baby and ate it",
    ...                       layer=3, head=1, token="it", key="pizza")
    >>> a.terms.shape, abs(float(a.terms.sum()) - a.score) <= a.bound
    (torch.Size([43, 43]), True)
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import dataclass
from typing import ClassVar

import torch

from qkv.attention.softcap import soft_cap
from qkv.errors import QkvError
from qkv.explain.circuits import embed, latent
from qkv.explain.circuits.parts import parts_of
from qkv.explain.circuits.norms import linearise, rebuilds
from qkv.explain.circuits.residual import Stream, check, check_query_layer, linear64, names, stream
from qkv.explain.contributions.base import Forward, run
from qkv.explain.finite import check_layers as check_finite
from qkv.explain.forward import check_layer_head, device_of, encode, model_name, stops_at_layer
from qkv.explain.jsonable import numbers
from qkv.explain.mixers import gate, mla, sparse
from qkv.explain.select import choose_in, units_for
from qkv.explain.steps import OneHead, head_slice
from qkv.explain.wording import ArgumentError
from qkv.models.protocol import MixerKind
from qkv.modules.multihead import norm_width
from qkv.modules.stack import LayerRows
from qkv.modules.writes import Writes

# Key positions per chunk of a whole row: C components × chunk × E float64 numbers near 2**22
# (32 MB), whatever the document's length.
CHUNK_NUMBERS = 1 << 22


@dataclass(frozen=True)
class LatentSplit:
    """An MLA head's score as its two parts, each split like `ScoreAttribution.terms`
    (`content + position` = `terms`).

    Attributes:
        content: (C, C) float64, scale · q_nope,a · k_nope,b: what the tokens' latents say.
        position: (C, C) float64, scale · R_i q_rope,a · R_j k_rope,b: the RoPE part (a layer
            without RoPE, Kimi's: R = 1, the part of the key all heads share).
    """

    content: torch.Tensor
    position: torch.Tensor

    def to_dict(self) -> dict:
        return {"content": float(self.content.sum()), "position": float(self.position.sum()),
                "content_terms": numbers(self.content), "position_terms": numbers(self.position)}


@dataclass(frozen=True)
class ScoreAttribution(OneHead):
    """One head's score of one key, as a (query components × key components) matrix.

    Attributes:
        tokens: the text's tokens; token_index i, key_index j: the query and the key.
        query_components: the C names of the rows and columns of `terms`
            (`embed.token`, `embed.position`, `embed.type` where the model adds them,
            `L{l}.H{h}`, `L{l}.ffn`, `bias`: `residual.names`).
        key_components: the same names, for the key's side.
        terms: (C, C) float64, terms[a, b] = (q_a · k_b)/√d; `terms.sum()` = `score`.
        score: the head's scaled score s_ij from the forward (before any soft-cap).
        capped: c·tanh(score/c) with the model's soft-cap c, else None (terms are before it).
        score_bias: what the forward added to the score besides q·k (ALiBi), 0 otherwise.
        bound: how far `terms.sum()` may be from `score`: the rounding of the forward's
            q and k (measured: `q_error`, `k_error`, each checked to be rounding) carried
            through the dot product, plus the dot product's own rounding in the model's dtype.
        latent: an MLA head's content and RoPE parts (`LatentSplit`), else None.
        gated: the head's output is gated after its weights (Qwen3-Next, Qwen3.5): the gate
            does not touch the score, so the terms are the score's all the same.
        indexed: the layer's indexer chose the keys (sparse attention): this key was one of them.
    """

    kind: ClassVar[str] = "score-attribution"  # its row in qkv.explain.kinds.KINDS

    key_index: int
    query_components: tuple[str, ...]
    key_components: tuple[str, ...]
    terms: torch.Tensor
    score: float
    bound: float
    q_error: float
    k_error: float
    capped: float | None = None
    score_bias: float = 0.0
    latent: LatentSplit | None = None
    gated: bool = False
    indexed: bool = False

    def top(self, n: int = 10) -> list[tuple[str, str, float]]:
        """The n largest terms by size: (query component, key component, term)."""
        flat = self.terms.flatten()
        order = flat.abs().argsort(descending=True)[:n]
        C = self.terms.shape[1]
        return [(self.query_components[int(i) // C], self.key_components[int(i) % C],
                 float(flat[i])) for i in order]

    def key_totals(self) -> torch.Tensor:
        """(C,) each key-side component's part of the score (query side summed)."""
        return self.terms.sum(0)

    def query_totals(self) -> torch.Tensor:
        """(C,) each query-side component's part of the score (key side summed)."""
        return self.terms.sum(1)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "model": self.model, "text": self.text, "tokens": self.tokens,
                "layer": self.layer, "head": self.head, "token_index": self.token_index,
                "token": self.tokens[self.token_index], "key_index": self.key_index,
                "key": self.tokens[self.key_index],
                "query_components": list(self.query_components),
                "key_components": list(self.key_components), "terms": numbers(self.terms),
                "terms_sum": float(self.terms.sum()), "score": self.score, "bound": self.bound,
                "q_error": self.q_error, "k_error": self.k_error, "capped": self.capped,
                "score_bias": self.score_bias,
                "latent": None if self.latent is None else self.latent.to_dict(),
                "gated": self.gated, "indexed": self.indexed,
                "top": [{"query": a, "key": b, "term": t} for a, b, t in self.top()]}


@dataclass(frozen=True)
class ScoreRow(OneHead):
    """One head's scores of every key for one query, each split over the key-side components.

    Attributes:
        keys: (s,) the key positions the head scored (masked ones left out).
        key_components: the C names.
        terms: (s, C) float64, terms[j, b] = (q · k_{j,b})/√d
            with q whole; `terms.sum(1)` = `scores`.
        scores: (s,) the forward's scaled scores.
        bound: as `ScoreAttribution`'s, the
            largest over the row.
    """

    kind: ClassVar[str] = "score-row"  # its row in qkv.explain.kinds.KINDS

    keys: torch.Tensor
    key_components: tuple[str, ...]
    terms: torch.Tensor
    scores: torch.Tensor
    bound: float

    def shares(self) -> torch.Tensor:
        """(s, C) each component's share of its key's score: terms / score (rows sum to 1)."""
        return self.terms / self.scores[:, None]

    def to_dict(self) -> dict:
        return {"kind": self.kind, "model": self.model, "text": self.text, "tokens": self.tokens,
                "layer": self.layer, "head": self.head, "token_index": self.token_index,
                "keys": self.keys.tolist(), "key_components": list(self.key_components),
                "terms": numbers(self.terms), "scores": numbers(self.scores), "bound": self.bound}


# -- one side: the layer's input, split, → q or k -------------------------------------------------
def check_model(model, layer: int) -> None:
    """QkvError where the head's W_Q, W_K cannot be read as matrices."""
    attn = model.layers[layer].self_attn
    if attn.projection_note:
        raise QkvError(f"{model_name(model)}: layer {layer}'s projections are not linear maps qkv "
                       f"reads ({attn.projection_note}); its scores cannot be split")


def side(model, fwd, st: Stream, layer: int, head: int, which: str,
         read: torch.Tensor | None = None) -> torch.Tensor:
    """(C, n, d) float64: each component of the layer's input at `st.positions` as its part
    of head `head`'s query (`which="q"`) or key (`"k"`) there; `read`: `attention_input`'s
    parts when the caller has them (one norm frozen for both sides)."""
    parts = attention_input(model, fwd, st, layer) if read is None else read  # (C, n, E)
    out = _rotated(fwd, layer, _projected(model, fwd, parts, layer, head, which), st.positions)
    return _normed_after(model, fwd, out, layer, which)  # (C, n, d)


def _projected(model, fwd, parts: torch.Tensor, layer: int, head: int, which: str) -> torch.Tensor:
    """(C, n, d) float64: `parts` (C, n, E) through head `head`'s W_Q (`which="q"`) or W_K,
    its bias (on `bias`, the last component) and, where it acts before the rotation, its q/k
    norm frozen (one acting after it: `_normed_after`) — before any rotation."""
    attn = model.layers[layer].self_attn
    dtype = fwd.hidden_states[layer].dtype
    q_rows, kv_rows = head_slice(attn, head)
    proj, norm, rows = ((attn.q_proj, attn.q_norm, q_rows) if which == "q"
                        else (attn.k_proj, attn.k_norm, kv_rows))
    if attn.norm_after_rotation:
        norm = None
    whole = norm is not None and norm_width(norm) != attn.head_dim  # OLMo 2: one norm over every head
    take = slice(None) if whole else rows
    w, b = linear64(proj, take)  # (d or h·d, E), (d or h·d,) or None
    C, n, E = parts.shape
    out = (parts.reshape(C * n, E) @ w.T).view(C, n, -1)  # (C, n, ·): one 2-D product
    if b is not None:
        out[-1].add_(b)  # in place, not copied back onto itself
    if norm is not None:  # Qwen3 / OLMo 2: the query's (key's) own norm, frozen the same way
        total = out.sum(0).to(dtype)  # (n, ·)
        lin = linearise(norm, total)
        out = lin.apply(out)
        out[-1].add_(lin.shift)
        if whole:
            out = out[..., rows]  # (C, n, d)
    return out


def _rotated(fwd, layer: int, out: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """(C, n, d): `out` (C, n, d) with each position's RoPE rotation applied to every component
    (one call of the trace's position step for all of them); `out` itself without RoPE."""
    step = fwd.traces[layer].self_attn.position_step
    if step is None:
        return out
    C, n, d = out.shape
    return step(out.reshape(C * n, d), positions.repeat(C)).view(C, n, d)


def _pair(model, fwd, both: Stream, layer: int, head: int, read: torch.Tensor) -> torch.Tensor:
    """(C, 2, d): the query's components (at `both.positions[0]`) and the key's (at
    `both.positions[1]`) of head `head`, each projected at its own position only and the two
    rotated in one call."""
    q = _projected(model, fwd, read[:, :1], layer, head, "q")  # (C, 1, d)
    k = _projected(model, fwd, read[:, 1:], layer, head, "k")  # (C, 1, d)
    out = _rotated(fwd, layer, torch.cat([q, k], 1), both.positions)  # (C, 2, d)
    if not model.layers[layer].self_attn.norm_after_rotation:
        return out
    return torch.cat([_normed_after(model, fwd, out[:, :1], layer, "q"),
                      _normed_after(model, fwd, out[:, 1:], layer, "k")], 1)  # (C, 2, d)


def _normed_after(model, fwd, out: torch.Tensor, layer: int, which: str) -> torch.Tensor:
    """(C, n, d): the rotated components `out` (C, n, d) through the query's (`which="q"`) or
    key's per-head norm frozen at their sum, where the layer normalises after the rotation
    (HunYuan); `out` itself otherwise."""
    attn = model.layers[layer].self_attn
    norm = attn.q_norm if which == "q" else attn.k_norm
    if not attn.norm_after_rotation or norm is None:
        return out
    if norm_width(norm) != attn.head_dim:
        raise QkvError(f"layer {layer} normalises q and k over every head after the rotation; "
                       f"its scores cannot be split")
    lin = linearise(norm, out.sum(0).to(fwd.hidden_states[layer].dtype))
    out = lin.apply(out)
    out[-1].add_(lin.shift)
    return out


def attention_input(model, fwd, st: Stream, layer: int) -> torch.Tensor:
    """(C, n, E) float64: the components of what the layer's attention reads at `st.positions`:
    the stream's parts, through norm1 frozen at this forward's scale for a pre-norm layer (a
    layer whose attention reads x itself has no norm1: OLMo 2's, OLMo hybrid's); (C, n, 2E) where
    it reads n₁([x; e]), e what entered layer 0 (Zamba2): each component is [its part of x; its
    part of e] (only the embedding's tables and `bias` have one), the norm frozen over both."""
    lay = model.layers[layer]
    if parts_of(model).layers[layer].reads_embeddings:
        return _with_embeddings(model, fwd, st, layer)
    if not lay.norm_first or lay.norm1 is None:
        return st.parts
    x = fwd.hidden_states[layer][0, st.positions]  # (n, E)
    seen = _read(fwd, layer, st.positions)
    try:  # frozen against what the attention read: norm1's output as the forward computed it
        lin = linearise(lay.norm1, x, seen)
    except QkvError:
        if seen is None:
            raise
        lin = linearise(lay.norm1, x)  # the attention read something else: norm1's own output
    parts = lin.apply(st.parts)
    parts[-1].add_(lin.shift)  # the bias row, in place
    return parts


def _with_embeddings(model, fwd, st: Stream, layer: int) -> torch.Tensor:
    """(C, n, 2E) n₁([x; e])'s components: [x's part; e's part] per component, n₁ frozen at
    the [x; e] the forward normalised."""
    first = fwd.hidden_states[0][0, st.positions]  # (n, E): e, what entered layer 0
    _, emb, emb_bias = embed.split(model, fwd.ids[0], first, st.positions)  # (P, n, E), (n, E)
    e = torch.zeros_like(st.parts)  # (C, n, E): the embedding's components first, bias last
    e[: len(emb)], e[-1] = emb, emb_bias
    parts = torch.cat([st.parts, e], -1)  # (C, n, 2E)
    x = torch.cat([fwd.hidden_states[layer][0, st.positions], first], -1)  # (n, 2E)
    lin = linearise(model.layers[layer].norm1, x)
    parts = lin.apply(parts)
    parts[-1].add_(lin.shift)
    return parts


def _read(fwd, layer: int, positions: torch.Tensor) -> torch.Tensor | None:
    """(n, E) what layer `layer`'s attention read at `positions` (its trace's key input, kept
    for every position), None where the trace does not hold it whole."""
    read = fwd.traces[layer].self_attn.key_input  # (1, t, E), or empty: a MultiHeadTrace's field
    hidden = fwd.hidden_states[layer]  # (1, t, E)
    if tuple(read.shape) != tuple(hidden.shape):
        return None
    return read[0, positions]


def _forward(model, ids: torch.Tensor, rows: torch.Tensor, layer: int,
             positions: torch.Tensor | None) -> Forward:
    """The forward through layer `layer` only, `rows` traced in it; every layer before it runs
    untraced and records its heads' outputs and residual at `positions` (None: every position)
    — the components, nothing else (`Writes`). Nothing after the layer's attention is computed:
    not its feed-forward (`attention_only`), nor any later layer or the model's head. A model
    that cannot stop there (`stops_at_layer` gives the reason) runs whole, traced."""
    if not stops_at_layer(model, layer):
        return run(model, ids, rows)
    keep = Writes(torch.arange(ids.shape[1], device=ids.device) if positions is None else positions)
    out = model(ids, torch.ones_like(ids), trace_rows=LayerRows(layer, rows, earlier=keep, attention_only=True),
                output_hidden_states=True)
    att = out.traces[layer].self_attn.attention
    # a NaN made earlier is in the layer's input (every row); one made by its projections, in
    # the row's weights (q, k) or output (v): only then is the whole trace run, to name where
    # NaN and ±inf survive a sum: three sums and one sync (a finite sum that overflowed only
    # costs the whole trace's run, which then finds nothing)
    x, weights, output = (t.sum(dtype=torch.float32)
                          for t in (out.hidden_states[layer], att.weights, att.output))
    if not math.isfinite(float(x + weights + output)):
        run(model, ids, rows)  # raises NonFiniteError at the first one
        check_finite([None] * layer + [out.traces[layer]], model=model_name(model))
    return Forward(ids=ids, output=out, hidden_states=tuple(out.hidden_states), traces=list(out.traces))


def _picks(text: str, encoding, token, key) -> tuple[int, int | None]:
    """The positions `token` and `key` name (None: `key` None), the text's tokens' units built
    once for both picks."""
    units = units_for(encoding, text, words=False)

    def pick(spec, role: str) -> int:
        _, choice = choose_in(spec, encoding, text, words=False, role=role, units=units)
        return units.groups[choice.unit][-1]

    return pick(token, "token"), None if key is None else pick(key, "key")


def _bound(q: torch.Tensor, k: torch.Tensor, dq: torch.Tensor, dk: torch.Tensor, scale: float,
           dtype: torch.dtype) -> torch.Tensor:
    """`_bound_of` for q, k, dq, dk (..., d): (...,)."""
    aq, ak, adq, adk = q.abs(), k.abs(), dq.abs(), dk.abs()
    return _bound_of((adq * ak).sum(-1), (aq * adk).sum(-1), (adq * adk).sum(-1), (aq * ak).sum(-1),
                     q.shape[-1], scale, dtype)


def _pair_bound(sums: torch.Tensor, dqk: torch.Tensor, scale: float, dtype: torch.dtype) -> float:
    """`_bound_of` for one (query, key): sums (2, d) = [q, k], dqk (2, d) = [dq, dk]; the four
    dot products of |q|, |k|, |dq|, |dk| as one (4, 4) product."""
    x = torch.cat([sums, dqk]).abs()  # (4, d): |q|, |k|, |dq|, |dk|
    p = (x @ x.T).tolist()  # p[a][b] = Σ |x_a| |x_b|
    return _bound_of(p[2][1], p[0][3], p[2][3], p[0][1], sums.shape[-1], scale, dtype)


def _bound_of(dq_k, q_dk, dq_dk, q_k, d: int, scale: float, dtype: torch.dtype):
    """|Σ terms − score| ≤ scale · (|dq|·|k| + |q|·|dk| + |dq|·|dk| + γ_d |q|·|k|): the forward's
    q and k differ from the sums of the parts by dq, dk (its rounding, measured), and its dot
    product of d terms rounds by at most γ_d = d·u/(1 − d·u) of Σ|q||k| (Higham, Thm 3.1); plus
    64 float64 ulps of |q|·|k| for the terms' own sum. The four products as numbers or
    tensors of one shape."""
    u = torch.finfo(dtype).eps / 2
    gamma = d * u / (1 - d * u)
    return scale * (dq_k + q_dk + dq_dk + gamma * q_k) + 64 * torch.finfo(torch.float64).eps * \
        scale * q_k


def _checked(model, got: torch.Tensor, want: torch.Tensor, what: str) -> torch.Tensor:
    """want − got (the forward's rounding), after checking it is rounding."""
    if not rebuilds(got, want):
        raise QkvError(f"{model_name(model)}: the components' {what} is not the forward's (max "
                       f"diff {float((got - want.double()).abs().max()):.3g})")
    return want.double() - got


@torch.no_grad()
def score_attribution(model, text: str, *, layer: int, head: int, token=None, key=None):
    """Head `head` of layer `layer`: the score of `key` for the query `token`, split
    into (query component × key component) terms — a `ScoreAttribution`; with
    `key=None` every key's score split over the key-side components — a `ScoreRow`
    (see the module doc).

    Args:
        model: a model from [`qkv.load`][qkv.load] whose heads' weights are read
            (`capabilities.head_weights`) and whose residual stream splits (pre- or
            post-norm layers that form x + attn; a parallel residual, a norm on the attention's
            branch or a scaled branch is refused by name). MLA layers (and the sparse layers'
            MLA attention) split through their latents (`latent.py`): `latent` holds the
            content and RoPE parts.
        token, key: an index, a word or `"word@N"` (as [`qkv.explain.explain`][qkv.explain.explain]
            takes them); `token=None`: the last word.

    Raises:
        ArgumentError: a token or key not in the text, a layer/head out of range, a key the
            head never scores (masked: after the token in a causal model; a sparse layer's key
            its indexer left out, with the margin it missed the cut by).
        QkvError: a model whose parts are not linear maps qkv reads (named).
    """
    for role, value in (("layer", layer), ("head", head)):
        if value is None:  # check_layer_head reads None as "every one": this splits one head's score
            raise ArgumentError(role, "{name} is required: score_attribution splits the score of "
                                "one head (give {layer} and {head} as ints), got None")
    check_layer_head(model, layer, head)
    kind = check_query_layer(model, layer)  # differential: named by kind
    check(model, layer)  # the stream first: a parallel residual is named before its projections
    latent_kind = kind in (MixerKind.MLA, MixerKind.SPARSE)
    if not latent_kind:
        check_model(model, layer)
    encoding = encode(model, text)
    i, j = _picks(text, encoding, token, key)
    ids = torch.tensor([encoding.ids], dtype=torch.long, device=device_of(model))  # (1, t)
    module = model.layers[layer].self_attn.module if latent_kind else None
    asked = torch.tensor([i] if j is None else [i, j], device=ids.device)  # (1,) or (2,): query, key
    pair, query_row = None if j is None else asked, asked[:1]
    with latent.handed(module) if latent_kind else nullcontext({}) as given:
        fwd = _forward(model, ids, query_row, layer, pair)
    sides = _sides(model, fwd, layer, head, module, given.get("position_embeddings"))
    att = fwd.traces[layer].self_attn.attention
    dtype, scale = att.query.dtype, float(att.scale)
    mask = att.additive()[0, head, 0]  # (s,): 0, a score bias, or −inf where masked
    tokens = list(encoding.tokens)
    gated = _gated(model, layer)
    if key is None:
        query = stream(model, fwd, layer, query_row)
        q = sides(query, "q")[:, 0]  # (C, d)
        dq = _checked(model, q.sum(0), att.query[0, head, 0], "query")
        keys = torch.nonzero(torch.isfinite(mask)).flatten()  # (s,)
        return _row(model, fwd, text, tokens, layer, head, i, keys, q.sum(0), dq, scale, dtype, sides)
    score_bias = float(mask[j])
    if not math.isfinite(score_bias):
        _refuse_masked(key, i, j, layer, mask, module if kind is MixerKind.SPARSE else None, fwd, given)
    both = stream(model, fwd, layer, pair)  # the query's and the key's input
    qk = _query_and_key(model, fwd, both, layer, head, module, sides)  # (C, 2, d)
    q, k = qk[:, 0], qk[:, 1]  # (C, d) each
    sums = qk.sum(0)  # (2, d): the query and the key the components rebuild, checked as one
    dqk = _checked(model, sums, torch.stack([att.query[0, head, 0], att.key[0, head, j]]),
                   "query and key")  # (2, d): [dq, dk], the forward's rounding
    q_error, k_error = dqk.abs().amax(-1).tolist()
    terms = (q @ k.T) * scale  # (C, C)
    split = None
    if latent_kind:  # content: the first dn features (q_nope · k_nope), position: the rotated rest
        split = _latent_split(mla.latents(module).nope, q, k, scale)
        terms = split.content + split.position
    score = float(att.scores[0, head, 0, j]) * scale
    cap = att.softcap
    return ScoreAttribution(
        model=model_name(model), text=text, tokens=tokens, layer=layer, head=head, token_index=i,
        key_index=j, query_components=both.names, key_components=both.names, terms=terms,
        score=score, bound=_pair_bound(sums, dqk, scale, dtype), q_error=q_error, k_error=k_error,
        capped=None if cap is None else float(soft_cap(torch.tensor(score, device=ids.device), cap)),
        score_bias=score_bias, latent=split, gated=gated, indexed=kind is MixerKind.SPARSE)


def _query_and_key(model, fwd, both: Stream, layer: int, head: int, module, sides) -> torch.Tensor:
    """(C, 2, d): the query's components at `both.positions[0]` and the key's at
    `both.positions[1]`, from the layer's input read once (one norm frozen for both sides)."""
    read = attention_input(model, fwd, both, layer)  # (C, 2, E)
    if module is None:  # both sides projected, each at its own position, and rotated at once
        return _pair(model, fwd, both, layer, head, read)
    return torch.stack([sides(both, "q", read)[:, 0], sides(both, "k", read)[:, 1]], 1)  # MLA: latents


def _refuse_masked(key, i: int, j: int, layer: int, mask: torch.Tensor, indexed, fwd, given: dict):
    """ArgumentError for a key the head gives no weight: one a sparse layer's indexer (`indexed`,
    the layer's module) left out, with the margin it missed the cut by; else masked."""
    if indexed is not None and j <= i:
        raise ArgumentError("key", "{name} {value!r} (position {j}) was left out by layer {layer}'s "
                            "indexer for the query at {i}: its weight is 0 (its index score "
                            "missed the top-{k} cut by {miss:.4g})", value=key, j=j, i=i, layer=layer,
                            k=int(torch.isfinite(mask).sum()), miss=_missed(indexed, fwd, layer, i, j, given))
    raise ArgumentError("key", "{name} {value!r} (position {j}) is masked for the query at "
                        "{i}: the head never scores it", value=key, j=j, i=i)


def _latent_split(dn: int, q: torch.Tensor, k: torch.Tensor, scale: float) -> LatentSplit:
    """q, k (C, dn + dr) by component, [nope | rotated rope] → the content and RoPE terms."""
    return LatentSplit(content=(q[:, :dn] @ k[:, :dn].T) * scale,  # (C, C)
                       position=(q[:, dn:] @ k[:, dn:].T) * scale)


def _sides(model, fwd, layer: int, head: int, module, position_embeddings):
    """`sides(st, which)` → (C, n, d) float64: the components of `st` as head `head`'s query
    (`which="q"`) or key (`"k"`) at `st.positions` — through W_Q, W_K (`side`) or, for an MLA
    `module`, through its latents (`latent.side`: d = dn + dr, [nope | rotated rope])."""
    if module is None:
        return lambda st, which, read=None: side(model, fwd, st, layer, head, which, read)
    x = fwd.traces[layer].self_attn.key_input  # (1, t, E) what the module read
    rotations = dict(zip("qk", mla.rotations(module, x, position_embeddings)))  # (t, dr, dr) each
    lat, dtype = mla.latents(module), fwd.hidden_states[layer].dtype
    def sides(st: Stream, which: str, read: torch.Tensor | None = None) -> torch.Tensor:
        parts = attention_input(model, fwd, st, layer) if read is None else read  # (C, n, E)
        return latent.side(lat, parts, st.positions, head, which, rotations[which], dtype)
    return sides


def _gated(model, layer: int) -> bool:
    """Whether the layer's heads' outputs are gated after their weights (Qwen3-Next, 3.5): no
    output projection reads its attention call's output (the adapter found none), the gate does."""
    attn = model.layers[layer].self_attn
    return attn.out_proj is None and gate.output_gate(attn) is not None


def _missed(module, fwd, layer: int, i: int, j: int, given: dict) -> float:
    """How far key `j`'s index score fell below the lowest selected one for query `i`
    (`sparse.SparseRow.missed_by`), the selection the forward's own (its finite scores)."""
    x = fwd.traces[layer].self_attn.key_input  # (1, t, E)
    terms = sparse.index_terms(module, x, given.get("position_embeddings"))  # (g, t, t)
    t = x.shape[1]
    selected = torch.zeros(t, t, dtype=torch.bool)
    selected[i] = torch.isfinite(fwd.traces[layer].self_attn.attention.additive()[0, 0, 0]).cpu()[:t]
    weights = torch.zeros(1, t, t, dtype=torch.float64)  # only the selection of row i is read
    return sparse.SparseIndexed(terms=terms, selected=selected, weights=weights, topk=0).row(i).missed_by(j)


def _row(model, fwd, text, tokens, layer, head, i, keys, q, dq, scale, dtype, sides) -> ScoreRow:
    """Every key's score split over the key-side components, `keys` in chunks (O(N · C))."""
    att = fwd.traces[layer].self_attn.attention
    E = fwd.hidden_states[layer].shape[-1]
    C = len(names(model, layer))
    step = max(1, CHUNK_NUMBERS // (C * E))
    terms, bounds = [], []
    for start in range(0, len(keys), step):
        chunk = keys[start:start + step]
        st = stream(model, fwd, layer, chunk)
        k = sides(st, "k")  # (C, n, d)
        total = k.sum(0)  # (n, d)
        dk = _checked(model, total, att.key[0, head, chunk], "key")
        terms.append(torch.einsum("cnd,d->nc", k, q) * scale)  # (n, C)
        bounds.append(_bound(q, total, dq, dk, scale, dtype))
    return ScoreRow(model=model_name(model), text=text, tokens=tokens, layer=layer, head=head,
                    token_index=i, keys=keys, key_components=st.names, terms=torch.cat(terms),
                    scores=att.scores[0, head, 0, keys].double() * scale,
                    bound=float(torch.cat(bounds).max()))


__all__ = ["LatentSplit", "ScoreAttribution", "ScoreRow", "attention_input", "score_attribution", "side"]
