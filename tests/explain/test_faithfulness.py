"""Spearman's ρ (qkv.explain.faithfulness) against scipy, and the per-method probe scores against
the attention probe they generalise."""

from __future__ import annotations

import pytest
import torch

from qkv.explain.faithfulness import method_scores, ranks, spearman
from qkv.explain.induction import induction_probe


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
