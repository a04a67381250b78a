"""The worked example: its numbers are the attention arithmetic, and the text shows them."""

import re

import pytest
import torch

from qkv.errors import QkvError
from qkv.walkthrough import render, worked_example


def test_trace_is_the_seeds_arithmetic():
    w = worked_example(["cat", "apple", "tree", "juice"], dim=6, seed=3)
    q, k, v = w.x @ w.w_q, w.x @ w.w_k, w.x @ w.w_v
    scores = q @ k.T
    weights = torch.softmax(scores / 6**0.5, dim=-1)
    torch.testing.assert_close(w.trace.scores[0], scores)
    torch.testing.assert_close(w.trace.weights[0], weights)
    torch.testing.assert_close(w.trace.output[0], weights @ v)


def test_rendered_numbers_are_the_traced_ones():
    w = worked_example(["cat", "apple", "tree", "juice"])
    text = render(w, focus=1)
    shown = [float(m) for m in re.findall(r"softmax weight = ([0-9.]+)", text)]
    assert shown == pytest.approx(w.trace.weights[0, 1].tolist(), abs=5e-5)
    out = re.search(r"= \[(.*)\]\s*$", text).group(1)
    assert [float(a) for a in out.split(",")] == pytest.approx(w.trace.output[0, 1].tolist(), abs=5e-4)


def test_seed_changes_the_numbers_and_is_reproducible():
    a, b = worked_example(["x", "y"], seed=1), worked_example(["x", "y"], seed=1)
    c = worked_example(["x", "y"], seed=2)
    assert torch.equal(a.trace.output, b.trace.output)
    assert not torch.equal(a.trace.output, c.trace.output)


@pytest.mark.parametrize("tokens, dim", [([], 4), (["a"], 3), (["a"], 0)])
def test_bad_input(tokens, dim):
    with pytest.raises(QkvError):
        worked_example(tokens, dim=dim)
