"""Induction and previous-token scores: hand-built attention patterns give the expected numbers;
the repeated random sequences are what the module docstring draws; chance is uniform attention."""

from __future__ import annotations

import pytest
import torch

from qkv.errors import QkvError
from qkv.explain.probes.induction import (
    INDUCTION_PATTERN, PREVIOUS_TOKEN_PATTERN, attention_on, induction_probe, induction_scores_of, previous_token_scores_of,
    repeated_random_tokens,
)
from qkv.lm.data import BOS_ID, VOCAB_SIZE, build_tokenizer
from qkv.models.llama import LlamaConfig, LlamaModel
from qkv.models.tokenizer import Tokenizer


def causal_uniform(t: int) -> torch.Tensor:
    """(t, t) weights of a head that spreads its attention evenly over the visible keys."""
    return torch.tril(torch.ones(t, t, dtype=torch.float64)) / torch.arange(1, t + 1).unsqueeze(1)


def pattern(t: int, offset: int) -> torch.Tensor:
    """(t, t) one-hot: query q attends to key max(q − offset, 0)."""
    w = torch.zeros(t, t, dtype=torch.float64)
    for q in range(t):
        w[q, max(q - offset, 0)] = 1.0
    return w


@pytest.mark.parametrize("n, prefix", [(3, 1), (7, 1), (5, 0), (11, 2)])
def test_hand_built_heads_score_as_expected(n, prefix):
    t = prefix + 2 * n
    heads = torch.stack([pattern(t, n - 1), pattern(t, 1), pattern(t, 0), causal_uniform(t)])  # (4, t, t)
    weights = heads.unsqueeze(0).repeat(2, 1, 1, 1)  # (b=2, h=4, t, t)
    ind = induction_scores_of(weights, n)
    prev = previous_token_scores_of(weights)
    # head 0 is a perfect induction head, head 1 a perfect previous-token head, head 2 attends to
    # itself, head 3 is uniform: its scores are chance by definition.
    assert ind[0] == 1.0 and ind[1] == (1.0 if n == 2 else 0.0) and ind[2] == 0.0
    assert prev[1] == 1.0 and prev[2] == 0.0
    assert ind[3] == pytest.approx(INDUCTION_PATTERN.chance(t, n, causal=True), rel=1e-12)
    assert prev[3] == pytest.approx(PREVIOUS_TOKEN_PATTERN.chance(t, n, causal=True), rel=1e-12)


def test_half_attention_on_the_target_scores_one_half():
    n, t = 4, 9
    w = 0.5 * pattern(t, n - 1) + 0.5 * pattern(t, 0)
    assert induction_scores_of(w[None, None], n).item() == 0.5


def test_chance_is_the_mean_of_one_over_visible_keys():
    # t = 1 + 2·3: second-copy queries 4, 5, 6 see 5, 6, 7 keys.
    assert INDUCTION_PATTERN.chance(7, 3, causal=True) == pytest.approx((1 / 5 + 1 / 6 + 1 / 7) / 3, rel=1e-15)
    assert INDUCTION_PATTERN.chance(7, 3, causal=False) == pytest.approx(1 / 7, rel=1e-15)
    assert PREVIOUS_TOKEN_PATTERN.chance(3, 1, causal=True) == pytest.approx((1 / 2 + 1 / 3) / 2, rel=1e-15)


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match=r"t >= 2n"):
        induction_scores_of(torch.zeros(1, 1, 5, 5), 3)
    with pytest.raises(ValueError, match=r"\(b, h, t, t\)"):
        previous_token_scores_of(torch.zeros(1, 1, 5, 4))


def tiny_llama() -> LlamaModel:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB_SIZE, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, max_position_embeddings=64)
    # the tokenizer's limit is the model's positions, as qkv.load gives it (the protocol's limit)
    tokenizer = Tokenizer(build_tokenizer(), name="tiny", max_length=config.max_position_embeddings)
    return LlamaModel(config, tokenizer=tokenizer, name="tiny").eval()


def test_sequences_are_bos_then_r_twice_without_specials():
    ids = repeated_random_tokens(tiny_llama(), sequences=4, length=10, seed=3)
    assert ids.shape == (4, 21)
    assert (ids[:, 0] == BOS_ID).all()
    assert torch.equal(ids[:, 1:11], ids[:, 11:])
    assert (ids[:, 1:] >= 2).all()  # <bos> and <unk> are never drawn
    assert all(len(set(row[1:11].tolist())) == 10 for row in ids)  # without replacement


def test_a_random_model_scores_near_chance_and_the_result_reads_well():
    r = induction_probe(tiny_llama(), "induction", sequences=4, length=10)
    assert r.scores.shape == (2, 4) and r.prefix == ("<bos>",) and r.causal
    # Each score is a mean of weights w_iq at chosen keys and chance the mean of 1/(i+1) over the
    # same queries, so |score − chance| ≤ D, the largest gap between a row and uniform attention
    # over its visible keys — measured on the model's own weights for these sequences.
    ids = repeated_random_tokens(tiny_llama(), sequences=4, length=10, seed=0)
    t = ids.shape[1]
    uniform = torch.tril(torch.ones(t, t)) / torch.arange(1, t + 1)[:, None]  # (t, t)
    q = slice(t - 10, t)  # the second copy's queries, the ones the score averages over
    D = torch.stack([(w[:, :, q] - uniform[q]).abs().amax((0, 2, 3)) for w in attention_on(tiny_llama(), ids)])
    eps = torch.finfo(torch.float32).eps  # 1/(i+1) and the gap each rounded in float32
    assert ((r.scores - r.chance).abs() <= D.double() + eps).all(), (r.scores, r.chance, D)
    d = r.to_dict()
    assert d["heads"][0]["score"] == max(float(s) for s in r.scores.flatten())
    with pytest.raises(QkvError, match="unknown probe 'copy'"):
        induction_probe(tiny_llama(), "copy")
    with pytest.raises(QkvError, match="the probe's sequences are 201 tokens; tiny takes at most 64"):
        induction_probe(tiny_llama(), "induction", length=100)
    assert induction_probe(tiny_llama(), "induction", sequences=1).length == 25  # 51 ≤ 64 tokens
