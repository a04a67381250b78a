"""Positions: sinusoidal (the formula, in fp64), learned (offsets), rotary (norms, relative
positions, and Hugging Face's Llama implementation as a peer) and ALiBi (the paper's slopes, and
BLOOM's implementation as a peer)."""

from __future__ import annotations

import doctest
import math
import os

import pytest
import torch

import qkv.modules.positional
from qkv.modules import ALiBi, LearnedPositionalEmbedding, RotaryEmbedding, SinusoidalPositionalEncoding

os.environ.setdefault("HF_HUB_OFFLINE", "1")


# -- sinusoidal ------------------------------------------------------------------------------------

@pytest.mark.parametrize("dim", [8, 7, 64])
def test_sinusoidal_values_equal_the_formula(dim):
    max_len = 300
    pe = SinusoidalPositionalEncoding(dim, max_len=max_len)
    want = torch.zeros(max_len, dim, dtype=torch.float64)
    for p in range(max_len):
        for c in range(dim):
            angle = p / 10000 ** ((c - c % 2) / dim)  # the pair (2i, 2i+1) shares 10000^(2i/d)
            want[p, c] = math.sin(angle) if c % 2 == 0 else math.cos(angle)
    got = pe(torch.zeros(1, max_len, dim, dtype=torch.float64))[0]
    # the table is stored in fp32: one rounding of a number of size <= 1
    torch.testing.assert_close(got, want, rtol=0, atol=2**-24)


def test_sinusoidal_adds_the_rows_at_the_offset():
    pe = SinusoidalPositionalEncoding(6, max_len=20)
    x = torch.randn(2, 4, 6)
    full = pe(torch.zeros(1, 20, 6))[0]
    torch.testing.assert_close(pe(x, offset=9), x + full[9:13])
    assert pe(x.double()).dtype == torch.float64


@pytest.mark.parametrize("module", [SinusoidalPositionalEncoding(4, max_len=10),
                                    LearnedPositionalEmbedding(10, 4)], ids=["sinusoidal", "learned"])
@pytest.mark.parametrize("t, offset, message", [(11, 0, "positions 0..10"), (3, 8, "positions 8..10"),
                                                (2, -1, "positions -1..0")])
def test_positions_beyond_the_table_are_refused(module, t, offset, message):
    with pytest.raises(ValueError, match=f"{message} exceed the 10 positions it has"):
        module(torch.zeros(1, t, 4), offset=offset)


def test_sinusoidal_sizes_must_be_positive():
    with pytest.raises(ValueError, match=r"dim \(0\)"):
        SinusoidalPositionalEncoding(0)


# -- learned ---------------------------------------------------------------------------------------

def test_learned_embedding_adds_its_rows_at_the_offset_and_trains_only_those():
    torch.manual_seed(0)
    emb = LearnedPositionalEmbedding(16, 5)
    x = torch.randn(2, 3, 5)
    out = emb(x, offset=4)
    torch.testing.assert_close(out, x + emb.weight[4:7])
    out.sum().backward()
    used = emb.weight.grad.abs().sum(-1) != 0
    assert used.nonzero().flatten().tolist() == [4, 5, 6]


# -- rotary ----------------------------------------------------------------------------------------

def test_rotary_preserves_norms():
    rope = RotaryEmbedding(16)
    x = torch.randn(2, 3, 50, 16, dtype=torch.float64)
    for offset in (0, 7, 1000):
        # cos and sin come from fp32 angles: cos² + sin² = 1 within ~1e-7
        torch.testing.assert_close(rope(x, offset=offset).norm(dim=-1), x.norm(dim=-1), rtol=1e-6, atol=0)


def test_rotary_scores_depend_only_on_the_position_difference():
    rope = RotaryEmbedding(32)
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(32, generator=gen, dtype=torch.float64).expand(1, 1, 1, 32)
    k = torch.randn(32, generator=gen, dtype=torch.float64).expand(1, 1, 1, 32)

    def score(m, n):
        return (rope(q, offset=m) * rope(k, offset=n)).sum().item()

    for m, n in ((5, 2), (2, 5), (9, 9)):
        base = score(m, n)
        for shift in (1, 13, 200):
            assert score(m + shift, n + shift) == pytest.approx(base, rel=1e-5, abs=1e-5)
    # and it does depend on the difference
    assert abs(score(5, 2) - score(5, 3)) > 1e-3


def test_rotary_equals_the_rotate_half_formula_in_fp64():
    d, t, offset, base = 8, 6, 3, 10000.0
    x = torch.randn(1, 2, t, d, dtype=torch.float64)
    want = torch.empty_like(x)
    for p in range(t):
        for i in range(d // 2):
            theta = (p + offset) * base ** (-2 * i / d)
            a, b = x[..., p, i], x[..., p, i + d // 2]
            want[..., p, i] = a * math.cos(theta) - b * math.sin(theta)
            want[..., p, i + d // 2] = a * math.sin(theta) + b * math.cos(theta)
    # angles are computed in fp32 (as Llama's reference does): positions < 10 lose ~1e-6
    torch.testing.assert_close(RotaryEmbedding(d)(x, offset=offset), want, rtol=0, atol=1e-5)


def test_rotary_equals_hugging_face_llama():
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    config = LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=128)
    q, k = torch.randn(2, 4, 9, 16), torch.randn(2, 2, 9, 16)
    position_ids = torch.arange(20, 29).expand(2, 9)
    cos, sin = LlamaRotaryEmbedding(config)(q, position_ids)
    want_q, want_k = apply_rotary_pos_emb(q, k, cos, sin)
    rope = RotaryEmbedding(16)
    torch.testing.assert_close(rope(q, offset=20), want_q)
    torch.testing.assert_close(rope(k, offset=20), want_k)


def test_rotary_needs_an_even_head_dim():
    with pytest.raises(ValueError, match="even head_dim, got 7"):
        RotaryEmbedding(7)


# -- ALiBi -----------------------------------------------------------------------------------------

def test_alibi_slopes_for_8_heads_are_2_to_the_minus_1_to_8():
    assert ALiBi(8).slopes.tolist() == [2.0 ** -i for i in range(1, 9)]
    assert ALiBi(4).slopes.tolist() == [2.0 ** -i for i in (2, 4, 6, 8)]


@pytest.mark.parametrize("n", [1, 6, 8, 12, 16])
def test_alibi_slopes_equal_bloom(n):
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    # BLOOM's tensor is slope_h · position; at position 1 it is the slope itself
    bloom = build_alibi_tensor(torch.ones(1, 2), n, torch.float64)[:, 0, 1]
    torch.testing.assert_close(ALiBi(n).slopes.double(), bloom, rtol=1e-6, atol=0)


def test_alibi_bias_is_minus_slope_times_distance_bottom_right():
    alibi = ALiBi(2)
    t, s = 3, 5
    bias = alibi.bias(t, s)
    assert bias.shape == (2, t, s)
    for h, m in enumerate(alibi.slopes.tolist()):
        for i in range(t):
            for j in range(s):
                assert bias[h, i, j].item() == pytest.approx(-m * abs(i + s - t - j))


def test_docstring_examples_run():
    assert doctest.testmod(qkv.modules.positional, extraglobs={"torch": torch}).failed == 0
