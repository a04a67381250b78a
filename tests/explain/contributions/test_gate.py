"""The output gate (Qwen3-Next / 3.5) in the contributions (issue 39 item 6): a head's vectors
are (sigmoid(gate_i) ⊙ v_j) W_O^h, so a head with high weights and a closed gate contributes
~0 while its weights are unchanged, and the terms still rebuild the layer's own output.

The checkpoints: `tests/hf/closed_gate.py`'s tiny qwen3_5 with head HEAD of layer LAYER's gate
closed (sigmoid(−30) ≈ 9.4e-14 for every input), and its twin with the gate as drawn. Tolerances: Higham's bound on float sums (`test_norm.worst_case`) plus the gate's one
product; the closed head's scores by sigmoid(−30) times their ungated size.
"""

from __future__ import annotations

import math

import pytest

transformers = pytest.importorskip("transformers")  # the qkv[hf] extra
import torch  # noqa: E402

import qkv  # noqa: E402
from closed_gate import CLOSED, HEAD, LAYER, save_gated  # noqa: E402
from qkv.explain.contributions import METHODS, alti, base, norm  # noqa: E402
from qkv.explain.mixers.gate import output_gate  # noqa: E402

TEXT = "the cat sat on the mat . a red dog"


@pytest.fixture(scope="module")
def gated(tmp_path_factory):
    """(the model with head HEAD's gate closed, its twin with the gate as drawn)."""
    closed, drawn = tmp_path_factory.mktemp("closed"), tmp_path_factory.mktemp("drawn")
    save_gated(closed, close=True)
    save_gated(drawn, close=False)
    return qkv.load(closed), qkv.load(drawn)


def _ids(model):
    return torch.tensor([model.tokenizer.encode(TEXT).ids])


def _module_output(model, ids):
    """(the contributions' forward, layer LAYER's attention output (t, E) in that forward)."""
    seen = []
    module = model.layers[LAYER].self_attn.module
    handle = module.register_forward_hook(lambda m, a, out: seen.append(out[0][0].detach()))
    try:
        fwd = base.run(model, ids, slice(None))
    finally:
        handle.remove()
    return fwd, seen[0]


def test_a_closed_gate_leaves_the_weights_and_silences_the_head(gated):
    closed, drawn = gated
    assert output_gate(closed.layers[LAYER].self_attn) is not None
    assert closed.layers[0].self_attn is None  # a Gated DeltaNet layer: left out, not an error
    ids = _ids(closed)
    fwd_closed, fwd_drawn = base.run(closed, ids, slice(None)), base.run(drawn, ids, slice(None))
    w = fwd_closed.traces[LAYER].self_attn.attention.weights
    assert torch.equal(w, fwd_drawn.traces[LAYER].self_attn.attention.weights)  # the gate changes no q, k
    scores = norm.compute(closed, ids, torch.arange(ids.shape[1]))
    assert scores.unscored == (0, 2)
    # the closed head's ‖A (g ⊙ v) W_O‖ ≤ sigmoid(−30) · A ‖v W_O‖ (g = sigmoid(−30) exactly, every channel)
    attn, tr = closed.layers[LAYER].self_attn, fwd_closed.traces[LAYER].self_attn
    f = tr.attention.value[0, HEAD] @ output_gate(attn).out_weight()[HEAD]  # (s, E): v_j W_O^h, no gate
    ungated = w[0, HEAD] * f.norm(dim=-1)  # (t, s)
    sig = 1 / (1 + math.exp(-CLOSED))
    eps = torch.finfo(torch.float32).eps
    assert bool((scores.scores[LAYER, HEAD] <= sig * ungated * (1 + 8 * eps)).all())
    assert float(scores.scores[LAYER, HEAD].max()) < 1e-11 < float(ungated.max())
    # the other heads of the layer still send vectors of their ungated size's order
    others = [h for h in range(attn.num_heads) if h != HEAD]
    assert float(scores.scores[LAYER, others].max()) > 1e-3
    # the drawn twin's head HEAD is open: its norm score is far from 0
    assert float(norm.compute(drawn, ids, torch.arange(ids.shape[1])).scores[LAYER, HEAD].max()) > 1e-3


@pytest.mark.parametrize("which", [0, 1])
def test_the_gated_terms_rebuild_the_layers_output(gated, which):
    model = gated[which]
    ids = _ids(model)
    fwd, out = _module_output(model, ids)
    attn, tr = model.layers[LAYER].self_attn, fwd.traces[LAYER].self_attn
    with torch.no_grad():
        terms = norm.terms(attn, tr)  # (h, t, s, E)
        rebuilt = terms.sum((0, 2)) + base.output_bias(attn)  # (t, E)
    h, _, s, _ = terms.shape
    n = h * s + 2 * attn.head_dim + s + h * attn.head_dim + 3  # test_norm.worst_case's + the gate's product
    bound = n * torch.finfo(terms.dtype).eps * terms.abs().sum((0, 2)).amax(-1, keepdim=True)
    err = (rebuilt - out).abs()
    assert bool((err <= bound).all()), f"{float(err.max()):.2e} > {float(bound.max()):.2e}"


def test_alti_reads_the_gate_and_rebuilds_every_layer(tmp_path):
    """An all-softmax qwen3_5 (every layer gated): ALTI's own reconstruction check (Σ_j T_i(x_j)
    + biases = the forward's y_i) passes on every layer, and its rows are shares."""
    save_gated(tmp_path, close=True, layer_types=["full_attention"] * 4)
    model = qkv.load(tmp_path)
    assert all(output_gate(layer.self_attn) is not None for layer in model.layers)
    ids = _ids(model)
    mats = alti.matrices(model, ids)
    for C in mats:
        assert torch.allclose(C.sum(-1), torch.ones(C.shape[0]), atol=64 * torch.finfo(C.dtype).eps)
    assert METHODS["alti"].run(model, ids, torch.tensor([ids.shape[1] - 1])).scores.shape == (4, 1, ids.shape[1])


def test_ablating_a_closed_head_changes_nothing(gated):
    """head_effects zeroes a head's output before its gate: the gated write is removed whole, so
    the closed head's effect is the gate's sigmoid(−30)-sized write — nothing at float32 — while
    the drawn twin's open head moves the loss."""
    from qkv.explain.causal.head_effects import head_effects

    closed, drawn = (head_effects(m, "induction", sequences=2, length=4) for m in gated)
    assert abs(float(closed.effects[LAYER, HEAD])) <= 1e-6
    assert abs(float(drawn.effects[LAYER, HEAD])) > 1e-4
