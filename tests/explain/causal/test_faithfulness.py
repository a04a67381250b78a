"""Spearman's ρ (qkv.explain.faithfulness) against scipy, and the per-method probe scores against
the attention probe they generalise."""

from __future__ import annotations

import pytest
import torch

from qkv.explain.causal.faithfulness import method_scores, ranks, spearman
from qkv.explain.probes.induction import induction_probe


@pytest.fixture(scope="module")
def lm():
    import qkv

    return qkv.load("lm")  # the shipped 2-layer, 2-head decoder


@pytest.mark.parametrize("seed", range(5))
def test_spearman_equals_scipy_with_ties(seed):
    stats = pytest.importorskip("scipy.stats")
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(0, 5, (17,), generator=g).double()  # ties on purpose
    b = torch.randn(17, generator=g, dtype=torch.float64)
    ref = stats.spearmanr(a.numpy(), b.numpy()).statistic
    # both compute Pearson's r of average ranks in float64: a few roundings of 17 terms apart
    assert abs(spearman(a, b) - ref) <= 64 * torch.finfo(torch.float64).eps


def test_spearman_has_no_order_to_compare_on_a_constant():
    assert spearman(torch.ones(4), torch.arange(4.0)) is None
    assert abs(spearman(torch.arange(4.0), -torch.arange(4.0)) + 1) <= 4 * torch.finfo(torch.float64).eps
    with pytest.raises(ValueError, match="same length"):
        spearman(torch.ones(3), torch.ones(4))


def test_ranks_average_ties():
    assert ranks(torch.tensor([2.0, 1.0, 2.0])).tolist() == [2.5, 1.0, 2.5]


def test_weight_scores_are_the_induction_probe(lm):
    # the "weight" method's probe score is the attention probe itself: same sequences, same rule
    ours = method_scores(lm, "induction", "weight", sequences=3, length=None, seed=0)
    ref = induction_probe(lm, "induction", sequences=3, seed=0).scores
    torch.testing.assert_close(ours, ref, rtol=0, atol=0)


def test_previous_token_scores_are_read_on_the_pairs_that_are_ablated(lm):
    # both sides of the previous-token comparison use the probe's task: the alternating pairs
    from qkv.explain.causal.head_effects import task
    from qkv.explain.probes.induction import alternating_pairs
    from qkv.explain.probes.induction import attention_on, previous_token_scores_of

    t = task(lm, "previous-token", sequences=3, length=None, seed=0)
    pairs = alternating_pairs(lm, sequences=3, length=t.length, seed=0)
    assert torch.equal(torch.cat(t.ids), pairs)
    ours = method_scores(lm, "previous-token", "weight", sequences=3, length=None, seed=0)
    per_sequence = [attention_on(lm, seq) for seq in pairs.split(1)]  # one forward each, as ours
    ref = torch.stack([previous_token_scores_of(torch.cat([w[layer] for w in per_sequence]))
                       for layer in range(len(per_sequence[0]))])  # (L, h)
    # the same float32 weights, averaged per sequence and then over sequences rather than all at
    # once: float64 means of at most t·3 terms apart, a few ulps of the scores' size
    tol = 4 * pairs.numel() * torch.finfo(torch.float64).eps
    torch.testing.assert_close(ours, ref, rtol=0, atol=tol)
