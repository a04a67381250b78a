"""`alti` (Ferrando et al., 2022, "Measuring the Mixing of Contextual Information in the
Transformer"): what each input token contributes to each token after the attention block,
residual and norm included, rolled out through the layers.

Per layer, the attention sub-block's output for token i splits into one vector per input token
j plus biases (the norm's statistics are those of token i's own sum, so given them the norm is
affine):

    z_ij   = Σ_h A^{ℓ,h}_ij f^h(h_j) + δ_ij x_j                 (attention + residual)
    pre-norm (GPT-2, Llama):  y_i = Σ_j z_ij + b_O,              T_i(x_j) = z_ij
    post-norm, LayerNorm:     y_i = γ ⊙ (Σ_j z_ij + b_O − μ_i) / σ_i + β,
                              T_i(x_j) = γ ⊙ (z_ij − mean(z_ij)) / σ_i
    post-norm, RMSNorm:       T_i(x_j) = γ ⊙ z_ij / rms_i

so y_i = Σ_j T_i(x_j) + (the biases' terms). Where the layer gates its heads' outputs
(Qwen3-Next / 3.5), f^h depends on the query: f_i^h(h_j) = (sigmoid(gate_ih) ⊙ v_j) W_O^h
(`base.head_vectors`), so a closed gate's head adds nothing to z_ij. `layer_terms` **checks this reconstruction
against the forward's own y_i** (the output of `norm1`, or the residual sum `norm3` reads) and
raises if it is off by more than 1e-5 (relative to the largest |y|). Then (the paper's eq. 9–10,
L1 distances):

    c_ij = max(0, ‖y_i‖₁ − ‖y_i − T_i(x_j)‖₁),   C_ij = c_ij / Σ_k c_ik
    R^ℓ = C^ℓ R^{ℓ−1},  R^0 = I

The feed-forward block (token-wise) is left out, as in the paper. Memory: (t × t × E) for one
layer at a time, (t × t) per layer kept.
"""

from __future__ import annotations

import torch
from torch import nn

from qkv.explain.circuits.norms import linearise
from qkv.explain.contributions.base import (
    Forward, Matrices, Method, check_layers, output_bias, run, value_vectors,
)
from qkv.explain.mixers.gate import output_gate
from qkv.explain.wording import ArgumentError
from qkv.modules.norms import norm_kind

FORMULA = ("C_ij ∝ max(0, ‖y_i‖₁ − ‖y_i − T_i(x_j)‖₁), T_i(x_j) = norm-affine(Σ_h A_ij f^h(h_j) "
           "+ δ_ij x_j); R^ℓ = C^ℓ R^{ℓ−1}")

# How far Σ_j T_i(x_j) + biases may be from the forward's y_i, relative to the largest |y|:
# float32 sums of t vectors and one division, far inside 1e-5 (measured ~1e-7 on MiniLM).
RECONSTRUCTION_TOLERANCE = 1e-5


def _centres(norm: nn.Module) -> bool:
    """Whether `norm` subtracts the mean (LayerNorm) or not (RMSNorm), by what it does
    (`qkv.modules.norms.norm_kind`)."""
    return norm_kind(norm).centres


def _norm_affine(norm: nn.Module, total: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale (r, E), shift (E,)) with norm(v) = v_c · scale + shift per token, where `total`
    (r, E) is v_c: the norm's input, already centred when the norm centres (LayerNorm) — the
    norm frozen at it (`qkv.explain.circuits.norms.linearise`: γ or 1 + γ, β and 1/σ as the
    norm applies them to `total`)."""
    lin = linearise(norm, total)
    return lin.scale.to(total.dtype), lin.shift.to(total.dtype)


def check_applies(model) -> None:
    """ArgumentError unless every layer forms x + attn before its feed-forward
    (`layer.sequential_residual`: qkv's [`TransformerLayer`][qkv.modules.TransformerLayer], a
    transformers layer one of whose parts reads exactly that sum): a parallel-residual layer
    (GPT-NeoX) or one that normalises the attention's branch before adding it (OLMo 2, Gemma 2)
    never forms it, so there is no attention-block output to decompose."""
    check_layers(model, "alti")
    for layer in model.layers:
        if not layer.sequential_residual:
            raise ArgumentError("method", "{name} 'alti' does not apply to {model}: its layers "
                                "({kind}) do not form x + attn before the feed-forward (a parallel "
                                "residual, a norm on the attention's branch, or a layer whose "
                                "residual qkv cannot read), so no output of the attention block "
                                "alone can be decomposed",
                                model=model.name,
                                kind=type(layer).__name__)


def value_layout(layer, trace) -> torch.Tensor | None:
    """(s, h, E): f^h(h_j) per key, centred over E when the layer's norm1 is a post-norm
    LayerNorm (centring is linear: the mean of Σ_h A_ij f^h(h_j) is Σ_h A_ij mean(f^h(h_j)), so
    centring the values centres every T_i(x_j) at no cost per (i, j)). Contiguous: bmm would
    otherwise copy each of the s small matrices apart."""
    if output_gate(layer.self_attn) is not None:
        return None  # a gated layer's vectors depend on the query: layer_terms makes them per row
    f = value_vectors(layer.self_attn, trace)  # (h, s, E)
    if not layer.norm_first and _centres(layer.norm1):
        f = f - f.mean(-1, keepdim=True)
    return f.transpose(0, 1).contiguous()  # (s, h, E)


def layer_terms(layer, fwd: Forward, index: int, rows: slice = slice(None),
                per_key: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(T (r, s, E), bias (r, E), y (r, E)) of layer `index` for the query rows `rows`:
    T[i, j] = T_i(x_j).

    `per_key`: `value_layout` of the layer, when the caller already has it.

    Raises AssertionError when Σ_j T[i, j] + bias[i] is not the forward's y_i (see the module
    doc): the decomposition is then of something other than what the model computed. (The sum
    is taken over the same (r, s, E) tensor before the norm's per-token scale multiplies it.)
    """
    tr = fwd.traces[index].self_attn
    centred = not layer.norm_first and _centres(layer.norm1)
    a = tr.attention.weights[0][:, rows]  # (h, r, s)
    y = fwd.residual_out[index][0][rows]  # (r, E): what the forward computed
    first, r = rows.start or 0, a.shape[1]
    gate = output_gate(layer.self_attn)
    if gate is None:
        per_key = value_layout(layer, tr) if per_key is None else per_key  # (s, h, E)
        # Σ_h A_ij f^h(h_j) for every (i, j): one (r × h)·(h × E) product per key j
        z = torch.bmm(a.permute(2, 1, 0).contiguous(), per_key).transpose(0, 1)  # (r, s, E)
    else:  # f_i^h(h_j) = (g_ih ⊙ v_j) W_O^h: the gate is the query's, so per (i, j, h)
        v = tr.attention.value[0]  # (h, s, d)
        g = gate.gates(tr.query_input[0][rows]).to(v.dtype)  # (r, h, d)
        w = gate.out_weight().to(v.dtype)  # (h, d, E)
        w = w - w.mean(-1, keepdim=True) if centred else w
        u = torch.einsum("hrs,rhd,hsd->rshd", a, g, v)  # (r, s, h, d)
        z = u.reshape(r, v.shape[1], -1) @ w.reshape(-1, w.shape[-1])  # (r, s, E)
    x = fwd.hidden_states[index][0][first:first + r]  # (r, E): the residual
    diag = z.diagonal(offset=first, dim1=0, dim2=1)  # (E, r): z[i, first + i]
    diag += (x - x.mean(-1, keepdim=True) if centred else x).T  # δ_ij x_j
    b_out = output_bias(layer.self_attn).to(z.dtype)  # (E,)
    b_out = b_out - b_out.mean() if centred else b_out
    total = z.sum(1) + b_out  # (r, E): the block's output (centred for a LayerNorm)
    if layer.norm_first:
        terms, bias, rebuilt = z, b_out.expand_as(y), total
    else:
        scale, shift = _norm_affine(layer.norm1, total)
        terms = z.mul_(scale.unsqueeze(1))  # (r, s, E)
        bias, rebuilt = b_out * scale + shift, total * scale + shift  # (r, E)
    err = float((rebuilt - y).abs().max()) if r else 0.0
    top = max(1.0, float(y.abs().max())) if r else 1.0
    if err > RECONSTRUCTION_TOLERANCE * top:
        raise AssertionError(f"ALTI: layer {index}'s terms sum to within {err:.3g} of the "
                             f"forward's output (largest |y| {top:.3g}); allowed "
                             f"{RECONSTRUCTION_TOLERANCE} relative")
    return terms, bias, y


def matrix(terms: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """(r, s) C: c_ij = max(0, ‖y_i‖₁ − ‖y_i − T_i(x_j)‖₁), rows normalised to sum 1.

    `terms` (r, s, E) is overwritten (it is the largest tensor ALTI holds).
    """
    distance = terms.sub_(y.unsqueeze(1)).abs_().sum(-1)  # (r, s): ‖T_i(x_j) − y_i‖₁
    c = (y.abs().sum(-1, keepdim=True) - distance).clamp_min(0)
    return c / c.sum(-1, keepdim=True).clamp_min(torch.finfo(c.dtype).tiny)


# Query rows per chunk: the (r, s, E) terms of a chunk stay near 2**20 numbers (4 MB in float32),
# so the elementwise passes over them run in cache instead of over one (t, t, E) tensor.
CHUNK = 1 << 20


def layer_matrix(layer, fwd: Forward, index: int, rows: slice = slice(None)) -> torch.Tensor:
    """(r, t) rows `rows` (all: (t, t)) of layer `index`'s C^ℓ, a chunk of rows at a time."""
    tr = fwd.traces[index].self_attn
    per_key = value_layout(layer, tr)  # (s, h, E); None for a gated layer
    s, E = tr.attention.weights.shape[-1], fwd.hidden_states[index].shape[-1]
    first, stop, _ = rows.indices(fwd.hidden_states[index].shape[1])
    step = max(1, CHUNK // (s * E))
    return torch.cat([matrix(*layer_terms(layer, fwd, index, slice(i, min(i + step, stop)),
                                          per_key)[::2])
                      for i in range(first, stop, step)])


def matrices(model, ids: torch.Tensor, last: slice = slice(None)) -> list[torch.Tensor]:
    """Each layer's C^ℓ (t, t), before rollout; only the rows `last` of the last layer's
    (the token's rows are all that layer's rollout reads)."""
    check_applies(model)
    fwd = run(model, ids, slice(None))
    n = len(model.layers)
    with torch.no_grad():
        return [layer_matrix(layer, fwd, i, last if i == n - 1 else slice(None))
                for i, layer in enumerate(model.layers)]


def for_rows(model, ids: torch.Tensor, rows: torch.Tensor, target_text: str | None = None) -> Matrices:
    """`matrices` with the last layer's rows cut to the span of `rows`; `METHOD.run`
    rolls them out (shapes: the example in
    [`qkv.explain.contributions`][qkv.explain.contributions])."""
    first, stop = int(rows.min()), int(rows.max()) + 1
    return Matrices(matrices(model, ids, slice(first, stop)), first=first)  # last: (stop − first, t)


METHOD = Method(name="alti", per="layer", formula=FORMULA, matrices=for_rows,
                applies=check_applies,
                cost="one forward tracing every row; (t × t × E) for one layer at a time")
