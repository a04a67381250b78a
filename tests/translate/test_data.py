"""Batches: a pure function of (seed, step), every sentence once per epoch, padded on the right."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from qkv.translate.data import batch_indices, encode_pairs, get_batch, iter_batches, load_splits, pad
from qkv.translate.vocab import BOS_ID, EOS_ID, PAD_ID, Vocab


@pytest.fixture(scope="module")
def corpus():
    splits = load_splits(0)
    vocab = Vocab.train([p.en for p in splits.train], [p.fr for p in splits.train])
    return encode_pairs(splits.valid[:300], vocab)


def test_batch_order_is_a_pure_function_of_seed_and_step():
    a = [batch_indices(1000, 64, seed=3, step=s) for s in (0, 17, 40)]
    b = [batch_indices(1000, 64, seed=3, step=s) for s in (40, 0, 17)]  # any call order
    assert all(torch.equal(x, y) for x, y in zip(a, (b[1], b[2], b[0])))
    assert not torch.equal(batch_indices(1000, 64, seed=4, step=0), a[0])


@pytest.mark.parametrize(("n", "batch_size"), [(1000, 64), (113, 7)])
def test_each_epoch_visits_every_row_at_most_once(n, batch_size):
    per_epoch = n // batch_size
    for epoch in (0, 1):
        rows = torch.cat([batch_indices(n, batch_size, 0, epoch * per_epoch + i) for i in range(per_epoch)])
        assert len(rows) == per_epoch * batch_size == len(set(rows.tolist()))  # no repeats
    first = torch.cat([batch_indices(n, batch_size, 0, i) for i in range(per_epoch)])
    second = torch.cat([batch_indices(n, batch_size, 0, per_epoch + i) for i in range(per_epoch)])
    assert not torch.equal(first, second)  # a fresh permutation each epoch


def test_batch_size_is_checked():
    with pytest.raises(ValueError, match=r"batch_size \(0\) must be in 1..10"):
        batch_indices(10, 0, 0, 0)


def test_batches_are_trimmed_and_right_padded(corpus):
    batch = get_batch(corpus, 16, seed=0, step=5)
    assert batch.src.shape[0] == batch.tgt.shape[0] == 16
    assert (batch.tgt[:, 0] == BOS_ID).all()
    real_src = batch.src != PAD_ID
    assert real_src.sum(1).max() == batch.src.shape[1]  # trimmed to the longest sentence
    # Right padding: once a row is [PAD], it stays [PAD].
    assert (real_src.cummin(dim=1).values == real_src).all()
    assert ((batch.src == EOS_ID).sum(1) == 1).all() and ((batch.tgt == EOS_ID).sum(1) == 1).all()
    assert torch.equal(batch.tgt_in, batch.tgt[:, :-1]) and torch.equal(batch.tgt_out, batch.tgt[:, 1:])
    assert batch.num_tokens == int(real_src.sum() + (batch.tgt_out != PAD_ID).sum())


def test_iter_batches_covers_the_corpus_in_order(corpus):
    rows = torch.cat([b.src[:, :1] for b in iter_batches(corpus, 64)])
    assert torch.equal(rows, corpus.src[:, :1])


def test_cached_splits_cannot_be_changed_by_a_caller():
    splits = load_splits(0)
    assert load_splits(0) is splits  # one object for every caller, so it must be immutable
    assert all(isinstance(part, tuple) for part in (splits.train, splits.valid, splits.test))
    with pytest.raises(dataclasses.FrozenInstanceError):
        splits.train = ()  # type: ignore[misc]


def test_pad():
    assert pad([[5, 6, 7], [8]]).tolist() == [[5, 6, 7], [8, PAD_ID, PAD_ID]]


def test_docstring_examples_of_the_translation_modules():
    import doctest
    import importlib

    names = ["qkv.translate.model", "qkv.translate.data", "qkv.translate.decode",
             "qkv.translate.metrics", "qkv.translate.train", "qkv.translate.vocab"]
    for name in names:
        result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
        assert result.failed == 0 and result.attempted > 0, name
