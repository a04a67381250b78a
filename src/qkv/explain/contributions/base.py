"""What every contribution method shares: the record a method returns, the traced forward with
the tensors the methods read, each head's value vectors f^h(x_j), and rollout.

Notation (the docs use it too):

    A^{ℓ,h}      (t, s)  head h of layer ℓ's attention weights, as the forward computed them
    x_j          (E,)    token j's vector entering layer ℓ (``hidden_states[ℓ]``)
    h_j          (E,)    what the attention projected: x_j (post-norm) or norm1(x_j) (pre-norm)
    f^h(h_j)     (E,)    (h_j W_V^h + b_V^h) W_O^h: head h's value of token j, already mixed by
                         the output projection (W_O^h: the d columns of ``out_proj`` of head h)

so the attention block's output is exactly `Σ_h Σ_j A^{ℓ,h}_ij f^h(h_j) + b_O` (Kobayashi et
al., 2020, eq. 5): the output projection is linear, and each row of A sums to 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from qkv.explain.mixers.gate import output_gate
from qkv.explain.finite import check_layers as check_finite
from qkv.explain.wording import ArgumentError
from qkv.modules import Interventions

PER = ("head", "layer")


@dataclass(frozen=True)
class Matrices:
    """A rolled-out method's per-layer matrices C^ℓ, before rollout (what `Method.matrices`
    returns; the registry rolls them out once,
    [`Method.run`][qkv.explain.contributions.base.Method.run]).

    Attributes:
        layers: L tensors (t, t); the last may hold only the rows `first …` that the query rows
            need (ALTI computes just those of the last layer): (r', t).
        first: the first row the last matrix holds.
        target: what was differentiated, in words (`grad`), else None.
    """

    layers: list
    first: int = 0
    target: str | None = None


@dataclass(frozen=True)
class Method:
    """One registered contribution method and what it needs (its capabilities).

    Attributes:
        name: what `method=` / `--method` calls it.
        per: `"head"` (scores for every layer × head) or `"layer"` (one row per layer,
            rolled out through that layer).
        formula: one line, shown by the CLI and the docs.
        cost: what it costs beyond one forward, in words (shown in `--help`).
        compute: `(model, ids (1, t), rows (r,), target_text) -> Scores` for a method that
            does not roll out (per-head methods, `flow`); or
        matrices: `(model, ids, rows, target_text) -> Matrices` for one the registry rolls out.
        add_identity: roll out as R^ℓ = R^{ℓ−1} + C^ℓ R^{ℓ−1} and report R^ℓ − I (the residual
            kept apart; Chefer et al., 2021).
        gradients: runs a backward pass (autograd on); else everything runs under no_grad.
        reads_target: takes `target_text` (`grad` on an encoder).
        applies: `(model) -> None`, raising ArgumentError where the method cannot read the
            model's layers (beyond the common cross-attention check), or None.
        raw: the scores are the attention weights themselves (rows already sum to 1, no shares).
        document: `(doc, rows (r,)) -> Scores` from a
            [`Document`][qkv.explain.long.document.Document]'s record (q, k, lse, value norms) at
            O(N) memory, or None: the method re-runs the model.
        hybrid: scores a hybrid's softmax layers and leaves the layers no softmax mixes out
            (`Scores.unscored`); else every layer must be a softmax layer.
    """

    name: str
    per: str
    formula: str
    cost: str
    compute: Callable | None = None
    matrices: Callable | None = None
    add_identity: bool = False
    gradients: bool = False
    reads_target: bool = False
    applies: Callable | None = None
    raw: bool = False
    document: Callable | None = None
    hybrid: bool = False

    @property
    def value(self) -> str:
        """What one number of a ranked row is called: `"weight"` (raw weights), else `"share"`."""
        return "weight" if self.raw else "share"

    @property
    def row_heading(self) -> str:
        """What a ranked row holds, before the token it is read for: `"attention from"`, or
        e.g. `"alti contributions into"`."""
        return "attention from" if self.raw else f"{self.name} contributions into"

    def as_shares(self, scores: torch.Tensor) -> torch.Tensor:
        """`scores` as rankings read them: raw weights as they are (their rows already sum to
        1), any other method's rows as [`shares`][qkv.explain.contributions.base.shares] of their
        total."""
        return scores if self.raw else shares(scores)

    def run(self, model, ids: torch.Tensor, rows: torch.Tensor,
            target_text: str | None = None) -> "Scores":
        """The method's [`Scores`][qkv.explain.contributions.base.Scores] on ids (1, t) for the
        query rows `rows` (no checks: see `contributions.check_method`); a rolled-out method's rows
        of R^1 … R^L (L, r, t)."""
        rows = torch.as_tensor(rows)
        with torch.enable_grad() if self.gradients else torch.no_grad():
            if self.matrices is None:
                return self.compute(model, ids, rows, target_text)
            mats = self.matrices(model, ids, rows, target_text)
        return Scores(method=self.name, per=self.per, rows=rows, target=mats.target,
                      scores=rolled_rows(mats, rows, add_identity=self.add_identity))


@dataclass(frozen=True)
class Scores:
    """What a method computed for the query rows `rows`.

    Attributes:
        method: the method's name.
        per: `"head"` or `"layer"`.
        rows: (r,) the token positions the scores are rows of.
        scores: (L, h, r, s) for per-head methods, (L, r, s) for per-layer ones (row i of the
            layer's matrix rolled out through that layer: R^ℓ = C^ℓ R^{ℓ−1}, R^0 = I).
        layer_scores: a per-head method's per-layer companion (L, r, s), or None
            (`norm`: ‖Σ_h A_ij f^h(h_j)‖).
        target: what `grad` differentiated, in words; None for the other methods.
        unscored: the layers whose scores are zeros because nothing there has softmax weights
            (a hybrid's linear and state-space layers: their effective maps are signed, see
            `qkv.explain.mixer_maps.mixer_map`; a feed-forward-only layer).
    """

    method: str
    per: str
    rows: torch.Tensor
    scores: torch.Tensor
    layer_scores: torch.Tensor | None = None
    target: str | None = None
    unscored: tuple[int, ...] = ()

    def per_layer(self) -> list[torch.Tensor]:
        """The scores as the overview reads them: L tensors (n, r, s), n = heads or 1."""
        s = self.scores if self.per == "head" else self.scores.unsqueeze(1)
        return list(s.unbind(0))


def shares(scores: torch.Tensor) -> torch.Tensor:
    """Each row (last dim) as shares of its total: clamped at 0, divided by the row sum.

    A row that is all zero stays zero. `weight` rows already sum to 1 and come back unchanged
    (to rounding).

    Examples:
        >>> shares(torch.tensor([[1.0, 3.0], [0.0, 0.0]])).tolist()
        [[0.25, 0.75], [0.0, 0.0]]
    """
    s = scores.double().clamp_min(0.0)
    total = s.sum(-1, keepdim=True)
    return torch.where(total > 0, s / total.clamp_min(torch.finfo(s.dtype).tiny), s)


def parked(row: torch.Tensor, units) -> torch.Tensor:
    """(...,) how much of unit-level rows (..., U) lands on special tokens and punctuation —
    where heads park weight they do not need ([CLS], [SEP], a full stop).

    `units` is a `Units`; punctuation is a unit with no letter or
    digit in its label.
    """
    idle = torch.tensor([special or not any(ch.isalnum() for ch in label)
                         for label, special in zip(units.labels, units.special)])
    return row[..., idle].sum(-1)


# -- the traced forward --------------------------------------------------------------------------
@dataclass(frozen=True)
class Forward:
    """One forward of `model` on `ids` with everything the methods read — all of it recorded
    by the model's own traced forward (`LayerTrace.residual`, `MultiHeadTrace.heads`), no
    module hooked from outside.

    Attributes:
        ids: (1, t). output: the model's own output record (logits for a decoder).
        hidden_states: L + 1 tensors (1, t, E); `hidden_states[ℓ]` enters layer ℓ.
        traces: one `LayerTrace` per layer (rows as asked).
    """

    ids: torch.Tensor
    output: object
    hidden_states: tuple[torch.Tensor, ...]
    traces: list

    @property
    def residual_out(self) -> list[torch.Tensor | None]:
        """Per layer, (1, t, E) what the self-attention sub-block hands on — `norm1(x + attn)`
        (post-norm) or `x + attn` (pre-norm): what ALTI decomposes."""
        return [tr.residual for tr in self.traces]

    @property
    def head_outputs(self) -> list[torch.Tensor]:
        """Per layer, (1, t, h·d) the heads' outputs concatenated (`out_proj`'s input); in the
        autograd graph when the forward ran with `grad=True`."""
        return [tr.self_attn.heads for tr in self.traces]


def check_layers(model, method: str, *, hybrid: bool = False) -> None:
    """ArgumentError when a layer is not one a contribution method can read (cross-attention, or
    — unless `hybrid` — a mixer whose weights qkv's attention does not compute: a hybrid's
    Gated DeltaNet, Mamba-2 … layers, named by their kinds from `model.parts`)."""
    for i, layer in enumerate(model.layers):
        if layer.self_attn is None and not hybrid:
            kinds = ", ".join(m.kind.value for m in model.parts.layers[i].mixers) or "nothing"
            raise ArgumentError("method", "{name} {value!r} reads every layer's attention, but layer "
                                "{i} of {model} mixes its tokens by {kinds} (transformers' own "
                                "code); pick one softmax layer (attention_map, explain_head)",
                                value=method, model=model.name, i=i, kinds=kinds)
        if layer.cross_attn is not None:
            raise ArgumentError("method", "{name} {value!r} does not apply to {model}: its layers "
                                "also attend to an encoder (cross-attention); the methods read "
                                "self-attention models", value=method,
                                model=model.name)


def _leaf(x: torch.Tensor) -> torch.Tensor:
    """The first layer's input as a leaf that requires grad: everything after it is then in the
    graph even when the weights do not require grad."""
    return x.detach().requires_grad_(True)


def run(model, ids: torch.Tensor, rows: torch.Tensor | slice, *, grad: bool = False) -> Forward:
    """The model's own forward on `ids` (1, t), keeping the attention rows `rows` (positions,
    or `slice(None)`), the residual stream and the heads' outputs of every row, and the hidden
    states.

    `grad=True` runs it with autograd on, so a scalar of `output` can be differentiated
    with respect to `head_outputs` (`grad`); otherwise nothing keeps a graph.
    """
    leaf = {"interventions": Interventions(inputs={0: _leaf})} if grad else {}
    with torch.set_grad_enabled(grad):
        out = model(ids, torch.ones_like(ids), trace_rows=rows, output_hidden_states=True, **leaf)
    name = model.name
    check_finite(out.traces or (), model=name, output=out.hidden_states[-1])  # NaN: named
    return Forward(ids=ids, output=out, hidden_states=tuple(out.hidden_states),
                   traces=list(out.traces or ()))


# -- the pieces of the decomposition -------------------------------------------------------------
def out_weight(attn) -> torch.Tensor:
    """(h, d, E): W_O^h, head h's slice of the output projection (`out = heads · W_Oᵀ + b`)."""
    E = attn.out_proj.weight.shape[0]
    return attn.out_proj.weight.view(E, attn.num_heads, attn.head_dim).permute(1, 2, 0)  # (h, d, E)


def out_bias(attn) -> torch.Tensor:
    """(E,): b_O, or zeros when `out_proj` has no bias (Llama)."""
    b = attn.out_proj.bias
    return b if b is not None else attn.out_proj.weight.new_zeros(attn.out_proj.weight.shape[0])


def value_vectors(attn, trace) -> torch.Tensor:
    """(h, s, E): f^h(h_j) = v^h_j W_O^h for every head and key, from the forward's own values.

    `trace` is the layer's `MultiHeadTrace`; its values are
    repeated per query head for GQA/MQA, so each query head gets its group's values.
    """
    v = trace.attention.value[0]  # (h, s, d), b_V included
    w = out_weight(attn).to(v.dtype)  # (h, d, E)
    return v @ w  # (h, s, E)


def head_vectors(attn, trace) -> torch.Tensor:
    """(h, r, s, E) f_i^h(h_j): what head h sends from key j to the traced row i, from the
    forward's own values — v^h_j W_O^h, the same for every row (r = 1), or where the layer gates
    its heads' outputs (Qwen3-Next / 3.5: `qkv.explain.mixers.gate.output_gate`)
    (sigmoid(gate_ih) ⊙ v^h_j) W_O^h, the gate read from row i's own layer input.

    A head with high weights and a closed gate sends short vectors: its contribution is small.
    """
    gate = output_gate(attn)
    if gate is None:
        return value_vectors(attn, trace).unsqueeze(1)  # (h, 1, s, E)
    v = trace.attention.value[0]  # (h, s, d), repeated per query head
    g = gate.gates(trace.query_input[0]).to(v.dtype)  # (r, h, d)
    return torch.einsum("hsd,rhd,hde->hrse", v, g, gate.out_weight().to(v.dtype))  # (h, r, s, E)


def output_bias(attn) -> torch.Tensor:
    """(E,) b_O of the projection reading the heads (`out_bias`, or a gated layer's)."""
    gate = output_gate(attn)
    return out_bias(attn) if gate is None else gate.out_bias()


def has_output(attn) -> bool:
    """Whether the projection reading `attn`'s heads is known: `out_proj`, or an output gate's."""
    return attn.out_proj is not None or output_gate(attn) is not None


def rolled_rows(mats: Matrices, rows: torch.Tensor, *, add_identity: bool = False) -> torch.Tensor:
    """(L, r, t): rows `rows` of R^1 … R^L (`rollout` of `mats.layers`; with
    `add_identity` R^ℓ − I, the attention's part). The last layer may be given for some rows only
    (`mats.first`): R^L's rows are then that layer's rows times R^{L−1}, never the full product.
    """
    *below, top = mats.layers
    t = top.shape[-1]
    if top.shape[0] == t:  # every row: the whole product, then its rows
        out = [r[rows] for r in rollout(mats.layers, add_identity=add_identity)]
    else:
        rolled = rollout(below, add_identity=add_identity)
        before = rolled[-1] if rolled else torch.eye(t, dtype=top.dtype)  # R^{L−1} (t, t)
        last = top[rows - mats.first] @ before  # (r, t): rows of C^L R^{L−1}
        if add_identity:
            last = last + before[rows]
        out = [r[rows] for r in rolled] + [last]
    if add_identity:
        eye = torch.eye(t, dtype=top.dtype)[rows]  # (r, t)
        out = [r - eye for r in out]
    return torch.stack(out)


def rollout(mats: list[torch.Tensor], *, add_identity: bool = False) -> list[torch.Tensor]:
    """R^ℓ = M^ℓ R^{ℓ−1}, R^0 = I, for each layer's (t, t) matrix M^ℓ; returns [R^1 … R^L].

    `add_identity`: use R^ℓ = R^{ℓ−1} + M^ℓ R^{ℓ−1} instead (Chefer et al., 2021, eq. 6–7,
    where M holds the gradient-weighted attention and the identity stands for the residual).

    Examples:
        >>> half = torch.full((2, 2), 0.5)
        >>> [r.tolist() for r in rollout([torch.eye(2), half])]
        [[[1.0, 0.0], [0.0, 1.0]], [[0.5, 0.5], [0.5, 0.5]]]
    """
    out, r = [], None
    for m in mats:
        if r is None:
            r = torch.eye(m.shape[-1], dtype=m.dtype, device=m.device)
        r = r + m @ r if add_identity else m @ r
        out.append(r)
    return out
