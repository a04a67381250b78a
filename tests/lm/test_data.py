"""The synthetic data: copies are copies, batches are a pure function of (seed, step)."""

from __future__ import annotations

import random

import torch

from qkv.lm.data import (
    BOS_ID, VOCAB_SIZE, WORDS, DataConfig, build_tokenizer, get_batch, sample_sequence, text_of,
    valid_batch,
)


def test_predictable_words_continue_an_earlier_occurrence():
    rng = random.Random(0)
    cfg = DataConfig(seq_len=200, copy_prob=0.1)
    for _ in range(20):
        ids, pred = sample_sequence(rng, cfg)
        assert len(ids) == len(pred) == 200
        for i, p in enumerate(pred):
            if p:  # some earlier j has ids[j - 1] == ids[i - 1] and ids[j] == ids[i]
                assert any(ids[j - 1] == ids[i - 1] and ids[j] == ids[i] for j in range(1, i)), i
    assert 0.2 < sum(pred) / len(pred) < 0.6  # a real share of the words needs induction
    ids, pred = sample_sequence(rng, DataConfig(seq_len=200))
    assert sum(pred) / len(pred) > 0.6  # the shipped model's data: most words are copies


def test_batches_are_pure_functions_of_seed_and_step():
    cfg = DataConfig(seq_len=40)
    a = get_batch(cfg, batch_size=3, seed=1, step=5)
    assert torch.equal(a.ids, get_batch(cfg, batch_size=3, seed=1, step=5).ids)
    assert not torch.equal(a.ids, get_batch(cfg, batch_size=3, seed=1, step=6).ids)
    assert not torch.equal(a.ids, get_batch(cfg, batch_size=3, seed=2, step=5).ids)
    assert not torch.equal(valid_batch(cfg, batch_size=3, seed=1).ids, get_batch(cfg, batch_size=3, seed=1, step=0).ids)
    assert (a.ids[:, 0] == BOS_ID).all() and a.ids.max() < VOCAB_SIZE and a.num_tokens == 120


def test_the_tokenizer_reads_the_words_back():
    tok = build_tokenizer()
    b = get_batch(DataConfig(seq_len=30), batch_size=1, seed=0, step=0)
    text = text_of(b.ids[0, 1:])
    assert tok.encode(text).ids == b.ids[0].tolist()  # <bos> put first by the tokenizer
    assert len(WORDS) == len(set(WORDS)) == 256


def test_the_rule_words_follow_the_word_two_back():
    from qkv.lm.data import RULE

    rng = random.Random(1)
    ids, pred = sample_sequence(rng, DataConfig(seq_len=400, copy_prob=0.0, rule_prob=0.5))
    hits = sum(ids[i] - 2 == RULE[ids[i - 2] - 2] for i in range(2, 400))
    assert 0.4 < hits / 398 < 0.6  # half by the rule (plus ~1/256 by chance)
    assert not any(pred)
