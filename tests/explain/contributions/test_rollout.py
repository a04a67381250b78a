"""``rollout`` equals a plain float64 implementation on transformers' ``output_attentions``."""

from __future__ import annotations

import torch

from qkv.explain.contributions import base, rollout
from tolerance import assert_within, softmax_sum_tolerance, twin

TEXT = "The dog found some pizza next to the baby and ate it"


def plain_rollout(attentions) -> torch.Tensor:
    """(L, t, t) R^1 … R^L from transformers' per-layer (1, h, t, t) weights, in float64."""
    r, out = None, []
    for a in attentions:
        a = a[0].double().mean(0)  # (t, t)
        eye = torch.eye(a.shape[0], dtype=torch.float64)
        r = (0.5 * a + 0.5 * eye) @ (eye if r is None else r)
        out.append(r)
    return torch.stack(out)


def test_rollout_equals_transformers_in_float64(model, hf):
    ids = torch.tensor([model.tokenizer.encode(TEXT).ids])
    t = ids.shape[1]
    got = rollout.METHOD.run(model, ids, torch.arange(t)).scores  # (L, t, t), float32 forward
    with torch.no_grad():
        ref = plain_rollout(twin(hf, torch.float64)(ids, output_attentions=True).attentions)
        plain = plain_rollout(hf(ids, output_attentions=True).attentions)
    assert_within(got, ref, plain, what="rollout R^ℓ")
    # Each Â^ℓ row sums to 1 within a softmax row's rounding, plus the head mean's h roundings,
    # ½·, ½· and +, and R = Â R's t-term dot products (rows of non-negative numbers summing to ≈ 1);
    # to first order the L layers' errors add.
    h, eps = model.layers[0].self_attn.num_heads, torch.finfo(got.dtype).eps
    tol = len(model.layers) * (softmax_sum_tolerance(t, got.dtype) + (h + t + 3) * eps)
    torch.testing.assert_close(got.sum(-1), torch.ones(len(model.layers), t), atol=tol, rtol=0)


def test_rows_are_the_rows_of_the_full_matrix(model):
    ids = torch.tensor([model.tokenizer.encode(TEXT).ids])
    full = rollout.METHOD.run(model, ids, torch.arange(ids.shape[1])).scores
    rows = torch.tensor([12, 3])
    assert torch.equal(rollout.METHOD.run(model, ids, rows).scores, full[:, rows])  # same operations


def test_causal_rollout_stays_causal(gpt2_pair, ids):
    r = rollout.METHOD.run(gpt2_pair[0], ids, torch.arange(ids.shape[1])).scores  # (L, t, t)
    assert bool((torch.triu(r, diagonal=1) == 0).all())


def test_rollout_helper_multiplies_in_order():
    a, b = torch.rand(3, 3, dtype=torch.float64), torch.rand(3, 3, dtype=torch.float64)
    r1, r2 = base.rollout([a, b])
    assert torch.equal(r1, a) and torch.allclose(r2, b @ a)
    s1, s2 = base.rollout([a, b], add_identity=True)
    eye = torch.eye(3, dtype=torch.float64)
    assert torch.allclose(s2, (eye + b) @ (eye + a))
