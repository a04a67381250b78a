"""Causal and sliding-window masks: their definition, how they combine, and causality proven
from gradients (flax's test): output row i must not depend on any key or value it may not see.

The expected masks are built here by looping over (i, j) with the definition ``p_i = i + offset``
(``offset = s - t`` for bottom-right alignment) and ``p_i - left <= j <= p_i + right``.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import qkv
from qkv.attention import padding_mask, structural_mask
from qkv.attention.masks import combine_masks

BACKENDS = ("reference", "fused", "auto")


def expected_keep(t, s, *, is_causal=False, window=None, alignment="top_left"):
    left, right = window if window is not None else (None, None)
    offset = s - t if alignment == "bottom_right" else 0
    keep = torch.zeros(t, s, dtype=torch.bool)
    for i in range(t):
        p = i + offset
        for j in range(s):
            ok = (not is_causal or j <= p)
            ok = ok and (left is None or j >= p - left) and (right is None or j <= p + right)
            keep[i, j] = ok
    return keep


SIZES = [(1, 1), (1, 7), (7, 1), (5, 5), (3, 8), (8, 3)]
WINDOWS = [None, (None, None), (0, 0), (2, None), (None, 1), (1, 3), (0, 5)]


@pytest.mark.parametrize("alignment", ["top_left", "bottom_right"])
@pytest.mark.parametrize("is_causal", [False, True])
def test_structural_mask_follows_the_definition(is_causal, alignment):
    for (t, s), window in itertools.product(SIZES, WINDOWS):
        got = structural_mask(t, s, is_causal=is_causal, window=window, causal_alignment=alignment)
        want = expected_keep(t, s, is_causal=is_causal, window=window, alignment=alignment)
        if got is None:  # None means "no structure": every key kept
            assert want.all(), (t, s, window)
        else:
            assert got.dtype == torch.bool and torch.equal(got, want), (t, s, window)


def test_structural_mask_draws_the_docstring_pictures():
    top_left = [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0]]
    bottom_right = [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    assert structural_mask(3, 5, is_causal=True).int().tolist() == top_left
    assert structural_mask(3, 5, is_causal=True,
                           causal_alignment="bottom_right").int().tolist() == bottom_right


def test_bottom_right_with_more_queries_than_keys_leaves_the_first_rows_empty():
    keep = structural_mask(5, 3, is_causal=True, causal_alignment="bottom_right")
    assert keep.sum(-1).tolist() == [0, 0, 1, 2, 3]


def test_combine_masks_keeps_both_meanings():
    structure = torch.tensor([[True, False], [True, True]])
    user_bool = torch.tensor([[True, True], [False, True]])
    assert combine_masks(user_bool, structure).tolist() == [[True, False], [False, True]]
    user_float = torch.tensor([[0.5, 0.25], [-1.0, 2.0]])
    combined = combine_masks(user_float, structure)
    assert combined.tolist() == [[0.5, float("-inf")], [-1.0, 2.0]]
    assert combine_masks(None, structure) is structure and combine_masks(user_bool, None) is user_bool


def test_padding_mask_marks_real_tokens():
    keep = padding_mask(torch.tensor([2, 0, 4]), 4)
    assert keep.shape == (3, 1, 1, 4)
    assert keep[:, 0, 0].int().tolist() == [[1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]]


@pytest.mark.parametrize("backend", BACKENDS)
def test_window_intersects_with_bool_and_float_masks(backend):
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, n, 8, generator=gen, dtype=torch.float64) for n in (6, 9, 9))
    user = torch.rand(2, 1, 6, 9, generator=gen) > 0.3
    bias = torch.zeros(2, 1, 6, 9, dtype=torch.float64).masked_fill(~user, float("-inf"))
    window = dict(window=(2, 0), causal_alignment="bottom_right")
    keep = user & expected_keep(6, 9, window=(2, 0), alignment="bottom_right")
    want = qkv.scaled_dot_product_attention(q, k, v, attn_mask=keep, backend="reference")

    out_bool = qkv.scaled_dot_product_attention(q, k, v, attn_mask=user, backend=backend, **window)
    out_float = qkv.scaled_dot_product_attention(q, k, v, attn_mask=bias, backend=backend, **window)

    torch.testing.assert_close(out_bool, want)
    torch.testing.assert_close(out_float, want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_is_causal_with_a_window_is_the_window_closed_on_the_right(backend):
    q, k, v = (torch.randn(1, 2, n, 8, dtype=torch.float64) for n in (6, 9, 9))
    both = qkv.scaled_dot_product_attention(q, k, v, is_causal=True, window=(2, 4),
                                            causal_alignment="bottom_right", backend=backend)
    window = qkv.scaled_dot_product_attention(q, k, v, window=(2, 0),
                                              causal_alignment="bottom_right", backend=backend)
    torch.testing.assert_close(both, window)


# -- causality from gradients ----------------------------------------------------------------------

def _dependence(backend, t, s, **kwargs):
    """(t, s) bools: does output row i depend on key j? on value j? (from autograd)"""
    gen = torch.Generator().manual_seed(t * 31 + s)
    q, k, v = (torch.randn(1, 2, n, 4, generator=gen, dtype=torch.float64, requires_grad=True)
               for n in (t, s, s))
    out = qkv.scaled_dot_product_attention(q, k, v, backend=backend, **kwargs)  # (1, 2, t, d)
    dk = torch.zeros(t, s, dtype=torch.bool)
    dv = torch.zeros(t, s, dtype=torch.bool)
    for i in range(t):
        gk, gv = torch.autograd.grad(out[:, :, i].sum(), (k, v), retain_graph=True)
        dk[i] = gk.abs().sum(dim=(0, 1, 3)) != 0
        dv[i] = gv.abs().sum(dim=(0, 1, 3)) != 0
    return dk, dv


CAUSAL_CASES = [
    (5, 5, dict(is_causal=True)),
    (4, 7, dict(is_causal=True)),
    (4, 7, dict(is_causal=True, causal_alignment="bottom_right")),
    (7, 4, dict(is_causal=True, causal_alignment="bottom_right")),
    (6, 6, dict(window=(2, 0))),
    (5, 8, dict(window=(1, 2), causal_alignment="bottom_right")),
    (5, 8, dict(is_causal=True, window=(3, None))),
]


@pytest.mark.parametrize("t, s, kwargs", CAUSAL_CASES, ids=[str(c) for c in CAUSAL_CASES])
@pytest.mark.parametrize("backend", BACKENDS)
def test_causality_from_gradients(backend, t, s, kwargs):
    allowed = expected_keep(t, s, is_causal=kwargs.get("is_causal", False),
                            window=kwargs.get("window"),
                            alignment=kwargs.get("causal_alignment", "top_left"))
    dk, dv = _dependence(backend, t, s, **kwargs)
    # d out_i / d v_j is the weight p_ij: exactly zero where masked, positive where allowed
    assert torch.equal(dv, allowed)
    # d out_i / d k_j is exactly zero where masked, and non-zero where allowed — except in a row
    # with a single key, whose weight is 1 whatever k is (its gradient is zero up to rounding)
    single = allowed.sum(-1, keepdim=True) == 1
    assert not dk[~allowed].any()
    assert dk[allowed & ~single].all()
