"""attention_weights: chosen softmax rows from the saved lse equal the reference path's weights."""

from __future__ import annotations

import pytest
import torch

import qkv
from qkv.masks import and_masks, causal, document, sliding_window
from tolerance import assert_within


def tensors(h=4, h_kv=2, t=150, s=150, d=16, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(2, h, t, d, generator=g, dtype=torch.float64).to(dtype),
            torch.randn(2, h_kv, s, d, generator=g, dtype=torch.float64).to(dtype),
            torch.randn(2, h_kv, s, d, generator=g, dtype=torch.float64).to(dtype))


@pytest.mark.parametrize("mod", [None, causal("bottom_right"), sliding_window(20, 3),
                                 lambda b, h, q, k: (q + 2 * k + h) % 3 != 0])
@pytest.mark.parametrize("t,s", [(150, 150), (90, 150), (150, 90)])
def test_rows_equal_the_reference_softmax(mod, t, s):
    q, k, v = tensors(t=t, s=s)
    bm = None if mod is None else qkv.create_block_mask(mod, None, 4, t, s, block_size=32)
    _, lse = qkv.scaled_dot_product_attention(q, k, v, block_mask=bm, return_lse=True, enable_gqa=True)
    rows, heads = [0, 5, t - 1], [3, 0]
    got = qkv.attention_weights(q, k, lse, rows=rows, heads=heads, block_mask=bm, enable_gqa=True)
    assert got.shape == (2, 2, 3, s)

    def ref_weights(dtype):
        x = [a.to(dtype) for a in (q, k, v)]
        m = qkv.AttentionMask(block=bm) if bm is not None else None
        tr = qkv.attention_trace(*x, mask=m, enable_gqa=True)
        return tr.weights[:, heads][:, :, rows]

    assert_within(got, ref_weights(torch.float64), ref_weights(torch.float32), what="weights")


def test_long_sequence_rows_cost_rows_times_keys():
    t = 20000
    q, k, v = tensors(h=1, h_kv=1, t=t, s=t, d=8)
    bm = qkv.create_block_mask(and_masks(sliding_window(100, 0), document(torch.arange(t) // 7000)),
                               None, None, t, t)
    out, lse = qkv.scaled_dot_product_attention(q, k, v, block_mask=bm, return_lse=True)
    rows = [7000, t - 1]
    w = qkv.attention_weights(q, k, lse, rows=rows, block_mask=bm)  # (2, 1, 2, t)
    assert w.shape == (2, 1, 2, t)
    # float64 truth for those rows, and the plain float32 softmax of them as the yardstick
    x64 = [a.double() for a in (q, k, v)]
    out64, lse64 = qkv.scaled_dot_product_attention(*x64, block_mask=bm, return_lse=True)
    w64 = qkv.attention_weights(x64[0], x64[1], lse64, rows=rows, block_mask=bm)
    scores = (q[:, :, rows] @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5  # (2, 1, 2, t)
    plain = torch.softmax(scores.masked_fill(~bm.rows_mask(torch.tensor(rows)), -torch.inf), -1)
    assert_within(w, w64, plain, what="weights")
    assert_within(w.sum(-1), w64.sum(-1), plain.sum(-1), what="row sums")
    assert int((w[0, 0, 0] > 0).sum()) == 1  # the first token of its document sees only itself
    assert int((w[0, 0, 1] > 0).sum()) == 101
    # the output is the weights times the values
    assert_within((w[:, :, 1] @ v[:, 0]).squeeze(1), out64[:, 0, t - 1],  # (2, d)
                  (plain[:, :, 1] @ v[:, 0]).squeeze(1), what="w @ v")


def test_rows_with_no_key_are_zero_and_nan_rows_stay_nan():
    q, k, v = tensors(h=1, h_kv=1, t=6, s=3, d=4)
    q[0, 0, 5, 1] = float("nan")
    bm = qkv.create_block_mask(causal("bottom_right"), None, None, 6, 3, block_size=2)
    _, lse = qkv.scaled_dot_product_attention(q, k, v, block_mask=bm, return_lse=True)
    w = qkv.attention_weights(q, k, lse, block_mask=bm)
    assert torch.equal(w[:, :, :3], torch.zeros_like(w[:, :, :3]))
    assert torch.isnan(w[0, 0, 5]).all() and not torch.isnan(w[1]).any()


def test_bad_arguments_are_named():
    q, k, v = tensors(t=10, s=10)
    _, lse = qkv.scaled_dot_product_attention(q, k, v, return_lse=True, enable_gqa=True)
    with pytest.raises(ValueError, match=r"rows \[10\] out of range for 10 rows"):
        qkv.attention_weights(q, k, lse, rows=[10], enable_gqa=True)
    with pytest.raises(ValueError, match=r"heads \[-5\] out of range for 4 heads"):
        qkv.attention_weights(q, k, lse, heads=-5, enable_gqa=True)
    with pytest.raises(ValueError, match="rows must be None, an int"):
        qkv.attention_weights(q, k, lse, rows=[0.5], enable_gqa=True)
    with pytest.raises(ValueError, match=r"lse must have shape \(..., h, t\)"):
        qkv.attention_weights(q, k, lse[..., :5], enable_gqa=True)
    with pytest.raises(ValueError, match="enable_gqa=True"):
        qkv.attention_weights(q, k, lse)
    bm = qkv.create_block_mask(causal(), None, None, 12, 12)
    with pytest.raises(ValueError, match="built for t=12, s=12"):
        qkv.attention_weights(q, k, lse, block_mask=bm, enable_gqa=True)
