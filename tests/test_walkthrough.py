"""The worked example: its numbers are the attention arithmetic, and the text shows them.

The arithmetic is checked against an exact answer (Python's ``decimal`` at 60 digits, far beyond
float64's 16) with the suite's derived tolerance (``tests/tolerance.py``): qkv's trace may be no
further from it than twice the plain float64 computation is, plus 2 ulp.
"""

import math
import re
from decimal import Decimal, localcontext

import pytest
import torch

from qkv.errors import QkvError
from qkv.walkthrough import render, worked_example
from tolerance import assert_within


def exact_matmul(a: torch.Tensor, b: torch.Tensor) -> list[list[Decimal]]:
    """a (n, m) @ b (m, p) in 60-digit decimals: every float64 converts exactly, and each product
    and sum rounds at the 60th digit, 10⁴⁴ times finer than float64 does — exact for our purpose."""
    with localcontext() as ctx:
        ctx.prec = 60
        rows = [[Decimal(x) for x in r] for r in a.tolist()]
        cols = [[Decimal(x) for x in c] for c in b.T.tolist()]
        return [[sum((x * y for x, y in zip(r, c)), Decimal(0)) for c in cols] for r in rows]


def exact_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """softmax(q·kᵀ/√d)·v for one head, q (t, d), k (s, d), v (s, d), to ~60 digits.

    Returns float64 tensors (scores (t, s), weights (t, s), output (t, d)): each is the exact
    value rounded once, to within half an ulp.
    """
    scores = exact_matmul(q, k.T)
    with localcontext() as ctx:
        ctx.prec = 60
        scale = 1 / Decimal(q.shape[-1]).sqrt()
        weights = []
        for row in scores:
            top = max(row)
            e = [((x - top) * scale).exp() for x in row]
            total = sum(e, Decimal(0))
            weights.append([x / total for x in e])
        values = [[Decimal(x) for x in r] for r in v.tolist()]
        output = [[sum((w * vs[c] for w, vs in zip(wr, values)), Decimal(0)) for c in range(len(values[0]))]
                  for wr in weights]
    as_tensor = lambda rows: torch.tensor([[float(x) for x in r] for r in rows], dtype=torch.float64)
    return as_tensor(scores), as_tensor(weights), as_tensor(output)


def test_projections_are_x_times_w():
    w = worked_example(["cat", "apple", "tree", "juice"], dim=6, seed=3)
    for name, m, got in (("q", w.w_q, w.trace.query), ("k", w.w_k, w.trace.key), ("v", w.w_v, w.trace.value)):
        exact = torch.tensor([[float(x) for x in r] for r in exact_matmul(w.x, m)], dtype=torch.float64)
        assert_within(got[0], exact, w.x @ m, what=name)


def test_trace_is_the_seeds_arithmetic():
    w = worked_example(["cat", "apple", "tree", "juice"], dim=6, seed=3)
    q, k, v = w.trace.query[0], w.trace.key[0], w.trace.value[0]  # (t, d) each, float64
    scores, weights, output = exact_attention(q, k, v)
    plain_scores = q @ k.T  # the seeds' formulas, in float64
    plain_weights = torch.softmax(plain_scores / math.sqrt(6), dim=-1)
    assert_within(w.trace.scores[0], scores, plain_scores, what="scores")
    assert_within(w.trace.weights[0], weights, plain_weights, what="weights")
    assert_within(w.trace.output[0], output, plain_weights @ v, what="output")


def test_rendered_numbers_are_the_traced_ones():
    w = worked_example(["cat", "apple", "tree", "juice"])
    text = render(w, focus=1)
    # Printed with 4 decimals (weights) and 3 (outputs): a correctly rounded number is within half
    # a unit of its last digit of the value, 0.5e-4 and 0.5e-3.
    shown = [float(m) for m in re.findall(r"softmax weight = ([0-9.]+)", text)]
    assert shown == pytest.approx(w.trace.weights[0, 1].tolist(), abs=0.5e-4)
    out = re.search(r"= \[(.*)\]\s*$", text).group(1)
    assert [float(a) for a in out.split(",")] == pytest.approx(w.trace.output[0, 1].tolist(), abs=0.5e-3)


def test_seed_changes_the_numbers_and_is_reproducible():
    a, b = worked_example(["x", "y"], seed=1), worked_example(["x", "y"], seed=1)
    c = worked_example(["x", "y"], seed=2)
    assert torch.equal(a.trace.output, b.trace.output)
    assert not torch.equal(a.trace.output, c.trace.output)


@pytest.mark.parametrize("tokens, dim", [([], 4), (["a"], 3), (["a"], 0)])
def test_bad_input(tokens, dim):
    with pytest.raises(QkvError):
        worked_example(tokens, dim=dim)


def test_a_repeated_word_is_one_embedding_and_the_weights_ignore_the_token_count():
    """issue 23: `walkthrough a a a a` gave one word four embeddings; W_Q changed with t."""
    from qkv.modules.positional import SinusoidalPositionalEncoding
    from qkv.walkthrough import worked_example

    w = worked_example(["a", "b", "a", "a"], dim=6, seed=3)
    pos = SinusoidalPositionalEncoding(6, max_len=4).double()(torch.zeros(4, 6, dtype=torch.float64))
    emb = w.x - pos  # (t, E): what each token's word contributes
    torch.testing.assert_close(emb[0], emb[2], rtol=0, atol=0)
    torch.testing.assert_close(emb[0], emb[3], rtol=0, atol=0)
    assert not torch.equal(emb[0], emb[1])
    short = worked_example(["b"], dim=6, seed=3)
    torch.testing.assert_close(short.w_q, w.w_q, rtol=0, atol=0)
    torch.testing.assert_close(short.x[0] - pos[0], emb[1], rtol=0, atol=1e-15)
