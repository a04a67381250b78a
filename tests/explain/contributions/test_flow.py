"""``flow`` (attention flow): max-flow through rollout's capacities, checked on graphs whose
answer is known, against rollout where the two must agree, and refused past its length limit."""

from __future__ import annotations

import pytest
import torch

from qkv.explain.contributions import base, flow, rollout
from qkv.explain.wording import ArgumentError


def test_one_layer_flow_is_the_capacity():
    """With one layer the only path from j to i is the edge itself."""
    cap = torch.tensor([[0.7, 0.3], [0.2, 0.8]], dtype=torch.float64)
    f = flow.flows([cap], torch.tensor([0, 1]))  # (1, 2, 2)
    assert torch.equal(f[0], cap)  # one edge: the flow is its capacity, nothing computed


def test_paths_share_capacity():
    """Two layers, 2 tokens: j = 0 reaches i = 0 through (1, 0) and (1, 1); each path is capped by
    its narrowest edge, and a path that rollout multiplies is here a minimum."""
    c1 = torch.tensor([[0.9, 0.1], [0.6, 0.4]], dtype=torch.float64)  # c1[i, j]: (0, j) → (1, i)
    c2 = torch.tensor([[0.5, 0.5], [0.0, 1.0]], dtype=torch.float64)  # (1, j) → (2, i)
    f = flow.flows([c1, c2], torch.tensor([0]))
    # each answer is a sum of two path flows, each an exact minimum of given capacities ≤ 1:
    # at most a few roundings of numbers ≤ 1 (augmenting and cancelling), 4 eps64 to spare
    tol = 4 * torch.finfo(torch.float64).eps
    # into (2, 0) from (0, 0): via (1, 0) min(0.9, 0.5) + via (1, 1) min(0.6, 0.5) = 1.0
    assert abs(float(f[1, 0, 0]) - 1.0) <= tol
    # from (0, 1): via (1, 0) min(0.1, 0.5) + via (1, 1) min(0.4, 0.5) = 0.5
    assert abs(float(f[1, 0, 1]) - 0.5) <= tol
    r = base.rollout([c1, c2])[1][0]  # rollout multiplies instead: 0.75, 0.25
    # 0.9·0.5 + 0.6·0.5 and 0.1·0.5 + 0.4·0.5: two products and a sum, 3 roundings of numbers ≤ 1
    torch.testing.assert_close(r, torch.tensor([0.75, 0.25], dtype=torch.float64), atol=tol, rtol=0)


def test_on_minilm_the_first_layer_is_rollouts(model):
    ids = torch.tensor([model.tokenizer.encode("the cat sat on the mat").ids])
    rows = torch.tensor([3])
    f = flow.compute(model, ids, rows).scores
    r = rollout.METHOD.run(model, ids, rows).scores
    assert f.shape == r.shape == (6, 1, ids.shape[1])
    # one layer: the flow is the edge's capacity, rollout's R^1 = Â^1 · I (exact zeros added); the
    # capacity goes from float32 to float64 exactly, so they are equal
    assert torch.equal(f[0], r[0].double())
    assert bool((f >= 0).all())  # a max-flow value is a sum of non-negative pushes


def test_long_texts_are_refused(model):
    ids = torch.zeros(1, flow.MAX_TOKENS + 1, dtype=torch.long)
    with pytest.raises(ArgumentError, match=r"'flow' does not apply to a text of 25 tokens"):
        flow.compute(model, ids, torch.tensor([0]))
