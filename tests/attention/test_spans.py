"""The spans path's own structure: which calls it plans, and that every way of cutting the work
(one band call, causal levels, fused documents, partial blocks at both ends of a span, calls cut
by the memory budget, keys split for decoding, 1/2/3 threads) gives the float64 answer.

The float64-exact reference tests of every mask live in test_blockwise.py (parametrised over
``impl``); here each case is run in float64 by spans and by the pure-torch path and compared to
float64's rounding (``tolerance.assert_agree``, the pure-torch path in float32 measuring that
rounding, factor 2 · FUSED_FACTOR for the fused kernel as in test_backends.py).
"""

from __future__ import annotations

import pytest
import torch

import qkv
import qkv.attention.spans as spans
from qkv.attention.blockwise import blockwise_attention
from qkv.masks import causal, document, sliding_window
from memory import backward_extra
from tolerance import FUSED_FACTOR, assert_agree


def tensors(b, h, h_kv, t, s, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(b, n, m, d, generator=g, dtype=torch.float64)
                 for n, m in ((h, t), (h_kv, s), (h_kv, s)))


def agree(bm, q, k, v, what, scale=0.3):
    """spans vs pure torch in float64: out, lse and the gradients of out and lse."""
    g = torch.Generator().manual_seed(7)
    dout = torch.randn(*q.shape[:-1], v.shape[-1], generator=g, dtype=torch.float64)
    dlse = torch.randn(*q.shape[:-1], generator=g, dtype=torch.float64)

    def run(fn, dtype):
        x = [a.to(dtype).requires_grad_() for a in (q, k, v)]
        out, lse = fn(*x, bm, scale=scale, enable_gqa=True)
        fin = torch.isfinite(lse)
        loss = (out * dout.to(dtype)).sum() + (torch.where(fin, lse, 0) * dlse.to(dtype)).sum()
        return (out.detach(), torch.where(fin, lse, 0).detach(), *torch.autograd.grad(loss, x))

    got = run(spans.spans_attention, torch.float64)
    want = run(blockwise_attention, torch.float64)
    low = run(blockwise_attention, torch.float32)
    for name, a, b, lo in zip(("out", "lse", "dq", "dk", "dv"), got, want, low):
        assert_agree(a, b, lo, factor=2 * FUSED_FACTOR, what=f"{what} {name}")


def test_a_window_is_one_call_for_its_interior_tiles():
    bm = qkv.create_block_mask(sliding_window(100, 0), None, None, 700, 700, block_size=32)
    calls = spans.plan(bm)
    assert calls[0].count == (700 // 32) - 4 and calls[0].keep.shape == (1, 1, 32, 132)
    assert all(c.count == 1 for c in calls[1:])  # the first tiles (span before key 0) and the ragged last
    agree(bm, *tensors(1, 4, 2, 700, 700, 8), "window")


def test_causal_is_the_diagonal_and_one_call_per_level():
    bm = qkv.create_block_mask(causal(), None, None, 1000, 1000, block_size=64)
    calls = spans.plan(bm)
    # diagonal (15 whole tiles + the ragged one), levels S = 64 … 512 (+ their ragged units)
    assert calls[0].causal and calls[0].count == 15 and calls[1].causal
    assert sorted({c.L for c in calls if not c.causal}) == [64, 128, 256, 512]
    assert len(calls) <= 2 + 2 * 4
    agree(bm, *tensors(1, 2, 1, 1000, 1000, 8), "causal")
    # bottom-right with t < s: the keys before the diagonal in one big-row call, then the same
    bm = qkv.create_block_mask(causal("bottom_right"), None, None, 300, 700, block_size=64)
    assert spans.plan(bm)[0].L == 400
    agree(bm, *tensors(1, 2, 1, 300, 700, 8), "causal bottom-right")


def test_documents_of_one_length_are_one_call():
    bm = qkv.create_block_mask(document(torch.arange(1024) // 256), None, None, 1024, 1024,
                               block_size=64)
    (call,) = spans.plan(bm)
    assert (call.count, call.n, call.L, call.q_step, call.k_step) == (4, 256, 256, 256, 256)
    agree(bm, *tensors(2, 2, 2, 1024, 1024, 8), "documents")


def test_a_span_crossing_partial_blocks_at_both_ends():
    """|i − j| ≤ 70 in tiles of 32: row 4's span is ◩ ◩ ■ ■ ■ ◩ ◩ — masked ends, unmasked middle."""
    bm = qkv.create_block_mask(lambda b, h, i, j: (i - j).abs() <= 70, None, None, 300, 300,
                               block_size=32)
    assert bm.kinds[0, 0, 4, 1:8].tolist() == [1, 1, 2, 2, 2, 1, 1]
    row = [c for c in spans.plan(bm) if c.q0 == 4 * 32]
    assert [c.keep is None for c in row] == [False, True, False]
    assert [(c.k0, c.L) for c in row] == [(32, 64), (96, 96), (192, 64)]
    agree(bm, *tensors(1, 4, 2, 300, 300, 8), "partial ends")


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_any_thread_count_gives_the_answer(threads):
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        for mod in (sliding_window(50, 0), causal(), document(torch.arange(400) // 130)):
            bm = qkv.create_block_mask(mod, None, None, 400, 400, block_size=32)
            agree(bm, *tensors(1, 1, 1, 400, 400, 8), f"{threads} threads {mod}")
    finally:
        torch.set_num_threads(before)


def test_calls_cut_by_the_memory_budget_give_the_same_answer(monkeypatch):
    monkeypatch.setattr(spans, "CALL_BYTES", 1)
    monkeypatch.setattr(spans, "BACKWARD_CALL_BYTES", 1)
    monkeypatch.setattr(spans, "MAX_CALL_BYTES", 1)  # not even thread balance adds a unit
    for mod in (sliding_window(40, 3), causal()):
        bm = qkv.create_block_mask(mod, None, None, 260, 260, block_size=16)
        agree(bm, *tensors(1, 4, 2, 260, 260, 8), f"one unit per call {mod}")


def test_inputs_in_a_models_layout_give_the_same_answer():
    """q, k, v as a model's attention passes them, (b, t, h, d) transposed to (b, h, t, d): read in
    place where b = 1, copied once where the batch and heads are not one stride (b = 2)."""
    bm = qkv.create_block_mask(sliding_window(40, 0), None, None, 300, 300, block_size=32)
    for b in (1, 2):
        q, k, v = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in tensors(b, 4, 2, 300, 300, 8))
        assert not q.is_contiguous()
        agree(bm, q, k, v, f"model layout b={b}")


def test_the_backward_holds_one_call_beyond_its_gradients(monkeypatch):
    """A window's backward at N and 4N, inputs in a model's layout: beyond dq, dk, dv it holds one
    call's temporaries (its budget, whatever N) and a float per row (lse) — no copy of q, k, v,
    out or dout, no (N × window) part. Before: 4 copies of the strided inputs, 64 MiB calls."""
    budget = 1 << 20
    monkeypatch.setattr(spans, "BACKWARD_CALL_BYTES", budget)
    monkeypatch.setattr(spans, "MAX_CALL_BYTES", budget)
    h, d, w = 4, 64, 256  # backward_extra's case
    extra = {n: backward_extra(spans.spans_forward, spans.spans_backward, n, h=h, d=d, window=w)
             for n in (2048, 8192)}
    # one call: its units' share of the budget; the kernel's per-thread scores (2 × 32 × 512
    # floats a thread) and the call's mask (64 × (w + 64)); lse with its −inf rows zeroed
    kernel = torch.get_num_threads() * 2 * 32 * 512 * 4 + 64 * (w + 64) * 4
    rows = h * 8192 * 4
    assert extra[8192] <= budget + kernel + rows + (64 << 10), extra
    assert extra[8192] - extra[2048] <= h * (8192 - 2048) * 4 * 2, extra  # grows by lse alone


def test_decoding_splits_long_spans_into_key_chunks(monkeypatch):
    monkeypatch.setattr(spans, "SPLIT_MIN_KEYS", 64)
    monkeypatch.setattr(spans, "SPLIT_KEYS", 50)
    q, k, v = tensors(1, 2, 1, 1, 600, 8)
    for mod in (causal(), document(torch.arange(600) // 250)):  # the last row of 600
        bm = qkv.create_block_mask(mod, None, None, 1, 600, block_size=64, q_offset=599)
        call = spans._split_keys(max(spans.plan(bm), key=lambda c: c.L), 1, 2)
        assert call.count > 1 and call.q_step == 0
        agree(bm, q, k, v, f"decode {mod}")


def test_nan_in_nan_out_and_empty_rows():
    q, k, v = tensors(1, 1, 1, 40, 40, 8)
    q[0, 0, 5, 2] = float("nan")
    bm = qkv.create_block_mask(sliding_window(3, 0), None, None, 40, 40, block_size=8)
    out, lse = spans.spans_forward(q, k, v, bm, scale=0.3)
    assert out[0, 0, 5].isnan().all() and lse[0, 0, 5].isnan()
    assert torch.isfinite(out[0, 0, 6:]).all() and torch.isfinite(out[0, 0, :5]).all()
    bm = qkv.create_block_mask(lambda b, h, i, j: (j < i) & (i != 20), None, None, 40, 40, block_size=8)
    out, lse = spans.spans_forward(q.nan_to_num(), k, v, bm, scale=0.3)
    assert torch.isneginf(lse[0, 0, [0, 20]]).all() and (out[0, 0, [0, 20]] == 0).all()


def test_a_decoding_row_checks_the_keys_it_visits_for_nan():
    """Only the visited keys are checked (the rest of a long cache is never read): a NaN inside
    the window makes the row NaN, one outside it changes nothing."""
    q, k, v = tensors(1, 2, 2, 1, 600, 8)
    bm = qkv.create_block_mask(sliding_window(50, 0), None, None, 1, 600, block_size=64, q_offset=599)
    clean, _ = spans.spans_forward(q, k, v, bm, scale=0.3)
    k[0, 0, 580, 3] = float("nan")  # inside the window of row 599: head 0 sees it
    out, lse = spans.spans_forward(q, k, v, bm, scale=0.3)
    assert out[0, 0].isnan().all() and lse[0, 0].isnan().all() and torch.equal(out[0, 1], clean[0, 1])
    k[0, 0, 580] = tensors(1, 2, 2, 1, 600, 8)[1][0, 0, 580]  # clean again
    k[0, 1, 10, 0] = float("nan")  # far outside the window
    out, _ = spans.spans_forward(q, k, v, bm, scale=0.3)
    assert torch.equal(out, clean)


def test_the_backend_falls_back_to_pure_torch_where_the_kernel_cannot():
    """A value head size unlike the query's (the kernel needs one size) still answers."""
    q, k, _ = tensors(1, 2, 2, 70, 70, 8)
    v = torch.randn(1, 2, 70, 5, dtype=torch.float64)
    assert not spans.supports(q, k, v)
    got = qkv.scaled_dot_product_attention(q, k, v, window=(9, 0), is_causal=True, backend="blockwise")
    want = qkv.scaled_dot_product_attention(q, k, v, window=(9, 0), is_causal=True, backend="reference")
    low = qkv.scaled_dot_product_attention(q.float(), k.float(), v.float(), window=(9, 0),
                                           is_causal=True, backend="reference")
    assert_agree(got, want, low, what="dv != d")
