"""Causal and sliding-window masks: their definition, how they combine, and causality proven
from gradients (flax's test): output row i must not depend on any key or value it may not see.

The expected masks are built here by looping over (i, j) with the definition ``p_i = i + offset``
(``offset = s - t`` for bottom-right alignment) and ``p_i - left <= j <= p_i + right``.

Also the :class:`AttentionMask` description (materialised against a definition written out by
hand), packed sequences (:class:`VarLen`: the fused grid path, the reference path and separate
calls per sequence), a score ``bias`` kept apart from the mask, and the checks that name bad values.
Tolerances: :func:`tolerance.assert_within` against fp64 (``FUSED_FACTOR`` for torch's kernel);
results compared with ``torch.equal`` where the same operations run on the same numbers.
"""

from __future__ import annotations

import itertools
import math
import re

import pytest
import torch

import qkv
from qkv.attention import AttentionMask, VarLen, padding_mask, structural_mask
from qkv.attention.block_mask import band_sides, block_mask_for
from qkv.attention.attention_mask import as_additive, combine, combine_masks, evaluate
from qkv.attention.backends import backends_with
from tolerance import FUSED_FACTOR, assert_agree, assert_within

# every registered backend that takes any mask, bias and dropout (its declared capabilities)
BACKENDS = (*backends_with(dense_mask=True, bias=True, dropout=True), "auto")


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

    low = qkv.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=keep,
                                           backend="reference")
    factor = 4.0 if backend == "reference" else 2 * FUSED_FACTOR  # both sides round (×2)
    assert_agree(out_bool, want, low, factor=factor, what="bool")
    assert_agree(out_float, want, low, factor=factor, what="float")


@pytest.mark.parametrize("backend", BACKENDS)
def test_is_causal_with_a_window_is_the_window_closed_on_the_right(backend):
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, n, 8, generator=gen, dtype=torch.float64) for n in (6, 9, 9))
    both = qkv.scaled_dot_product_attention(q, k, v, is_causal=True, window=(2, 4),
                                            causal_alignment="bottom_right", backend=backend)
    window = qkv.scaled_dot_product_attention(q, k, v, window=(2, 0),
                                              causal_alignment="bottom_right", backend=backend)
    # exact: both materialise the same (t, s) bool mask and call the same kernel with it
    assert torch.equal(both, window)


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


# -- the description: AttentionMask.materialize against its definition ------------------------------

def materialized_by_hand(b, h, t, s, *, causal=False, alignment="top_left", window=None,
                         key_padding=None, dense=None, sequence=None):
    """(b, h, t, s): the AttentionMask docstring, one (b, h, i, j) at a time.

    Keep key j for query i when the structure allows it (``expected_keep``), the key is real
    (``key_padding[b, j]``), the dense bool mask allows it, and both are in the same packed
    sequence (``sequence[i] == sequence[j]``). A float ``dense`` gives its value where kept and
    −inf elsewhere; otherwise the result is bool.
    """
    structure = expected_keep(t, s, is_causal=causal, window=window, alignment=alignment)
    floats = dense is not None and dense.is_floating_point()
    out = torch.zeros(b, h, t, s, dtype=torch.float64 if floats else torch.bool)
    for bi, hi, i, j in itertools.product(range(b), range(h), range(t), range(s)):
        keep = bool(structure[i, j])
        keep = keep and (key_padding is None or bool(key_padding[bi, j]))
        keep = keep and (sequence is None or sequence[i] == sequence[j])
        d = None if dense is None else dense.expand(b, h, t, s)[bi, hi, i, j]
        if floats:
            out[bi, hi, i, j] = d if keep else -math.inf
        else:
            out[bi, hi, i, j] = keep and (d is None or bool(d))
    return out


def _materialize_cases():
    gen = torch.Generator().manual_seed(5)
    b, t, s = 2, 4, 6
    pad = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    dense_bool = torch.rand(b, 1, t, s, generator=gen) > 0.3
    dense_float = torch.randn(t, s, generator=gen, dtype=torch.float64)
    yield "causal", dict(causal=True)
    yield "causal_bottom_right", dict(causal=True, alignment="bottom_right")
    yield "window", dict(window=(1, 2))
    yield "causal_window_bottom_right", dict(causal=True, window=(2, None), alignment="bottom_right")
    yield "padding", dict(key_padding=pad)
    yield "dense_bool", dict(dense=dense_bool)
    yield "dense_float", dict(dense=dense_float)
    yield "everything_bool", dict(causal=True, window=(1, None), alignment="bottom_right",
                                  key_padding=pad, dense=dense_bool)
    yield "everything_float", dict(causal=True, key_padding=pad, dense=dense_float)


MATERIALIZE_CASES = list(_materialize_cases())


@pytest.mark.parametrize("fields", [c[1] for c in MATERIALIZE_CASES], ids=[c[0] for c in MATERIALIZE_CASES])
def test_materialize_follows_the_definition(fields):
    b, h, t, s = 2, 3, 4, 6
    got = AttentionMask(**fields).materialize(t, s)
    want = materialized_by_hand(b, h, t, s, **fields)
    assert got.dtype == want.dtype
    assert torch.equal(torch.broadcast_to(got, (b, h, t, s)), want)


def test_materialize_packed_sequences_is_block_diagonal_within_each():
    vl = VarLen.from_lengths([3, 1, 4])
    sequence = vl.sequence.tolist()  # [0, 0, 0, 1, 2, 2, 2, 2]
    assert sequence == [0, 0, 0, 1, 2, 2, 2, 2]
    for fields in (dict(), dict(causal=True), dict(window=(1, 1)), dict(causal=True, window=(2, None))):
        got = AttentionMask(varlen=vl, **fields).materialize(8, 8)
        want = materialized_by_hand(1, 1, 8, 8, sequence=sequence, **fields)[0, 0]
        assert torch.equal(got, want), fields


# -- one meaning: the description compiles to one mask_mod ------------------------------------------

def _description_cases():
    pad = torch.tensor([[True] * 8 + [False] * 3, [True] * 11, [False] * 2 + [True] * 9])  # (3, 11)
    sequence = [0] * 4 + [1] * 2 + [2] * 5  # packed lengths 4, 2, 5 (N = 11)
    for causal_, window, alignment in itertools.product(
            (False, True), (None, (2, None), (None, 1), (1, 3), (0, 0)), ("top_left", "bottom_right")):
        name = f"causal={causal_} window={window} {alignment}"
        if causal_ or window is not None:  # nothing at all: test_an_empty_description_…
            yield name, dict(causal=causal_, window=window, alignment=alignment), (7, 11)
        yield name + " padding", dict(causal=causal_, window=window, alignment=alignment,
                                      key_padding=pad), (7, 11)
        if alignment == "top_left":  # packed sequences are self-attention (t = s = N)
            yield name + " packed", dict(causal=causal_, window=window,
                                         varlen=VarLen.from_lengths([4, 2, 5])), (11, 11)
    yield "padding only", dict(key_padding=pad), (11, 11)
    yield "packed only", dict(varlen=VarLen.from_lengths([4, 2, 5])), (11, 11)
    assert sequence == VarLen.from_lengths([4, 2, 5]).sequence.tolist()


DESCRIPTION_CASES = list(_description_cases())


def _by_hand(fields, t, s):
    """(b', t, s) bool from the docstring's definition (``materialized_by_hand``)."""
    pad = fields.get("key_padding")
    vl = fields.get("varlen")
    by_hand = materialized_by_hand(
        pad.shape[0] if pad is not None else 1, 1, t, s, causal=fields.get("causal", False),
        alignment=fields.get("alignment", "top_left"), window=fields.get("window"), key_padding=pad,
        sequence=vl.sequence.tolist() if vl is not None else None)
    return by_hand[:, 0]  # (b', t, s)


@pytest.mark.parametrize("fields, size", [c[1:] for c in DESCRIPTION_CASES], ids=[c[0] for c in DESCRIPTION_CASES])
def test_the_compiled_mask_mod_is_the_description(fields, size):
    """Every way of reading the description asks its one mask_mod: evaluated densely it is the
    definition; ``materialize`` is it; the blockwise backend's block kinds are its blocks'."""
    t, s = size
    mask = AttentionMask(**fields)
    want = _by_hand(fields, t, s)  # (b', t, s)
    dense = evaluate(mask.mask_mod, t, s)  # (B', t | 1, s) or (t, s)
    assert torch.equal(torch.broadcast_to(dense, want.shape), want)
    assert torch.equal(torch.broadcast_to(mask.materialize(t, s)[..., 0, :, :] if mask.key_padding is not None
                                          else mask.materialize(t, s), want.shape), want)
    for bs in (1, 3, 4):
        bm = block_mask_for(mask, want.shape[0], 2, t, s, block_size=bs)
        truth = torch.stack([kinds_of(w, bs) for w in want])  # (b', nq, nk)
        got = bm.kinds[:, 0].expand(truth.shape)
        # never wrong: FULL exactly where every entry takes part (AND of parts: all full), and
        # EMPTY only where none does; two partial parts whose kept entries miss each other (a
        # band edge beside padding) make an empty block that bounds alone call PARTIAL
        differ = got != truth
        assert ((got[differ] == 1) & (truth[differ] == 0)).all(), bs
        if mask.key_padding is None:  # a band with sorted packed ids: exact from bounds
            assert not differ.any(), bs
    if mask.structural and mask.key_padding is None and mask.varlen is None:
        assert torch.equal(structural_mask(t, s, is_causal=mask.causal, window=mask.window,
                                           causal_alignment=mask.alignment), want[0])


def kinds_of(keep: torch.Tensor, bs: int) -> torch.Tensor:
    """(t, s) bool → (nq, nk) block kinds counted entry by entry (0 empty, 1 partial, 2 full)."""
    t, s = keep.shape
    nq, nk = -(-t // bs), -(-s // bs)
    out = torch.empty(nq, nk, dtype=torch.int8)
    for r, c in itertools.product(range(nq), range(nk)):
        tile = keep[r * bs:(r + 1) * bs, c * bs:(c + 1) * bs]
        out[r, c] = 2 if tile.all() else 0 if not tile.any() else 1
    return out


def test_the_band_rule_is_one_function():
    """causal ∩ window: the window closed on the right at the diagonal, wherever it is asked."""
    for causal_, window in itertools.product((False, True), (None, (None, None), (3, 5), (2, None),
                                                              (None, -1), (0, 0))):
        left, right = window if window is not None else (None, None)
        want = (left, (0 if right is None else min(right, 0)) if causal_ else right)
        assert band_sides(causal_, window) == want
        mask = AttentionMask(causal=causal_, window=window)
        band = mask.band
        assert (band.left, band.right) == want if band is not None else want == (None, None)
        assert mask.structural == (want != (None, None))


def test_a_block_masks_mask_mod_is_the_descriptions():
    bm = qkv.create_block_mask(qkv.masks.document([0, 0, 1, 1, 1]), None, None, 5, 5, block_size=2)
    assert AttentionMask(block=bm).mask_mod is bm.mask_mod
    assert AttentionMask().mask_mod is None


def test_an_empty_description_materializes_to_nothing():
    mask = AttentionMask()
    assert mask.empty and not mask.structural and mask.materialize(3, 4) is None
    assert not AttentionMask(causal=True).empty and AttentionMask(causal=True).structural
    assert AttentionMask(window=(None, None)).empty  # unbounded on both sides: no structure


def test_key_padding_is_placed_in_front_of_the_heads():
    pad = torch.tensor([[True, False, True]])  # (b, s)
    assert AttentionMask(key_padding=pad).padding_for(4).shape == (1, 1, 1, 3)  # (b, h, t, s)
    assert AttentionMask(key_padding=pad).padding_for(2).shape == (1, 1, 3)  # (t, s) scores


def test_combine_and_as_additive_follow_the_one_rule():
    keep = torch.tensor([True, False, True])
    other = torch.tensor([True, True, False])
    floats = torch.tensor([0.5, -1.0, 2.0])
    assert combine(keep, other).tolist() == [True, False, False]
    assert combine(floats, keep).tolist() == [0.5, -math.inf, 2.0]
    assert combine(floats, floats, keep, other).tolist() == [1.0, -math.inf, -math.inf]
    assert combine(None, None) is None
    assert as_additive(keep, torch.float32).tolist() == [0.0, -math.inf, 0.0]
    assert as_additive(floats, torch.float64).dtype == torch.float64
    assert as_additive(None, torch.float32) is None


# -- VarLen ----------------------------------------------------------------------------------------

def test_varlen_fields_follow_their_definitions():
    lengths = [3, 1, 4]
    vl = VarLen.from_lengths(lengths)
    assert vl.lengths == (3, 1, 4) and vl.total == 8 and vl.max_len == 4
    assert vl.cu_seqlens.tolist() == [0, 3, 4, 8]
    assert vl.sequence.tolist() == [n for n, length in enumerate(lengths) for _ in range(length)]
    assert vl.position.tolist() == [p for length in lengths for p in range(length)]
    # index: row of each token in the (n · max_len) grid = sequence · max_len + position
    assert vl.index.tolist() == [0, 1, 2, 4, 8, 9, 10, 11]
    assert vl.real.int().tolist() == [[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]]
    again = VarLen.from_cu_seqlens(torch.tensor([0, 3, 4, 8]))
    for name in ("cu_seqlens", "sequence", "position", "index", "real"):
        assert torch.equal(getattr(again, name), getattr(vl, name)), name


@pytest.mark.parametrize("lengths", [[3, 0, 2], [], [2, -1]], ids=["zero", "none", "negative"])
def test_varlen_refuses_empty_sequences_naming_the_lengths(lengths):
    with pytest.raises(ValueError, match=re.escape(f"must be >= 1 and at least one, got {lengths}")):
        VarLen.from_lengths(lengths)


@pytest.mark.parametrize("cu", [torch.tensor([1, 3]), torch.tensor([0.0, 3.0]), torch.tensor([0]),
                                torch.tensor([[0, 3]])], ids=["start", "float", "short", "2-D"])
def test_varlen_refuses_bad_cu_seqlens_naming_them(cu):
    with pytest.raises(ValueError, match=r"cu_seqlens must be a 1-D integer tensor .*got tensor"):
        VarLen.from_cu_seqlens(cu)


def _per_sequence_truth(q, k, v, vl, *, causal, window, groups):
    """Each packed sequence attended on its own, in fp64, from the definitions above."""
    outs = []
    for start, end in zip(vl.cu_seqlens[:-1].tolist(), vl.cu_seqlens[1:].tolist()):
        n = end - start
        keep = expected_keep(n, n, is_causal=causal, window=window)
        qi, ki, vi = (x[..., start:end, :].double() for x in (q, k, v))
        if groups > 1:
            ki, vi = ki.repeat_interleave(groups, dim=-3), vi.repeat_interleave(groups, dim=-3)
        scores = (qi @ ki.transpose(-2, -1)) / math.sqrt(q.shape[-1])
        outs.append(torch.softmax(scores.masked_fill(~keep, -math.inf), dim=-1) @ vi)
    return torch.cat(outs, dim=-2)


VARLEN_CASES = [
    ("plain", dict(), (2, 4, 2)),
    ("causal", dict(causal=True), (1, 2, 2)),
    ("window", dict(window=(2, 1)), (2, 4, 1)),
    ("causal_window", dict(causal=True, window=(3, None)), (1, 4, 4)),
    ("rank_3", dict(causal=True), (None, 2, 2)),
]


@pytest.mark.parametrize("fields, shape", [c[1:] for c in VARLEN_CASES], ids=[c[0] for c in VARLEN_CASES])
def test_packed_sequences_equal_separate_calls_per_sequence(fields, shape):
    """The fused grid path, the reference path and one qkv call per sequence all give each
    sequence the attention it has alone (awkward lengths, one of a single token)."""
    batch, h, h_kv = shape
    vl = VarLen.from_lengths([5, 1, 13, 7])
    lead = () if batch is None else (batch,)
    gen = torch.Generator().manual_seed(6)
    q = torch.randn(*lead, h, vl.total, 16, generator=gen)
    k, v = (torch.randn(*lead, h_kv, vl.total, 16, generator=gen) for _ in range(2))
    gqa = dict(enable_gqa=h != h_kv)
    truth = _per_sequence_truth(q, k, v, vl, causal=fields.get("causal", False),
                                window=fields.get("window"), groups=h // h_kv)
    # the plain path: separate calls, one sequence at a time, with the reference backend
    separate = []
    for start, end in zip(vl.cu_seqlens[:-1].tolist(), vl.cu_seqlens[1:].tolist()):
        qi, ki, vi = (x[..., start:end, :] for x in (q, k, v))
        separate.append(qkv.scaled_dot_product_attention(
            qi, ki, vi, is_causal=fields.get("causal", False), window=fields.get("window"),
            backend="reference", **gqa))
    plain = torch.cat(separate, dim=-2)
    mask = AttentionMask(varlen=vl, **fields)
    for backend, factor in (("reference", 2.0), ("fused", FUSED_FACTOR), ("auto", FUSED_FACTOR)):
        out = qkv.scaled_dot_product_attention(q, k, v, mask=mask, backend=backend, **gqa)
        assert out.shape == q.shape
        assert_within(out, truth, plain, factor=factor, what=backend)


def test_packed_sequences_through_the_trace():
    vl = VarLen.from_lengths([2, 3])
    gen = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 2, 5, 4, generator=gen) for _ in range(3))
    tr = qkv.attention_trace(q, k, v, mask=AttentionMask(varlen=vl, causal=True))
    within = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 1, 1, 0],
                           [0, 0, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(tr.weights[0, 0] > 0, within)
    assert torch.equal(tr.output, qkv.scaled_dot_product_attention(
        q, k, v, mask=AttentionMask(varlen=vl, causal=True), backend="reference"))


# -- a score bias, apart from the mask -------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_a_bias_equals_the_same_numbers_given_as_a_float_mask(backend):
    """``bias=`` (ALiBi) is added to the scores like a float ``attn_mask``: the same outputs, only
    the trace keeps it apart. Exact: the same additions on the same numbers (bias first, then the
    mask's 0 / −inf), and the fused backend hands torch the very same float mask."""
    gen = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(2, 3, n, 8, generator=gen) for n in (5, 7, 7))
    bias = torch.randn(3, 5, 7, generator=gen)  # (h, t, s)
    pad = torch.tensor([[True] * 7, [True] * 5 + [False] * 2])
    keep = expected_keep(5, 7, is_causal=True, alignment="bottom_right") & pad[:, None, None, :]
    folded = bias.masked_fill(~keep, -math.inf)  # (b, h, t, s)
    apart = qkv.scaled_dot_product_attention(q, k, v, bias=bias, is_causal=True,
                                             causal_alignment="bottom_right", key_padding_mask=pad,
                                             backend=backend)
    together = qkv.scaled_dot_product_attention(q, k, v, attn_mask=folded, backend=backend)
    assert torch.equal(apart, together)


def test_the_trace_keeps_bias_and_mask_apart():
    gen = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(2, 3, n, 8, generator=gen) for n in (5, 7, 7))
    bias = torch.randn(3, 5, 7, generator=gen)
    pad = torch.tensor([[True] * 7, [True] * 5 + [False] * 2])
    tr = qkv.attention_trace(q, k, v, bias=bias, is_causal=True, causal_alignment="bottom_right",
                             key_padding_mask=pad)
    keep = expected_keep(5, 7, is_causal=True, alignment="bottom_right") & pad[:, None, None, :]
    assert torch.equal(tr.bias, bias)
    assert torch.equal(torch.broadcast_to(tr.mask, (2, 3, 5, 7)),
                       as_additive(keep, torch.float32).expand(2, 3, 5, 7))
    additive = tr.additive()
    assert additive.shape == (2, 3, 5, 7)
    assert torch.equal(additive, bias + as_additive(keep, torch.float32))
    # exact: masked is (scaled + bias) + mask, and the mask only adds 0 or −inf
    assert torch.equal(tr.scaled + additive, tr.masked)
    # rows kept: the trace's other fields hold what a float attn_mask would have given
    folded = qkv.attention_trace(q, k, v, attn_mask=bias.masked_fill(~keep, -math.inf))
    assert folded.bias is None
    assert torch.equal(tr.weights, folded.weights) and torch.equal(tr.output, folded.output)
    sub = tr.select_rows(torch.tensor([4, 1]))
    assert torch.equal(sub.bias, bias[:, [4, 1]]) and torch.equal(sub.additive(), additive[..., [4, 1], :])


def test_key_padding_mask_equals_the_same_padding_as_an_attn_mask():
    gen = torch.Generator().manual_seed(10)
    q, k, v = (torch.randn(2, 3, n, 8, generator=gen) for n in (5, 7, 7))
    pad = torch.tensor([[True] * 7, [False] * 2 + [True] * 5])
    for backend in BACKENDS:  # exact: the same (b, 1, 1, s) bool mask reaches the same kernel
        assert torch.equal(
            qkv.scaled_dot_product_attention(q, k, v, key_padding_mask=pad, backend=backend),
            qkv.scaled_dot_product_attention(q, k, v, attn_mask=pad[:, None, None, :], backend=backend))


# -- bad descriptions are named ---------------------------------------------------------------------

def _bad_mask_calls():
    q = torch.randn(2, 4, 5, 8)
    kv = torch.randn(2, 4, 6, 8)
    ok = dict(query=q, key=kv, value=kv)
    vl = VarLen.from_lengths([2, 3])
    square = torch.randn(2, 4, 5, 8)
    packed = dict(query=square, key=square, value=square)
    yield "key_padding shape", dict(ok, key_padding_mask=torch.ones(2, 5, dtype=torch.bool)), \
        r"key_padding_mask must be a bool tensor of shape \(\.\.\., s\) = \(2, 6\).*got \(2, 5\)"
    yield "key_padding dtype", dict(ok, key_padding_mask=torch.ones(2, 6)), \
        r"key_padding_mask must be a bool tensor.*got \(2, 6\)"
    yield "bias shape", dict(ok, bias=torch.zeros(3, 5, 6)), \
        r"bias of shape \(3, 5, 6\) does not broadcast to the scores' shape \(2, 4, 5, 6\)"
    yield "bias dtype", dict(ok, bias=torch.zeros(5, 6, dtype=torch.long)), \
        "bias must be a floating-point tensor, got torch.int64"
    yield "mask type", dict(ok, mask=torch.ones(5, 6, dtype=torch.bool)), \
        "mask must be a qkv.attention.AttentionMask, got Tensor"
    yield "mask and is_causal", dict(ok, mask=AttentionMask(), is_causal=True), \
        r"pass either mask=AttentionMask\(\.\.\.\) or attn_mask"
    yield "mask and key_padding", dict(ok, mask=AttentionMask(), key_padding_mask=torch.ones(2, 6, dtype=torch.bool)), \
        r"pass either mask=AttentionMask\(\.\.\.\) or attn_mask"
    yield "alignment", dict(ok, mask=AttentionMask(causal=True, alignment="middle")), \
        r"mask.alignment must be one of \('top_left', 'bottom_right'\), got 'middle'"
    yield "varlen length", dict(packed, mask=AttentionMask(varlen=VarLen.from_lengths([2, 4]))), \
        r"packed sequences \(mask.varlen\) of 6 tokens need t = s = 6, got t=5, s=5"
    yield "varlen and padding", dict(packed, mask=AttentionMask(varlen=vl, key_padding=torch.ones(2, 5, dtype=torch.bool))), \
        "packed sequences .* take no dense mask, key padding or bias"
    yield "varlen and bias", dict(packed, mask=AttentionMask(varlen=vl), bias=torch.zeros(5, 5)), \
        "packed sequences .* take no dense mask, key padding or bias"


BAD_MASK_CALLS = list(_bad_mask_calls())


@pytest.mark.parametrize("kwargs, message", [c[1:] for c in BAD_MASK_CALLS], ids=[c[0] for c in BAD_MASK_CALLS])
@pytest.mark.parametrize("fn", [qkv.scaled_dot_product_attention, qkv.attention_trace], ids=["sdpa", "trace"])
def test_bad_masks_raise_value_errors_naming_them(fn, kwargs, message):
    with pytest.raises(ValueError, match=message):
        fn(**kwargs)


@pytest.mark.parametrize("mask", [AttentionMask(causal=True), AttentionMask(causal=True, window=(2, None)),
                                  AttentionMask(causal=True, alignment="bottom_right"),
                                  AttentionMask(key_padding=torch.tensor([[True] * 5 + [False] * 2] * 2),
                                                causal=True)])
def test_materialize_rows_are_the_whole_masks_rows(mask):
    """materialize(rows=...) draws the rows asked for only: exactly those rows of the whole mask."""
    t, s, rows = 5, 7, torch.tensor([4, 0, 2])
    whole = mask.materialize(t, s)
    picked = mask.materialize(t, s, rows=rows)
    assert torch.equal(picked, whole if whole.shape[-2] == 1 else whole.index_select(-2, rows))


def test_materialize_rows_refuses_a_dense_mask():
    with pytest.raises(ValueError, match="rows="):
        AttentionMask(dense=torch.ones(3, 3, dtype=torch.bool)).materialize(3, 3, rows=torch.tensor([1]))
