"""attention_received / attention_block_sums: column and tile sums of the weights, from the lse,
equal the sums of the reference path's whole (t × s) weights."""

from __future__ import annotations

import math

import pytest
import torch

import qkv
from qkv.attention.received import attention_block_sums, attention_received
from qkv.masks import and_masks, causal, document, sliding_window
from tolerance import assert_within


def tensors(h=4, h_kv=2, t=203, s=203, d=16):
    g = torch.Generator().manual_seed(1)
    return [torch.randn(2, n, m, d, generator=g, dtype=torch.float64) for n, m in
            ((h, t), (h_kv, s), (h_kv, s))]


MASKS = {
    "none": None,
    "causal": causal("bottom_right"),
    "window": sliding_window(20, 0),
    "documents": and_masks(causal(), document(torch.arange(203) // 70)),
    "custom": lambda b, h, q, k: (q + 2 * k + h) % 3 != 0,
}


def dense_weights(q, k, v, bm, dtype):
    """(b, h, t, s) every weight by the reference path, in ``dtype``."""
    x = [a.to(dtype) for a in (q, k, v)]
    return qkv.attention_trace(*x, mask=qkv.AttentionMask(block=bm) if bm is not None else None,
                               enable_gqa=True).weights


def tiles_of(w: torch.Tensor, block: int) -> torch.Tensor:
    """(…, t, s) → (…, ⌈t/b⌉, ⌈s/b⌉) tile sums, by padding to whole tiles."""
    t, s = w.shape[-2:]
    nq, nk = math.ceil(t / block), math.ceil(s / block)
    padded = torch.nn.functional.pad(w, (0, nk * block - s, 0, nq * block - t))
    return padded.unflatten(-1, (nk, block)).unflatten(-3, (nq, block)).sum((-1, -3))


@pytest.mark.parametrize("name", list(MASKS))
@pytest.mark.parametrize("t,s", [(203, 203), (150, 203)])
def test_sums_equal_the_dense_weights(name, t, s):
    q, k, v = tensors(t=t, s=s)
    mod = MASKS[name]
    if name == "documents" and t != s:  # the queries are the last t of s positions
        mod = lambda b, h, qi, kj: (kj <= qi + (s - t)) & ((qi + (s - t)) // 70 == kj // 70)  # noqa: E731
    bm = None if mod is None else qkv.create_block_mask(mod, None, 4, t, s, block_size=32)
    q32, k32, v32 = (a.float() for a in (q, k, v))
    _, lse = qkv.scaled_dot_product_attention(q32, k32, v32, block_mask=bm, return_lse=True,
                                              enable_gqa=True)
    ref, plain = dense_weights(q, k, v, bm, torch.float64), dense_weights(q, k, v, bm, torch.float32)

    got = attention_received(q32, k32, lse, block_mask=bm, enable_gqa=True)
    assert got.shape == (2, 4, s) and got.dtype == torch.float32
    assert_within(got, ref.sum(-2), plain.sum(-2), what=f"received ({name})")

    heads = [3, 1]
    got = attention_received(q32, k32, lse, heads=heads, block_mask=bm, enable_gqa=True)
    assert_within(got, ref[:, heads].sum(-2), plain[:, heads].sum(-2), what="received, 2 heads")

    r = torch.zeros(2, t, dtype=torch.float64)
    r[0, t - 1], r[1, :40] = 1.0, torch.linspace(0, 1, 40, dtype=torch.float64)  # one row; a ramp
    got = attention_received(q32, k32, lse, block_mask=bm, enable_gqa=True, row_weights=r)
    assert got.shape == (2, 4, 2, s)
    assert_within(got, r @ ref, r.float() @ plain, what="row vector × weights")

    for block in (32, 64, 50):  # the mask's own tiles, coarser ones, ones that cut its tiles
        got = attention_block_sums(q32, k32, lse, block_mask=bm, block=block, enable_gqa=True)
        assert got.shape == (2, 4, math.ceil(t / block), math.ceil(s / block))
        assert_within(got, tiles_of(ref, block), tiles_of(plain, block),
                      what=f"tiles of {block} ({name})")


def test_excluded_keys_and_empty_rows_get_exactly_zero():
    t = 200
    q, k, v = (a.float() for a in tensors(h=2, h_kv=2, t=t, s=t))
    # rows 0…49 see no key; the rest a window of 10
    mod = and_masks(sliding_window(10, 0), lambda b, h, qi, kj: qi >= 50)
    bm = qkv.create_block_mask(mod, None, None, t, t, block_size=32)
    _, lse = qkv.scaled_dot_product_attention(q, k, v, block_mask=bm, return_lse=True)
    got = attention_received(q, k, lse, block_mask=bm)
    assert torch.equal(got[..., t - 10 + 1:] > 0, torch.ones_like(got[..., t - 9:], dtype=torch.bool))
    assert bool((got[..., :40] == 0).all())  # keys 0…39: their rows (≤ 49) see nothing
    tiles = attention_block_sums(q, k, lse, block_mask=bm, block=32)
    assert bool((tiles[..., 0, :] == 0).all())  # rows 0…31
    assert bool((tiles.tril(-2) == 0).all() and (tiles.triu(1) == 0).all())  # the band only


def test_bad_arguments_are_named():
    q, k, v = (a.float() for a in tensors(t=40, s=40))
    _, lse = qkv.scaled_dot_product_attention(q, k, v, return_lse=True, enable_gqa=True)
    with pytest.raises(ValueError, match="enable_gqa"):
        attention_received(q, k, lse)
    with pytest.raises(ValueError, match="lse must have shape"):
        attention_received(q, k, lse[..., :3], enable_gqa=True)
    with pytest.raises(ValueError, match="row_weights"):
        attention_received(q, k, lse, enable_gqa=True, row_weights=torch.ones(3))
    for block in (0, 10**12, 129):  # issue 31: 10**12 was the allocator's RuntimeError (nk · block)
        with pytest.raises(ValueError, match=rf"^block must be a whole number of tokens in 1–128 .*got {block}"):
            attention_block_sums(q, k, lse, enable_gqa=True, block=block)
    with pytest.raises(ValueError, match="heads"):
        attention_received(q, k, lse, enable_gqa=True, heads=[7])
