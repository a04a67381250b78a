"""The blockwise backend (online softmax, FlashAttention-2 backward) against an fp64 reference.

Both implementations of it, parametrised as ``impl``: ``"torch"`` (:mod:`qkv.attention.blockwise`,
the readable pure-torch path) and ``"spans"`` (:mod:`qkv.attention.spans`, torch's fused CPU
kernel once per span, merged by lse — what the backend runs where it can).

flash-attention's rule throughout (``tolerance.assert_within``): the blockwise answer in a dtype
may be at most twice as far from the float64 answer as the plain path run in that same dtype
(qkv's reference backend), plus 2 ulp — for outputs, log-sum-exps and gradients; for spans
``FUSED_FACTOR`` times (the fused kernel's exp and normalisation round twice as much, see
tests/tolerance.py). In float64 (``assert_agree``) the factor doubles likewise.
"""

from __future__ import annotations

import math

import pytest
import torch

import qkv
from qkv.attention import AttentionMask, choose_backend
from qkv.attention.blockwise import (
    backward_chunk, blockwise_attention, blockwise_backward, blockwise_forward, forward_chunk,
)
from qkv.attention.spans import spans_attention, spans_backward, spans_forward
from qkv.masks import and_masks, causal, document, or_masks, prefix_lm, sliding_window
from tolerance import FUSED_FACTOR, assert_agree, assert_within

# impl → (forward, backward, differentiable, tolerance factor against the plain path)
IMPLS = {
    "torch": (blockwise_forward, blockwise_backward, blockwise_attention, 2.0),
    "spans": (spans_forward, spans_backward, spans_attention, FUSED_FACTOR),
}
impls = pytest.mark.parametrize("impl", list(IMPLS))


def plain(q, k, v, keep, scale, groups=1):
    """softmax(q kᵀ · scale, keys outside ``keep`` removed) v and its lse, rows of 512 at a time
    (so 4099 tokens never hold t × s numbers at once); zeros and −inf for rows with no key."""
    if groups > 1:
        k, v = k.repeat_interleave(groups, -3), v.repeat_interleave(groups, -3)
    outs, lses = [], []
    for r0 in range(0, q.shape[-2], 512):
        s = (q[..., r0:r0 + 512, :] @ k.transpose(-1, -2)) * scale
        s = s.masked_fill(~keep(r0, min(r0 + 512, q.shape[-2])), -math.inf)
        lse = torch.logsumexp(s, -1)
        empty = torch.isneginf(lse).unsqueeze(-1)
        w = torch.softmax(s.masked_fill(empty, 0), -1).masked_fill(empty, 0)
        outs.append(w @ v)
        lses.append(lse)
    return torch.cat(outs, -2), torch.cat(lses, -1)


def rows_of(bm):
    """keep(r0, r1): the block mask's (B', H', r1 − r0, s) bool on those query rows."""
    return lambda r0, r1: bm.rows_mask(torch.arange(r0, r1))


def check(q, k, v, bm, *, groups=1, scale=0.3, what="", impl="torch"):
    """Blockwise in q's dtype vs fp64 plain, with the plain path in q's dtype as the yardstick."""
    forward, _, _, factor = IMPLS[impl]
    got, got_lse = forward(q, k, v, bm, scale=scale, enable_gqa=groups > 1)
    ref, ref_lse = plain(q.double(), k.double(), v.double(), rows_of(bm), scale, groups)
    low = torch.float32 if q.dtype != torch.float64 else torch.float64
    p_out, p_lse = plain(q.to(low), k.to(low), v.to(low), rows_of(bm), scale, groups)
    p_out = p_out.to(q.dtype)  # the plain path rounds its output to the input dtype too
    assert got.dtype == q.dtype and got.shape == ref.shape
    assert_within(got, ref, p_out, factor=factor, what=f"{what} output")
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isneginf(got_lse), torch.isneginf(ref_lse))  # rows with no key
    assert_within(got_lse, ref_lse, p_lse, factor=factor, where=finite, what=f"{what} lse")
    assert torch.equal(got[torch.isneginf(got_lse)], torch.zeros_like(got[torch.isneginf(got_lse)]))


def qkv_tensors(b, h, h_kv, t, s, d, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    make = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)  # noqa: E731
    return make(b, h, t, d), make(b, h_kv, s, d), make(b, h_kv, s, d)


MODS = {
    "causal": lambda t, s: causal(),
    "causal_br": lambda t, s: causal("bottom_right"),
    "window": lambda t, s: sliding_window(37, 0),
    "window_br": lambda t, s: sliding_window(20, 5, alignment="bottom_right"),
    "document": lambda t, s: document(torch.arange(max(t, s)) * 5 // max(t, s)),
    "doc_and_causal": lambda t, s: and_masks(document(torch.arange(max(t, s)) // 90), causal()),
    "prefix_lm": lambda t, s: prefix_lm(50),
    "window_or_sink": lambda t, s: or_masks(sliding_window(16, 0), lambda b, h, q, k: k < 4),
    "random": lambda t, s: (lambda b, h, q, k: (q * 31 + k * 17 + h * 7) % 11 > 3),
}


@impls
@pytest.mark.parametrize("name,t,s", [
    (name, t, s)
    for name in MODS
    for t, s in [(1, 1), (7, 7), (113, 113), (1000, 1000), (113, 200), (200, 113)]
    if not (name.startswith("doc") and t != s)])  # documents are self-attention (t = s)
def test_forward_matches_fp64_reference(name, t, s, impl):
    q, k, v = qkv_tensors(1, 4, 2, t, s, 16)
    bm = qkv.create_block_mask(MODS[name](t, s), None, 4 if name == "random" else None, t, s,
                               block_size=64)
    check(q, k, v, bm, groups=2, what=f"{name} t={t} s={s}", impl=impl)


@impls
def test_long_awkward_length_window_and_documents(impl):
    t = 4099
    q, k, v = qkv_tensors(1, 2, 1, t, t, 8)
    mod = and_masks(sliding_window(300, 0), document(torch.arange(t) // 1500))
    check(q, k, v, qkv.create_block_mask(mod, None, None, t, t), groups=2, what="4099", impl=impl)
    for mod in (sliding_window(300, 0), causal()):  # spans' one-call band and causal levels
        check(q, k, v, qkv.create_block_mask(mod, None, None, t, t, block_size=64), groups=2,
              what=f"4099 {mod}", impl=impl)


@impls
def test_bfloat16_accumulates_in_float32(impl):
    q, k, v = qkv_tensors(2, 2, 2, 300, 300, 32, dtype=torch.bfloat16)
    check(q, k, v, qkv.create_block_mask(sliding_window(64, 0), None, None, 300, 300, block_size=32),
          what="bf16", impl=impl)


def test_rows_with_no_key_give_zeros_and_minus_inf():
    q, k, v = qkv_tensors(1, 1, 1, 10, 4, 8)
    bm = qkv.create_block_mask(causal("bottom_right"), None, None, 10, 4, block_size=4)
    out, lse = qkv.scaled_dot_product_attention(q, k, v, block_mask=bm, return_lse=True)
    assert torch.isneginf(lse[..., :6]).all() and torch.isfinite(lse[..., 6:]).all()
    assert torch.equal(out[..., :6, :], torch.zeros_like(out[..., :6, :]))
    ref, ref_lse = qkv.scaled_dot_product_attention(q, k, v, block_mask=bm, return_lse=True,
                                                    backend="reference")
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse))


@impls
@pytest.mark.parametrize("name", ["causal_br", "window_br", "random", "doc_and_causal", "window"])
def test_gradients_match_fp64_reference(name, impl):
    t, s = (90, 90) if name.startswith("doc") else (70, 90)
    q, k, v = qkv_tensors(2, 4, 2, t, s, 16)
    bm = qkv.create_block_mask(MODS[name](t, s), None, 4 if name == "random" else None, t, s,
                               block_size=32)
    g = torch.Generator().manual_seed(1)
    dout = torch.randn(2, 4, t, 16, generator=g)
    dlse = torch.randn(2, 4, t, generator=g)

    def grads(dtype, fn):
        x = [a.to(dtype).requires_grad_() for a in (q, k, v)]
        out, lse = fn(*x)
        finite = torch.isfinite(lse)
        loss = (out * dout.to(dtype)).sum() + (torch.where(finite, lse, 0) * dlse.to(dtype)).sum()
        return torch.autograd.grad(loss, x)

    def plain_fn(a, b, c):  # autograd through the reference path
        return qkv.scaled_dot_product_attention(a, b, c, block_mask=bm, return_lse=True,
                                                backend="reference", enable_gqa=True, scale=0.3)

    attention, factor = IMPLS[impl][2], IMPLS[impl][3]
    got = grads(torch.float32, lambda a, b, c: attention(a, b, c, bm, scale=0.3, enable_gqa=True))
    ref = grads(torch.float64, plain_fn)
    low = grads(torch.float32, plain_fn)
    for name_, g_, r_, l_ in zip("qkv", got, ref, low):
        assert_within(g_, r_, l_, factor=factor, what=f"d{name_}")


@impls
def test_gradcheck_float64(impl):
    q, k, v = (x.requires_grad_() for x in qkv_tensors(1, 2, 1, 9, 11, 4, dtype=torch.float64))
    bm = qkv.create_block_mask(and_masks(sliding_window(3, 1, alignment="bottom_right"),
                                         lambda b, h, i, j: (i + j) % 4 != 1), None, None, 9, 11,
                               block_size=4)

    def f(q, k, v):
        out, lse = IMPLS[impl][2](q, k, v, bm, scale=0.7, enable_gqa=True)
        return out, torch.where(torch.isfinite(lse), lse, 0)

    assert torch.autograd.gradcheck(f, (q, k, v))


def test_chunks_merged_by_lse_equal_the_whole():
    """The ring-attention primitives: 2 query chunks × 3 key chunks, merged by log-sum-exp.

    Run in float64 and again in float32: the merge is the whole computation summed in another
    order, so the float64 results may differ by rounding alone (``assert_agree``, the float32
    whole computation measuring that rounding)."""
    t, d = 60, 8
    mod = sliding_window(25, 0)
    bm = qkv.create_block_mask(mod, None, None, t, t, 16)
    dout64 = torch.randn(1, 2, t, d, generator=torch.Generator().manual_seed(1), dtype=torch.float64)

    def run(dtype):
        """(whole, merged): each (out, lse, dq, dk, dv) in ``dtype``."""
        q, k, v = qkv_tensors(1, 2, 2, t, t, d, dtype=dtype)
        dout = dout64.to(dtype)
        whole, whole_lse = forward_chunk(q, k, v, mask_mod=mod, block_size=16)
        dq, dk, dv = blockwise_backward(q, k, v, whole, dout, whole_lse, bm, scale=d ** -0.5)
        qs, ks = [(0, 30), (30, 60)], [(0, 20), (20, 40), (40, 60)]
        outs, lses, dq_parts = [], [], []
        dk_sum, dv_sum = torch.zeros_like(k), torch.zeros_like(v)
        for q0, q1 in qs:
            out = torch.zeros_like(whole[..., q0:q1, :])
            lse = torch.full_like(whole_lse[..., q0:q1], -math.inf)
            for k0, k1 in ks:
                o, lc = forward_chunk(q[..., q0:q1, :], k[..., k0:k1, :], v[..., k0:k1, :],
                                      mask_mod=mod, q_offset=q0, k_offset=k0, block_size=16)
                new = torch.logaddexp(lse, lc)
                w_old = torch.where(torch.isneginf(new), 0, (lse - new).exp()).unsqueeze(-1)
                w_new = torch.where(torch.isneginf(new), 0, (lc - new).exp()).unsqueeze(-1)
                out, lse = out * w_old + o * w_new, new
            dq_part = torch.zeros_like(q[..., q0:q1, :])
            for k0, k1 in ks:
                a, b, c = backward_chunk(q[..., q0:q1, :], k[..., k0:k1, :], v[..., k0:k1, :], out,
                                         dout[..., q0:q1, :], lse, mask_mod=mod, q_offset=q0,
                                         k_offset=k0, block_size=16)
                dq_part += a
                dk_sum[..., k0:k1, :] += b
                dv_sum[..., k0:k1, :] += c
            outs.append(out), lses.append(lse), dq_parts.append(dq_part)
        merged = (torch.cat(outs, -2), torch.cat(lses, -1), torch.cat(dq_parts, -2), dk_sum, dv_sum)
        return (whole, whole_lse, dq, dk, dv), merged

    whole, merged = run(torch.float64)
    low, _ = run(torch.float32)
    for name, got, want, lo in zip(("out", "lse", "dq", "dk", "dv"), merged, whole, low):
        assert_agree(got, want, lo, what=f"merged {name}")


def test_a_windowed_model_gives_the_same_logits_blockwise_and_reference():
    torch.manual_seed(0)
    stacks = {}
    for backend in ("blockwise", "reference"):
        torch.manual_seed(0)
        layers = [qkv.TransformerLayer.build(32, 4, 64, backend=backend, num_kv_heads=2)
                  for _ in range(2)]
        stacks[backend] = qkv.TransformerStack(layers).eval()
    x = torch.randn(2, 300, 32, dtype=torch.float64)
    mask = AttentionMask(causal=True, window=(40, 0))
    bm = qkv.create_block_mask(sliding_window(40, 0), None, None, 300, 300, block_size=64)
    with torch.no_grad():
        ref = stacks["reference"].double()(x, mask=mask).last_hidden_state
        p = stacks["reference"].float()(x.float(), mask=mask).last_hidden_state
        for m in (mask, AttentionMask(block=bm)):
            got = stacks["blockwise"].float()(x.float(), mask=m).last_hidden_state
            assert_within(got, ref, p, what="hidden states")


def test_packed_sequences_and_padding_run_blockwise():
    from qkv.attention import VarLen
    q, k, v = qkv_tensors(1, 2, 2, 12, 12, 8, dtype=torch.float64)
    vl = VarLen.from_lengths([5, 4, 3])
    for m in (AttentionMask(varlen=vl, causal=True),
              AttentionMask(key_padding=torch.tensor([[True] * 9 + [False] * 3]), window=(3, 1))):
        got = qkv.scaled_dot_product_attention(q, k, v, mask=m, backend="blockwise")
        want = qkv.scaled_dot_product_attention(q, k, v, mask=m, backend="reference")
        low = qkv.scaled_dot_product_attention(q.float(), k.float(), v.float(), mask=m, backend="reference")
        assert_agree(got, want, low, what="packed / padded")


def test_auto_routes_long_windows_blockwise_and_short_ones_fused():
    long_q = torch.empty(1, 1, 8192, 8)
    short_q = torch.empty(1, 1, 256, 8)
    window = AttentionMask(causal=True, window=(512, 0))
    assert choose_backend(long_q, long_q, window) == "blockwise"
    assert choose_backend(short_q, short_q, window) == "fused"
    threads = torch.get_num_threads()
    try:  # plain causal: torch's kernel unless fewer (batch · heads) than threads (spans' levels)
        torch.set_num_threads(1)
        assert choose_backend(long_q, long_q, AttentionMask(causal=True)) == "fused"
        torch.set_num_threads(2)
        assert choose_backend(long_q, long_q, AttentionMask(causal=True)) == "blockwise"
        assert choose_backend(long_q.expand(1, 2, -1, -1), long_q, AttentionMask(causal=True)) == "fused"
        assert choose_backend(short_q, short_q, AttentionMask(causal=True)) == "fused"
    finally:
        torch.set_num_threads(threads)
    assert choose_backend(short_q, short_q, None, return_lse=True) == "blockwise"
    assert choose_backend(long_q, long_q, window, dropout_p=0.1) == "fused"
    bm = qkv.create_block_mask(causal(), None, None, 256, 256)
    assert choose_backend(short_q, short_q, AttentionMask(block=bm)) == "blockwise"
    from qkv.attention import VarLen
    long_docs, short_docs = VarLen.from_lengths([2048] * 4), VarLen.from_lengths([7, 9, 4])
    assert choose_backend(long_q, long_q, AttentionMask(varlen=long_docs)) == "blockwise"
    assert choose_backend(short_q[..., :20, :], short_q[..., :20, :], AttentionMask(varlen=short_docs)) == "fused"


def test_return_lse_matches_reference_and_bad_combinations_are_named():
    q, k, v = qkv_tensors(1, 2, 2, 50, 50, 8)
    out, lse = qkv.scaled_dot_product_attention(q, k, v, window=(10, 0), is_causal=True, return_lse=True)
    r_out, r_lse = qkv.scaled_dot_product_attention(q, k, v, window=(10, 0), is_causal=True,
                                                    return_lse=True, backend="reference")
    ref_out, ref_lse = qkv.scaled_dot_product_attention(q.double(), k.double(), v.double(), window=(10, 0),
                                                        is_causal=True, return_lse=True, backend="reference")
    assert lse.dtype == torch.float32 and lse.shape == (1, 2, 50)
    assert_within(lse, ref_lse, r_lse, what="lse")
    assert_within(out, ref_out, r_out, what="output")
    with pytest.raises(ValueError, match=r"return_lse=True needs a backend .* got backend='fused'"):
        qkv.scaled_dot_product_attention(q, k, v, return_lse=True, backend="fused")
    with pytest.raises(ValueError, match=r"backend 'blockwise' cannot do a tensor attn_mask; "
                                         r"backends that can: \['reference', 'fused'"):
        qkv.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(50, 50, dtype=torch.bool),
                                         backend="blockwise")
    with pytest.raises(ValueError, match="backend 'blockwise' cannot do a score bias"):
        qkv.scaled_dot_product_attention(q, k, v, bias=torch.zeros(50, 50), backend="blockwise")
    with pytest.raises(ValueError, match="backend 'blockwise' cannot do dropout"):
        qkv.scaled_dot_product_attention(q, k, v, dropout_p=0.1, backend="blockwise")


def test_multihead_attention_takes_a_block_mask_and_shows_its_weights():
    torch.manual_seed(0)
    mha = qkv.MultiHeadAttention(32, 4, num_kv_heads=2, backend="blockwise").double()
    x = torch.randn(2, 70, 32, dtype=torch.float64)
    per_head = qkv.create_block_mask(lambda b, h, i, j: (j <= i) & (i - j <= 10 * (h + 1)), None, 4,
                                     70, 70, block_size=16)
    fast = mha(x, mask=AttentionMask(block=per_head))
    slow = mha(x, mask=AttentionMask(block=per_head), need_weights=True, average_attn_weights=False)
    low = qkv.MultiHeadAttention(32, 4, num_kv_heads=2).float()
    low.load_state_dict(mha.state_dict())
    plain = low(x.float(), mask=AttentionMask(block=per_head), need_weights=True).output
    assert_within(fast.output.float(), slow.output, plain, what="block-masked MHA")
    head3 = slow.weights[:, 3]  # (b, t, s): head 3 sees 40 keys back, head 0 only 10
    assert int((head3[0, 69] > 0).sum()) == 41 and int((slow.weights[0, 0, 69] > 0).sum()) == 11


@pytest.mark.parametrize("kwargs", [dict(is_causal=True, window=(5, 0)),
                                    dict(is_causal=True, causal_alignment="bottom_right"),
                                    dict(key_padding_mask=torch.tensor([[True] * 30 + [False] * 10] * 2)),
                                    dict(attn_mask=torch.randn(2, 4, 25, 40, dtype=torch.float64), is_causal=False),
                                    dict(block_mask="per_head")])
def test_a_trace_of_some_rows_equals_those_rows_of_the_full_trace(kwargs):
    q, k, v = qkv_tensors(2, 4, 2, 25, 40, 8, dtype=torch.float64)
    if kwargs.get("block_mask") == "per_head":
        kwargs = dict(block_mask=qkv.create_block_mask(lambda b, h, i, j: j <= i + 3 * h, None, 4, 25, 40,
                                                       block_size=8))
    rows = [0, 13, 24]
    part = qkv.attention_trace(q, k, v, enable_gqa=True, rows=rows, **kwargs)
    full = qkv.attention_trace(q, k, v, enable_gqa=True, **kwargs).select_rows(torch.tensor(rows))
    low = qkv.attention_trace(q.float(), k.float(), v.float(), enable_gqa=True,
                              **{n: (x.float() if isinstance(x, torch.Tensor) and x.is_floating_point() else x)
                                 for n, x in kwargs.items()}).select_rows(torch.tensor(rows))
    for field in ("weights", "output", "masked"):
        got, want = getattr(part, field), getattr(full, field)
        finite = torch.isfinite(want)
        assert torch.equal(finite, torch.isfinite(got))
        assert_agree(got, want, getattr(low, field), where=finite, what=field)
    with pytest.raises(ValueError, match=r"rows must be query positions in \[-25, 25\), got \[25\]"):
        qkv.attention_trace(q, k, v, enable_gqa=True, rows=[25])


@pytest.mark.parametrize("name", ["causal_br", "document", "window"])
def test_rows_cut_into_one_block_pieces_give_the_same_answer(name, monkeypatch):
    """Long rows are cut into pieces (PIECE_BYTES) merged by the online softmax: one block per
    piece must give the reference answer too, forward and backward."""
    import qkv.attention.blockwise as blockwise
    monkeypatch.setattr(blockwise, "PIECE_BYTES", 1)
    q, k, v = qkv_tensors(1, 4, 2, 150, 200, 16)
    bm = qkv.create_block_mask(MODS[name](150, 200), None, None, 150, 200, block_size=16)
    check(q, k, v, bm, groups=2, what=f"{name}, one-block pieces")
    x = [a.double().requires_grad_() for a in (q, k, v)]
    out, _ = blockwise_attention(*x, bm, scale=0.3, enable_gqa=True)
    ref = qkv.scaled_dot_product_attention(*x, block_mask=bm, backend="reference", scale=0.3,
                                           enable_gqa=True)
    dout = torch.randn_like(out)
    got_g = torch.autograd.grad(out, x, dout)
    ref_g = torch.autograd.grad(ref, x, dout)
    y = [a.detach().float().requires_grad_() for a in x]  # the reference's rounding, one precision down
    low = qkv.scaled_dot_product_attention(*y, block_mask=bm, backend="reference", scale=0.3, enable_gqa=True)
    low_g = torch.autograd.grad(low, y, dout.float())
    for name_, a, b, lo in zip("qkv", got_g, ref_g, low_g):
        assert_agree(a, b, lo, what=f"d{name_}")
