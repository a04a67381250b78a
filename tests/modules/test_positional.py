"""Positions: sinusoidal (the formula, in fp64), learned (offsets), rotary (norms, relative
positions, and Hugging Face's Llama implementation as a peer) and ALiBi (the paper's slopes, and
BLOOM's implementation as a peer).

Tolerances are derived from where each computation rounds: the sinusoidal table and the rotary
angles are float32 numbers (each bound below says which roundings it allows), and against a
peer, :func:`tolerance.assert_within`.
"""

from __future__ import annotations

import doctest
import math
import os

import pytest
import torch

import qkv.modules.positional
from qkv.modules import ALiBi, LearnedPositionalEmbedding, RotaryEmbedding, SinusoidalPositionalEncoding
from tolerance import assert_within

EPS32, EPS64 = torch.finfo(torch.float32).eps, torch.finfo(torch.float64).eps

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
    # The table is computed in fp64 (angles off by ~300 · a few eps64 ≈ 1e-13 from the formula's)
    # and stored in fp32: one rounding of a number |v| <= 1, at most half an ulp = 2^-25.
    # 2^-24 bounds the sum.
    assert (got - want).abs().max() <= 2**-24


def test_sinusoidal_adds_the_rows_at_the_offset():
    pe = SinusoidalPositionalEncoding(6, max_len=20)
    x = torch.randn(2, 4, 6)
    full = pe(torch.zeros(1, 20, 6))[0]
    assert torch.equal(pe(x, offset=9), x + full[9:13])  # exact: 0 + v = v, then the same sum
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
    assert torch.equal(out, x + emb.weight[4:7])  # exact: the same sum
    out.sum().backward()
    used = emb.weight.grad.abs().sum(-1) != 0
    assert used.nonzero().flatten().tolist() == [4, 5, 6]


# -- rotary ----------------------------------------------------------------------------------------

def test_rotary_preserves_norms():
    rope = RotaryEmbedding(16)
    x = torch.randn(2, 3, 50, 16, dtype=torch.float64)
    for offset in (0, 7, 1000):
        # cos and sin are float32 numbers, each within 1 ulp (<= eps32 relative) of the true cos
        # and sin of its angle: cos² + sin² = 1 + δ with |δ| <= 2·eps32, so a rotated pair's
        # length is off by a factor sqrt(1 + δ), |δ|/2 <= eps32. Twice that, for the fp64 rest.
        ratio = rope(x, offset=offset).norm(dim=-1) / x.norm(dim=-1)
        assert (ratio - 1).abs().max() <= 2 * EPS32, offset


def test_rotary_scores_depend_only_on_the_position_difference():
    rope = RotaryEmbedding(32)
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(32, generator=gen, dtype=torch.float64).expand(1, 1, 1, 32)
    k = torch.randn(32, generator=gen, dtype=torch.float64).expand(1, 1, 1, 32)

    def score(m, n):
        return (rope(q, offset=m) * rope(k, offset=n)).sum().item()

    # How far a score may be from its exact value. Pair i (features i, i + d/2) contributes
    # r_i·cos(θ_m,i − θ_n,i + φ_i), r_i = |q pair i|·|k pair i|. The angle θ = p·f_i is a float32
    # product, off by <= ½ ulp(θ) (f_i itself is a float32 number shared by every position, so
    # it cancels in θ_m − θ_n); cos and sin of it are off by <= 1 ulp <= eps32, which moves each
    # rotated pair by <= eps32 of its length. So |error| <= Σ_i r_i (δθ_m,i + δθ_n,i + 2·eps32).
    def half_ulp(p):
        angle = p * rope.inv_freq  # (d/2,) exactly as the module computes it, in float32
        return ((torch.nextafter(angle, torch.tensor(math.inf)) - angle) / 2).double()

    r = q[0, 0, 0].view(2, 16).norm(dim=0) * k[0, 0, 0].view(2, 16).norm(dim=0)  # (d/2,)

    def error_bound(m, n):
        return float((r * (half_ulp(m) + half_ulp(n) + 2 * EPS32 + 4 * EPS64)).sum())

    for m, n in ((5, 2), (2, 5), (9, 9)):
        base = score(m, n)
        for shift in (1, 13, 200):
            assert abs(score(m + shift, n + shift) - base) <= error_bound(m, n) + error_bound(
                m + shift, n + shift), (m, n, shift)
    # and it does depend on the difference, by far more than rounding
    assert abs(score(5, 2) - score(5, 3)) > 1e3 * (error_bound(5, 2) + error_bound(5, 3))


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
    # Angles are computed in fp32 (as Llama's reference does): θ = fl(p · fl(f)) is off by
    # <= eps32·θ (two roundings of ½ eps32 each), and cos, sin of it by <= 1 ulp <= eps32 more.
    # Each output a·cos − b·sin (or a·sin + b·cos) is then off by <= (|a| + |b|)·(eps32·θ + eps32).
    theta = (torch.arange(t, dtype=torch.float64) + offset)[:, None] * base ** (
        -2 * torch.arange(d // 2, dtype=torch.float64) / d)  # (t, d/2)
    a, b = x[..., : d // 2], x[..., d // 2 :]
    pair_bound = (a.abs() + b.abs()) * (EPS32 * theta + EPS32 + 4 * EPS64)  # (1, 2, t, d/2)
    err = (RotaryEmbedding(d)(x, offset=offset) - want).abs()
    assert (err <= torch.cat([pair_bound, pair_bound], dim=-1)).all()


def test_rotary_equals_hugging_face_llama():
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    config = LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=128)
    q, k = torch.randn(2, 4, 9, 16), torch.randn(2, 2, 9, 16)
    position_ids = torch.arange(20, 29).expand(2, 9)
    cos, sin = LlamaRotaryEmbedding(config)(q, position_ids)
    plain_q, plain_k = apply_rotary_pos_emb(q, k, cos, sin)  # Llama's, in fp32
    # the truth: the same rotation with fp64 angles and fp64 arithmetic
    theta = torch.arange(20, 29, dtype=torch.float64)[:, None] * 10000.0 ** (
        -torch.arange(0, 16, 2, dtype=torch.float64) / 16)  # (t, d/2)
    cos64, sin64 = theta.cos().repeat(1, 2), theta.sin().repeat(1, 2)  # (t, d)

    def exact(x):
        x = x.double()
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos64 + torch.cat([-x2, x1], dim=-1) * sin64

    rope = RotaryEmbedding(16)
    assert_within(rope(q, offset=20), exact(q), plain_q, what="queries")
    assert_within(rope(k, offset=20), exact(k), plain_k, what="keys")


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
    # BLOOM rounds the base 2^(-8/k) to float32 (½ eps32 relative) and raises it to powers up
    # to k = 2^⌊log2 n⌋ in float32 (the base's error times the power, plus <= 1 ulp); ours is
    # the fp64 value rounded once to float32 (½ eps32). Relative: <= (k/2 + 1 + ½) eps32.
    k = 2 ** math.floor(math.log2(n))
    rel = ((ALiBi(n).slopes.double() - bloom) / bloom).abs()
    assert rel.max() <= (k / 2 + 2) * EPS32


def test_alibi_bias_is_minus_slope_times_distance_bottom_right():
    alibi = ALiBi(2)
    t, s = 3, 5
    bias = alibi.bias(t, s)
    assert bias.shape == (2, t, s)
    for h, m in enumerate(alibi.slopes.tolist()):  # 2^-4, 2^-8: times an integer, exact
        for i in range(t):
            for j in range(s):
                assert bias[h, i, j].item() == -m * abs(i + s - t - j)


def test_docstring_examples_run():
    assert doctest.testmod(qkv.modules.positional, extraglobs={"torch": torch}).failed == 0


def test_rotary_table_is_what_each_call_computes_and_follows_its_frequencies():
    """The kept cos/sin table gives the numbers a fresh computation gives (bit for bit), per
    dtype; a move, a dtype change or an edit of the frequencies is not served stale angles."""
    rope = RotaryEmbedding(8)
    fresh = lambda t, offset=0: RotaryEmbedding(8).cos_sin(t, offset=offset, device="cpu")  # noqa: E731
    for t, offset in ((5, 0), (9, 3), (100, 7), (5, 0)):  # the table grows past 64, then serves
        for got, want in zip(rope.cos_sin(t, offset=offset, device="cpu"), fresh(t, offset)):
            assert torch.equal(got, want)
    positions = torch.tensor([7, 2, 7, 2, 0])
    cos, sin = rope.at(positions, dtype=torch.float64)
    want = RotaryEmbedding(8).cos_sin(5, positions=positions[None], dtype=torch.float64)
    assert torch.equal(cos, want[0][0, 0]) and torch.equal(sin, want[1][0, 0])
    with torch.no_grad():
        rope.inv_freq.mul_(2.0)  # an edit in place: new angles
    doubled = RotaryEmbedding(8)
    with torch.no_grad():
        doubled.inv_freq.mul_(2.0)
    assert torch.equal(rope.cos_sin(5, device="cpu")[0], doubled.cos_sin(5, device="cpu")[0])
    rope.double()  # a new buffer
    assert torch.equal(rope.cos_sin(5, device="cpu")[1], doubled.cos_sin(5, device="cpu")[1])
