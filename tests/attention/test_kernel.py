"""qkv's C++ forward and backward for interval masks (:mod:`qkv.attention.kernels`) against the
float64 answer, with the error the pure-torch path makes in float32 as the yardstick, and against
the spans path.

The kernel's exp is a polynomial within 2 ulp and it normalises by a rounded reciprocal, like
torch's fused kernel, so it gets that kernel's factor (``tolerance.FUSED_FACTOR``) over the plain
float32 path (:func:`qkv.attention.blockwise.blockwise_attention`). Its gradients are float64
autograd's through the readable reference (:func:`qkv.attention.reference.reference_attention`
on the materialised mask), the yardstick that same autograd in float32; they inherit the
forward's error through D = rowsum(dO ∘ O) and P = exp(S − lse) and add the backward's own
exp, hence 2 × FUSED_FACTOR. Skipped only where set-up did not build the kernel (no C++ compiler).
"""

from __future__ import annotations

import pytest
import torch

import qkv
from qkv.attention import kernels
from qkv.attention.blockwise import blockwise_attention
from qkv.attention.spans import spans_attention, spans_backward, spans_forward
from qkv.masks import and_masks, causal, document, sliding_window
from memory import backward_extra
from tolerance import FUSED_FACTOR, assert_within, attention_reference

pytestmark = pytest.mark.skipif(
    kernels.load() is None,
    reason="qkv's C++ kernel is not built here (make setup builds it: python -m qkv.attention.kernels.build)")


def tensors(b, h, t, s, d, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(b, h, n, d, generator=g, dtype=dtype) for n in (t, s, s))


def uneven_documents(n):
    lengths = [50, 113, 1, 77]
    ids = torch.cat([torch.full((x,), i) for i, x in enumerate(lengths)])
    return torch.cat([ids, torch.full((n - len(ids),), len(lengths))])[:n]


MASKS = {  # name: (mask_mod, t, s)
    "window": (sliding_window(37, 0), 203, 203),
    "two-sided window": (sliding_window(20, 9), 203, 203),
    "window, bottom-right, t < s": (sliding_window(30, 0, "bottom_right"), 113, 203),
    "window, rows with no key (t > s)": (sliding_window(30, 0, "bottom_right"), 203, 113),
    "documents": (document(uneven_documents(300)), 300, 300),
    "documents ∩ causal": (and_masks(document(uneven_documents(300)), causal()), 300, 300),
    "documents ∩ window": (and_masks(document(uneven_documents(300)), sliding_window(40, 0)), 300, 300),
}


@pytest.mark.parametrize("block_k", [kernels.BLOCK_K, 40])  # 40: spans in several chunks (online softmax)
@pytest.mark.parametrize("name", MASKS)
def test_the_kernel_is_as_exact_as_the_pure_path(name, block_k, monkeypatch):
    monkeypatch.setattr(kernels, "BLOCK_K", block_k)
    mod, t, s = MASKS[name]
    bm = qkv.create_block_mask(mod, None, None, t, s, block_size=32)
    q, k, v = tensors(2, 4, t, s, 64)
    x32 = [a.float() for a in (q, k, v)]
    assert kernels.intervals(bm) is not None and kernels.can_run(*x32, bm)
    out, lse = kernels.kernel_forward(*x32, bm, scale=0.125)  # (2, 4, t, 64), (2, 4, t)
    ref, ref_lse = blockwise_attention(q, k, v, bm, scale=0.125)  # float64
    plain, plain_lse = blockwise_attention(*x32, bm, scale=0.125)
    seen = torch.isfinite(ref_lse)
    assert torch.equal(torch.isneginf(lse), ~seen)  # rows with no key: lse −inf …
    assert not out[~seen].any()  # … and output 0
    assert_within(out, ref, plain, factor=FUSED_FACTOR, what=f"{name} out")
    assert_within(lse, ref_lse, plain_lse, factor=FUSED_FACTOR, where=seen, what=f"{name} lse")
    spans_out, _ = spans_forward(*x32, bm, scale=0.125)  # the path it replaces: the same answer
    assert_within(out, ref, spans_out, factor=2 * FUSED_FACTOR, what=f"{name} out vs spans")


@pytest.mark.parametrize("mod, t, s", [
    (sliding_window(37, 0), 203, 203),  # the last tile's span of 47 keys widened to 48 leftwards
    (sliding_window(3, 0, "bottom_right"), 150, 5),  # 5 keys (< 16: the whole of them); tiles with none
])
def test_widened_spans_and_keyless_tiles_write_every_output_row(mod, t, s):
    """The forward widens a tile's span to a multiple of 16 keys within [0, s) and writes out
    without zeroing it first: rows of a keyless tile must be 0 even where the memory held NaN."""
    bm = qkv.create_block_mask(mod, None, None, t, s, block_size=32)
    q, k, v = tensors(2, 4, t, s, 64, seed=3)
    x32 = [a.float() for a in (q, k, v)]
    ref, ref_lse = blockwise_attention(q, k, v, bm, scale=0.125)  # float64
    plain, plain_lse = blockwise_attention(*x32, bm, scale=0.125)
    seen = torch.isfinite(ref_lse)
    for _ in range(4):  # freed NaN memory of out's size: the allocator often hands it back
        garbage = torch.full((2, 4, t, 64), float("nan"))
        del garbage
        out, lse = kernels.kernel_forward(*x32, bm, scale=0.125)  # (2, 4, t, 64), (2, 4, t)
        assert not out[~seen].any() and torch.isneginf(lse[~seen]).all()
        assert_within(out, ref, plain, factor=FUSED_FACTOR, what="out")
        assert_within(lse, ref_lse, plain_lse, factor=FUSED_FACTOR, where=seen, what="lse")


def reference_grads(q, k, v, bm, dout, dlse, *, scale, dtype):
    """(dq, dk, dv) of `tolerance.attention_reference` in ``dtype``."""
    return attention_reference(q, k, v, bm, dout, dlse, scale=scale, dtype=dtype)[2:]


def uneven_ids(b, n):  # (b, n): each batch row its own documents
    return torch.stack([uneven_documents(n), torch.arange(n) // 100][:b])


GRAD_CASES = {  # name: (mask_mod, t, s, batch, key heads, with dlse)
    "window": (sliding_window(37, 0), 203, 203, 2, 4, True),
    "causal ∩ two-sided window": (and_masks(causal(), sliding_window(20, 9)), 203, 203, 1, 4, True),
    "documents": (document(uneven_documents(300)), 300, 300, 1, 4, True),
    "documents ∩ causal, grouped heads": (and_masks(document(uneven_documents(300)), causal()),
                                          300, 300, 2, 2, True),
    "documents per batch row ∩ window": (and_masks(document(uneven_ids(2, 260)), sliding_window(60, 0)),
                                         260, 260, 2, 2, True),
    "rows with no key (t > s)": (sliding_window(30, 0, "bottom_right"), 203, 113, 1, 4, False),
}


@pytest.mark.parametrize("block_k", [kernels.BLOCK_K, 40])  # 40: spans in several chunks
@pytest.mark.parametrize("name", GRAD_CASES)
def test_the_kernels_gradients_are_float64s(name, block_k, monkeypatch):
    monkeypatch.setattr(kernels, "BLOCK_K", block_k)
    monkeypatch.setattr(kernels, "BACKWARD_BLOCK_K", block_k)
    mod, t, s, b, h_kv, with_dlse = GRAD_CASES[name]
    bm = qkv.create_block_mask(mod, b if "batch row" in name else None, None, t, s, block_size=32)
    gen = torch.Generator().manual_seed(len(name))
    q = torch.randn(b, 4, t, 64, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(b, h_kv, s, 64, generator=gen, dtype=torch.float64) for _ in range(2))
    dout = torch.randn(b, 4, t, 64, generator=gen, dtype=torch.float64)
    dlse = torch.randn(b, 4, t, generator=gen, dtype=torch.float64) if with_dlse else None
    x32 = [a.float() for a in (q, k, v)]
    gqa = dict(scale=0.125, enable_gqa=h_kv < 4)
    out, lse = kernels.kernel_forward(*x32, bm, **gqa)  # (b, 4, t, 64), (b, 4, t)
    d32 = None if dlse is None else dlse.float()
    got = kernels.kernel_backward(*x32, out, dout.float(), lse, bm, dlse=d32, **gqa)
    ref = reference_grads(q, k, v, bm, dout, dlse, scale=0.125, dtype=torch.float64)
    plain = reference_grads(q, k, v, bm, dout, dlse, scale=0.125, dtype=torch.float32)
    spans = spans_backward(*x32, out, dout.float(), lse, bm, dlse=d32, **gqa)  # the path it replaces
    for i, name_i in enumerate("qkv"):
        assert_within(got[i], ref[i], plain[i], factor=2 * FUSED_FACTOR, what=f"{name} d{name_i}")
        assert_within(got[i], ref[i], spans[i], factor=2 * FUSED_FACTOR, what=f"{name} d{name_i} vs spans")
    empty = torch.isneginf(lse)
    if empty.any():  # rows with no key: dq 0, as spans gives
        assert not got[0][empty].any() and not spans[0][empty].any()


def test_kernel_attention_trains_through_the_kernels_backward():
    bm = qkv.create_block_mask(sliding_window(50, 0), None, None, 257, 257, block_size=64)
    q, k, v = tensors(1, 4, 257, 257, 32, seed=1)
    dout = torch.randn(1, 4, 257, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(2))

    def grads(fn, dtype):
        x = [a.to(dtype).requires_grad_() for a in (q, k, v)]
        out, lse = fn(*x, bm, scale=0.2)
        return torch.autograd.grad((out * dout.to(dtype)).sum() + lse.sum(), x)

    got = grads(kernels.kernel_attention, torch.float32)
    ref, plain = grads(blockwise_attention, torch.float64), grads(blockwise_attention, torch.float32)
    for name, g, r, p in zip("qkv", got, ref, plain):
        assert_within(g, r, p, factor=2 * FUSED_FACTOR, what=f"d{name}")
    x32 = [a.float() for a in (q, k, v)]  # the same numbers as kernel_backward called directly
    out, lse = kernels.kernel_forward(*x32, bm, scale=0.2)
    direct = kernels.kernel_backward(*x32, out, dout.float(), lse, bm, scale=0.2, dlse=torch.ones_like(lse))
    assert all(torch.equal(a, b) for a, b in zip(got, direct))


def test_the_backward_reads_a_models_layout_in_place():
    bm = qkv.create_block_mask(and_masks(causal(), sliding_window(40, 0)), None, None, 200, 200,
                               block_size=32)
    x = torch.randn(2, 200, 4, 4, 32)  # (b, t, h, q/k/v/dout, d): strided heads, as a model passes them
    q, k, v, dout = (x[..., i, :].transpose(1, 2) for i in range(4))  # (b, h, t, d) views
    out, lse = kernels.kernel_forward(q, k, v, bm, scale=0.3)
    out_t = out.transpose(1, 2).contiguous().transpose(1, 2)  # (b, h, t, d) view of (b, t, h, d)
    got = kernels.kernel_backward(q, k, v, out_t, dout, lse, bm, scale=0.3)
    want = kernels.kernel_backward(*(a.contiguous() for a in (q, k, v, out, dout)), lse, bm, scale=0.3)
    assert all(torch.equal(a, b) for a, b in zip(got, want))  # the same numbers, read in place


@pytest.mark.parametrize("mod", [sliding_window(64, 0), document(torch.arange(515) // 400)],
                         ids=["window", "a document longer than a thread's share"])
def test_any_thread_count_gives_the_gradients(mod):
    # one (batch, key head) and 3 threads: the query tiles split into runs, even runs then odd
    # (a window); a document spanning several runs keeps one item per (batch, key head)
    bm = qkv.create_block_mask(mod, None, None, 515, 515, block_size=64)
    q, k, v = tensors(1, 1, 515, 515, 64, seed=5)
    dout = torch.randn(1, 1, 515, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    x32 = [a.float() for a in (q, k, v)]
    out, lse = kernels.kernel_forward(*x32, bm, scale=0.125)
    ref = reference_grads(q, k, v, bm, dout, None, scale=0.125, dtype=torch.float64)
    plain = reference_grads(q, k, v, bm, dout, None, scale=0.125, dtype=torch.float32)
    before = torch.get_num_threads()
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            got = kernels.kernel_backward(*x32, out, dout.float(), lse, bm, scale=0.125)
            for i, name in enumerate("qkv"):
                assert_within(got[i], ref[i], plain[i], factor=2 * FUSED_FACTOR, what=f"d{name}, {threads} threads")
    finally:
        torch.set_num_threads(before)


def test_the_backward_holds_its_tiles_beyond_its_gradients():
    """A window's backward at N and 4N, inputs in a model's layout: beyond dq, dk, dv only the
    threads' tiles — no copy of q, k, v, out or dout, nothing that grows with N."""
    extra = {n: backward_extra(kernels.kernel_forward, kernels.kernel_backward, n) for n in (2048, 8192)}
    tiles = torch.get_num_threads() * (2 * kernels.BLOCK_Q * kernels.BACKWARD_BLOCK_K + 2 * kernels.BLOCK_Q) * 4
    assert 0 <= extra[8192] <= tiles, extra
    assert extra[8192] == extra[2048], extra


def test_any_thread_count_gives_the_same_bits():
    # each (batch · head, tile) is computed whole by one thread with the same operations
    bm = qkv.create_block_mask(sliding_window(64, 0), None, None, 515, 515, block_size=64)
    q, k, v = tensors(1, 4, 515, 515, 64, dtype=torch.float32)
    before = torch.get_num_threads()
    try:
        outs = []
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            outs.append(kernels.kernel_forward(q, k, v, bm, scale=0.125))
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(a, b) for o in outs[1:] for a, b in zip(o, outs[0]))


def test_a_models_layout_is_read_in_place():
    bm = qkv.create_block_mask(sliding_window(40, 0), None, None, 200, 200, block_size=32)
    x = torch.randn(2, 200, 4, 3, 32)  # (b, t, h, q/k/v, d): strided heads, as a model passes them
    q, k, v = (x[..., i, :].transpose(1, 2) for i in range(3))  # (b, h, t, d) views
    got = kernels.kernel_forward(q, k, v, bm, scale=0.3)
    want = kernels.kernel_forward(*(a.contiguous() for a in (q, k, v)), bm, scale=0.3)
    assert all(torch.equal(a, b) for a, b in zip(got, want))  # the same numbers, read in place


def test_the_blockwise_backend_runs_the_kernel_for_a_window_and_spans_when_switched_off():
    q, k, v = tensors(1, 4, 1500, 1500, 64, dtype=torch.float32)
    kw = dict(window=(128, 0), is_causal=True, backend="blockwise", scale=0.125)
    got = qkv.scaled_dot_product_attention(q, k, v, **kw)
    bm = qkv.create_block_mask(sliding_window(128, 0), None, None, 1500, 1500, block_size=64)
    assert kernels.supports(q, k, v, bm)
    assert torch.equal(got, kernels.kernel_forward(q, k, v, bm, scale=0.125)[0])
    with kernels.use_kernel(False):
        assert not kernels.supports(q, k, v, bm)
        pure = qkv.scaled_dot_product_attention(q, k, v, **kw)
    assert torch.equal(pure, spans_attention(q, k, v, bm, scale=0.125)[0])


def backend_grads(q, k, v, dout, **kw):
    x = [a.detach().requires_grad_() for a in (q, k, v)]
    out = qkv.scaled_dot_product_attention(*x, backend="blockwise", scale=0.125, **kw)
    return torch.autograd.grad(out, x, dout)


@pytest.mark.parametrize("case", ["window", "documents"])
def test_the_blockwise_backend_trains_through_the_kernels_backward(case):
    # both: the kernel's forward and backward (its backward reads its own forward's lse: issue 40)
    q, k, v, dout = tensors(1, 2, 700, 700, 32, seed=7, dtype=torch.float32) + (torch.randn(1, 2, 700, 32),)
    if case == "window":
        bm = qkv.create_block_mask(sliding_window(100, 0), None, None, 700, 700, block_size=64)
        kw = dict(window=(100, 0), is_causal=True)
    else:
        bm = qkv.create_block_mask(document(uneven_documents(700)), None, None, 700, 700, block_size=128)
        kw = dict(block_mask=bm)
    out, lse = kernels.kernel_forward(q, k, v, bm, scale=0.125)
    want = kernels.kernel_backward(q, k, v, out, dout, lse, bm, scale=0.125)
    assert all(torch.equal(a, b) for a, b in zip(backend_grads(q, k, v, dout, **kw), want))
    with kernels.use_kernel(False):  # the pure-torch spans path, forward and backward
        pure = backend_grads(q, k, v, dout, **kw)
    out, lse = spans_forward(q, k, v, bm, scale=0.125)
    want = spans_backward(q, k, v, out, dout, lse, bm, scale=0.125)
    assert all(torch.equal(a, b) for a, b in zip(pure, want))


def test_a_forward_alone_over_documents_stays_on_the_spans_path():
    # no gradient wanted: torch's kernel per span was as fast as the kernel's forward there
    q, k, v = tensors(1, 2, 300, 300, 16, dtype=torch.float32)
    bm = qkv.create_block_mask(document(uneven_documents(300)), None, None, 300, 300, block_size=64)
    with torch.no_grad():
        got = kernels.attention(q, k, v, bm, scale=0.25)
    assert all(torch.equal(a, b) for a, b in zip(got, spans_forward(q, k, v, bm, scale=0.25)))


def test_masks_that_are_not_one_interval_per_row_go_to_the_spans_path():
    for mod in (document(torch.tensor([0, 0, 1, 1, 0, 0] * 50)),  # a document comes back
                qkv.masks.prefix_lm(10),  # or_masks
                lambda b, h, i, j: (i - j).abs() % 3 == 0):  # a custom mask_mod
        bm = qkv.create_block_mask(mod, None, None, 300, 300, block_size=32)
        assert kernels.intervals(bm) is None
    bm = qkv.create_block_mask(sliding_window(16, 0), None, None, 300, 300, block_size=32)
    q, k, v = tensors(1, 2, 300, 300, 16, dtype=torch.float32)
    assert not kernels.can_run(q.double(), k.double(), v.double(), bm)  # float64: the spans path


def test_a_nan_key_reaches_the_rows_that_see_it():
    bm = qkv.create_block_mask(sliding_window(16, 0), None, None, 300, 300, block_size=32)
    q, k, v = tensors(1, 2, 300, 300, 16, dtype=torch.float32)
    clean = kernels.kernel_forward(q, k, v, bm, scale=0.25)
    k[0, 1, 7, 3] = float("nan")
    out, lse = kernels.kernel_forward(q, k, v, bm, scale=0.25)
    sees = torch.zeros(1, 2, 300, dtype=torch.bool)
    sees[0, 1, 7:24] = True  # rows 7 … 7 + 16 see key 7
    assert out[sees].isnan().all() and lse[sees].isnan().all()
    assert torch.equal(out[~sees], clean[0][~sees]) and torch.equal(lse[~sees], clean[1][~sees])


def test_nan_in_a_query_row_gives_a_nan_row():
    bm = qkv.create_block_mask(sliding_window(16, 0), None, None, 128, 128, block_size=32)
    q, k, v = tensors(1, 2, 128, 128, 16, dtype=torch.float32)
    q[0, 1, 70, 5] = float("nan")
    out, lse = kernels.kernel_forward(q, k, v, bm, scale=0.25)
    bad = torch.zeros(1, 2, 128, dtype=torch.bool)
    bad[0, 1, 70] = True
    assert out[bad].isnan().all() and lse[bad].isnan().all()
    assert not out[~bad].isnan().any() and not lse[~bad].isnan().any()


def test_grouped_heads_and_documents_per_batch_row():
    ids = torch.stack([uneven_documents(260), torch.arange(260) // 100])  # (2, 260): each row its own
    bm = qkv.create_block_mask(and_masks(document(ids), sliding_window(60, 0)), 2, None, 260, 260,
                               block_size=32)
    g = torch.Generator().manual_seed(4)
    q = torch.randn(2, 4, 260, 16, generator=g, dtype=torch.float64)
    k, v = (torch.randn(2, 2, 260, 16, generator=g, dtype=torch.float64) for _ in range(2))  # 2 key heads
    x32 = [a.float() for a in (q, k, v)]
    out, lse = kernels.kernel_forward(*x32, bm, scale=0.25, enable_gqa=True)
    ref, ref_lse = blockwise_attention(q, k, v, bm, scale=0.25, enable_gqa=True)
    plain, plain_lse = blockwise_attention(*x32, bm, scale=0.25, enable_gqa=True)
    assert_within(out, ref, plain, factor=FUSED_FACTOR, what="out")
    assert_within(lse, ref_lse, plain_lse, factor=FUSED_FACTOR, what="lse")


# -- layouts BLAS cannot read in place (issue 40) -------------------------------------------------
def _overlapping(x):  # rows that share half their elements: row stride d / 2
    b, h, n, d = x.shape
    base = x.flatten()[: b * h * n * d // 2 + d].clone()
    return base.as_strided((b, h, n, d), (h * n * d // 2, n * d // 2, d // 2, 1))


LAYOUTS = {  # name: a (b, h, n, d) tensor in an odd layout, from a contiguous one
    "expanded along n (stride 0)": lambda x: x[:, :, :1].expand(x.shape),
    "overlapping rows": _overlapping,
    "transposed (b, n, h, d)": lambda x: x.transpose(1, 2).contiguous().transpose(1, 2),
    "a slice of wider rows": lambda x: torch.cat([x, x], -1)[..., : x.shape[-1]],
    "every other element": lambda x: torch.stack([x, x], -1).flatten(-2)[..., ::2],
    "expanded over heads": lambda x: x[:, :1].expand(x.shape),
}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("which", ["q", "k", "v", "out", "dout"])
def test_any_layout_gives_the_contiguous_answer_and_blas_says_nothing(layout, which, capfd):
    bm = qkv.create_block_mask(sliding_window(40, 0), None, None, 150, 150, block_size=32)
    g = torch.Generator().manual_seed(3)
    x = {n: torch.randn(1, 2, 150, 16, generator=g) for n in ("q", "k", "v", "dout")}
    odd = dict(x)
    if which != "out":
        odd[which] = LAYOUTS[layout](x[which])
    out, lse = kernels.kernel_forward(odd["q"], odd["k"], odd["v"], bm, scale=0.25)
    want_out, want_lse = kernels.kernel_forward(*(odd[n].contiguous() for n in "qkv"), bm, scale=0.25)
    o = LAYOUTS[layout](out) if which == "out" else out
    got = kernels.kernel_backward(odd["q"], odd["k"], odd["v"], o, odd["dout"], lse, bm, scale=0.25)
    want = kernels.kernel_backward(*(odd[n].contiguous() for n in "qkv"), o.contiguous(),
                                   odd["dout"].contiguous(), lse, bm, scale=0.25)
    captured = capfd.readouterr()
    assert captured.out == "" and captured.err == "", captured  # e.g. "Intel oneMKL ERROR: Parameter 8"
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)  # the same products on the same numbers
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_the_issues_training_pattern_gets_the_float64_gradients(capfd):
    # out.sum(dim=2): autograd hands the backward a dout expanded along the rows (stride 0)
    bm = qkv.create_block_mask(sliding_window(32, 0), None, None, 256, 256)
    x64 = tensors(1, 2, 256, 256, 16, seed=5)

    def grads(dtype, kernel=True):
        x = [a.to(dtype).detach().requires_grad_() for a in x64]
        with kernels.use_kernel(kernel):
            qkv.scaled_dot_product_attention(*x, block_mask=bm).sum(dim=2).pow(2).sum().backward()
        return [a.grad for a in x]

    got, ref, plain = grads(torch.float32), grads(torch.float64), grads(torch.float32, kernel=False)
    assert capfd.readouterr() == ("", "")
    for name, g, r, p in zip("qkv", got, ref, plain):
        assert_within(g, r, p, factor=2 * FUSED_FACTOR, what=f"d{name}")


def test_the_compiled_checks_refuse_rows_blas_cannot_read(capfd):
    bm = qkv.create_block_mask(sliding_window(40, 0), None, None, 128, 128)
    lo, hi = kernels.intervals(bm)
    q, k, v = tensors(1, 2, 128, 128, 16, dtype=torch.float32)
    dout = torch.randn(1, 2, 1, 16).expand(1, 2, 128, 16)  # stride 0 along the rows
    with pytest.raises(RuntimeError, match=r"k: each \(n, d\) matrix must have contiguous rows"):
        kernels.load().interval_forward(q, k[:, :, :1].expand(k.shape), v, lo, hi, 0.25, 64, 64)
    out, lse = kernels.load().interval_forward(q, k, v, lo, hi, 0.25, 64, 64)
    with pytest.raises(RuntimeError, match=r"dout: each \(n, d\) matrix must have contiguous rows"):
        kernels.load().interval_backward(q, k, v, out, dout, lse, lse.new_empty(0), lo, hi, 0.25, 64, 64)
    assert capfd.readouterr() == ("", "")  # refused before BLAS saw it


@pytest.mark.parametrize("where", ["a key", "a query"])
def test_scale_zero_keeps_a_nan_in_the_rows_that_see_it(where):
    # BLAS reads neither matrix when alpha is 0; 0 · NaN is NaN on every other path
    bm = qkv.create_block_mask(sliding_window(16, 0), None, None, 128, 128, block_size=32)
    q, k, v = (a.requires_grad_() for a in tensors(1, 2, 128, 128, 16, dtype=torch.float32))
    sees = torch.zeros(1, 2, 128, dtype=torch.bool)
    with torch.no_grad():
        if where == "a key":
            k[0, 1, 40, 3] = float("nan")
            sees[0, 1, 40:57] = True  # rows 40 … 40 + 16 see key 40
        else:
            q[0, 1, 70, 5] = float("nan")
            sees[0, 1, 70] = True
    out, lse = kernels.kernel_forward(q, k, v, bm, scale=0.0)
    assert out[sees].isnan().all() and lse[sees].isnan().all()
    assert not out[~sees].isnan().any()
    dq, dk, dv = kernels.kernel_backward(q, k, v, out, torch.ones_like(out), lse, bm, scale=0.0)
    assert dq[sees].isnan().all()
    assert not dq[~sees].isnan().any() or where == "a key"  # a NaN key reaches its tile's dq


def test_no_heads_is_an_empty_answer():
    bm = qkv.create_block_mask(sliding_window(32, 0), None, None, 128, 128)
    for hq, hkv in ((0, 0), (0, 2)):
        q = torch.randn(1, hq, 128, 16, requires_grad=True)
        k, v = (torch.randn(1, hkv, 128, 16, requires_grad=True) for _ in range(2))
        for backend in ("auto", "blockwise"):
            out = qkv.scaled_dot_product_attention(q, k, v, block_mask=bm, enable_gqa=hkv > 0,
                                                   backend=backend)
            out.sum().backward()
            assert out.shape == (1, 0, 128, 16) and q.grad.shape == q.shape
