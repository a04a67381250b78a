"""Differential attention, the gated output and sparse indexed attention, against their layers.

Tolerances: transformers' eager softmax and DiffLlama's λ are computed in float32
(``dtype=torch.float32``), so what comes from them is compared by ``assert_within`` with qkv's
float64 answer: 2× (4× where two float32 steps chain, λ times a softmax) the same formula in
float32, plus 2 float32 ulp. Sums of float64 terms against the layer's float64 output are one
answer two ways: ``assert_agree`` with the float32 twin's.
"""

from __future__ import annotations

import pytest
import torch
from mixer_layers import diffllama_attention, inputs, qwen3_next_attention, rotary_inputs, sparse_attention
from tolerance import assert_agree, assert_within, twin

from qkv.errors import QkvError
from qkv.explain.mixers import differential, gate, mla, sparse


def _causal(t: int, dtype=torch.float64) -> torch.Tensor:
    return torch.full((t, t), torch.finfo(dtype).min, dtype=dtype).triu(1)[None, None]


@pytest.mark.parametrize("t", [1, 7, 33])
@pytest.mark.parametrize("kv_heads", [2, 4])
def test_differential_map_times_values_is_the_layers_combination(t, kv_heads):
    layer, rotary = diffllama_attention(kv_heads=kv_heads)
    x = inputs(t)
    diff = differential.read(layer, x, rotary_inputs(rotary, x))
    low = differential.read(twin(layer, torch.float32), x.float(), rotary_inputs(rotary, x.float()))
    assert diff.heads == 2 and diff.value.shape == (t, 2, 2 * layer.head_dim)
    for p in range(diff.heads):
        W = diff.matrix(p)
        assert torch.equal(W.triu(1), torch.zeros_like(W))
        assert_within(diff.output[:, p].float(), W @ diff.values(p), low.matrix(p) @ low.values(p), factor=4.0,
                      what=f"differential head {p}: output vs (A1 − λA2)·v")
        # rows of each softmax map sum to 1, so the difference's rows sum to 1 − λ
        assert torch.allclose(W.sum(-1), torch.full((t,), 1 - diff.lam, dtype=torch.float64), atol=1e-6)
    assert 0 < diff.lambda_init < 1


@pytest.mark.parametrize("t", [1, 9])
def test_gated_heads_contributions_sum_to_the_layers_output(t):
    layer, rotary = qwen3_next_attention()
    x = inputs(t)
    pe = rotary_inputs(rotary, x)
    g = gate.read(layer, x, pe)
    with torch.no_grad():
        out = layer(x, position_embeddings=pe, attention_mask=_causal(t))[0][0]  # (t, m)
    low_layer = twin(layer, torch.float32)
    low = gate.read(low_layer, x.float(), rotary_inputs(rotary, x.float()), torch.float32)
    summed = sum(g.contribution(h) for h in range(g.heads)) + g.bias
    assert_agree(summed, out, sum(low.contribution(h) for h in range(low.heads)) + low.bias, what="Σ heads vs the layer")
    assert ((g.gate > 0) & (g.gate < 1)).all()
    assert all((g.kept(h) > 0).all() for h in range(g.heads))


def test_a_closed_gate_silences_a_head_with_confident_weights():
    """Gate logits of −30 on head 0: sigmoid ≈ 1e-13, so its contribution vanishes while its
    attention weights are unchanged — what the page must say of such a head."""
    layer, rotary = qwen3_next_attention()
    x = inputs(7)
    pe = rotary_inputs(rotary, x)
    before = gate.read(layer, x, pe)
    d = layer.head_dim
    with torch.no_grad():  # head 0's gate rows: each head's q_proj rows are d query rows, then d gate rows
        layer.q_proj.weight[d: 2 * d] = 0.0
        layer.q_proj.bias[d: 2 * d] = -30.0
    after = gate.read(layer, x, pe)
    assert torch.equal(after.weights[0], before.weights[0])
    assert after.openness(0).max() < 1e-12 and after.contribution(0).abs().max() < 1e-10
    assert before.contribution(0).abs().max() > 1e-3


@pytest.mark.parametrize("kind", ["deepseek_v32", "glm_moe_dsa"])
@pytest.mark.parametrize("t", [3, 12, 33])
def test_sparse_selection_is_the_indexers_top_k_and_the_weights_are_over_it(kind, t):
    layer, rotary = sparse_attention(kind, topk=5)
    x = inputs(t)
    pe = rotary_inputs(rotary, x)
    rec = sparse.read(layer, x, pe)
    low = sparse.read(twin(layer, torch.float32), x.float(), rotary_inputs(rotary, x.float()))
    attention = mla.read(layer, x, pe)  # the same layer's MLA steps: its scores before the index mask
    for i in range(t):
        row = rec.row(i)
        assert len(row.selected) == min(i + 1, rec.topk)
        # the indexer computes in float32: a key may swap with one within 2× the float32 error of the score
        tol = 2 * float((low.scores[i, : i + 1].double() - row.scores).abs().max()) + 2 * torch.finfo(torch.float32).eps * float(row.scores.abs().max())
        left_out = [j for j in range(i + 1) if j not in row.selected]
        if left_out:
            assert row.cutoff >= float(row.scores[left_out].max()) - tol
            assert all(row.missed_by(j) >= -tol for j in left_out) and row.missed_by(row.selected[0]) == 0.0
            assert torch.equal(row.weights[:, left_out], torch.zeros(row.weights.shape[0], len(left_out), dtype=torch.float64))
        for h in range(rec.weights.shape[0]):
            kept = torch.tensor(row.selected)
            ours = torch.softmax(attention.scores(h)[i, kept], dim=-1)
            plain = torch.softmax(attention.scores(h)[i, kept].float(), dim=-1)
            assert_within(row.weights[h, kept].float(), ours, plain, what=f"row {i} head {h} weights")
    assert rec.row(t - 1).to_dict()["kind"] == "sparse_row"


def test_sparse_refuses_an_invisible_key():
    layer, rotary = sparse_attention(topk=2)
    x = inputs(6)
    row = sparse.read(layer, x, rotary_inputs(rotary, x)).row(3)
    with pytest.raises(QkvError, match="key 5 is not visible from query 3"):
        row.missed_by(5)
