"""The reader's tokenizer, batches and unigram baseline."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from reader_corpus import write_docs
from qkv.errors import QkvError
from qkv.reader.corpus import read_corpus
from qkv.reader.data import (
    BOS_ID, BatchConfig, TokenStream, get_batch, heldout_windows, train_tokenizer, unigram_loss,
)


@pytest.fixture(scope="module")
def stream_and_tokenizer(tmp_path_factory):
    c = read_corpus(write_docs(tmp_path_factory.mktemp("docs")))
    tok = train_tokenizer(c.train, vocab_size=300)
    return TokenStream.of(tok, c.train, c.heldout), tok


def test_byte_level_bpe_puts_bos_first_and_reads_any_text(stream_and_tokenizer):
    _, tok = stream_and_tokenizer
    assert tok.get_vocab_size() == 300
    text = "naïve text — never seen: ünïcode, 数字 and \t tabs"
    enc = tok.encode(text)
    assert enc.ids[0] == BOS_ID and enc.tokens[0] == "<bos>"
    assert tok.decode(enc.ids) == text  # byte level: nothing unknown, nothing lost


def test_batches_are_a_pure_function_of_seed_and_step(stream_and_tokenizer):
    stream, _ = stream_and_tokenizer
    cfg = BatchConfig(seq_len=64, repeat_prob=0.25, random_prob=0.375, min_span=4, max_span=12)
    a = get_batch(stream, cfg, batch_size=4, seed=1, step=7)
    b = get_batch(stream, cfg, batch_size=4, seed=1, step=7)
    c = get_batch(stream, cfg, batch_size=4, seed=1, step=8)
    assert torch.equal(a.ids, b.ids) and not torch.equal(a.ids, c.ids)
    assert a.ids.shape == (4, 65) and bool((a.ids[:, 0] == BOS_ID).all())


def test_a_repeated_window_is_one_segment_written_again(stream_and_tokenizer):
    stream, _ = stream_and_tokenizer
    text = stream.train.tolist()
    for english in (1.0, 0.0):  # an English segment, or random tokens
        cfg = BatchConfig(seq_len=64, repeat_prob=english, random_prob=1.0 - english, min_span=5,
                          max_span=5, random_vocab=100)
        batch = get_batch(stream, cfg, batch_size=4, seed=0, step=0)
        ids, copied = batch.ids[:, 1:], batch.copied[:, 1:]  # after <bos>
        assert torch.equal(ids[:, 5:], ids[:, :-5])  # period 5
        # predictable by looking back: every token of a repeat but its first (position 5)
        assert copied[:, :6].sum() == 0 and bool(copied[:, 6:].all())
        assert bool((ids != BOS_ID).all())
        assert english or bool((ids < 100).all())  # random tokens from the first random_vocab ids
        from_text = [any(text[i:i + 5] == row[:5] for i in range(len(text) - 4)) for row in ids.tolist()]
        assert all(from_text) if english else not any(from_text)
    plain = get_batch(stream, BatchConfig(seq_len=64, repeat_prob=0.0, random_prob=0.0, min_span=4,
                                              max_span=12),
                      batch_size=4, seed=0, step=0)
    assert not bool(plain.copied.any())
    row = plain.ids[0, 1:].tolist()  # a plain window is a slice of the training stream
    assert any(text[i:i + 64] == row for i in range(len(text) - 63))


def test_unigram_loss_is_the_add_one_cross_entropy(stream_and_tokenizer):
    stream, _ = stream_and_tokenizer
    counts, n, V = Counter(stream.train.tolist()), len(stream.train), stream.vocab_size
    held = torch.cat(stream.heldout).tolist()
    ref = -sum(math.log((counts[i] + 1) / (n + V)) for i in held) / len(held)  # float64, by hand
    assert unigram_loss(stream) == pytest.approx(ref, rel=1e-12)


def test_heldout_windows_and_short_texts(stream_and_tokenizer):
    stream, _ = stream_and_tokenizer
    w = heldout_windows(stream, seq_len=32, count=3)
    assert w.shape == (3, 33) and bool((w[:, 0] == BOS_ID).all())
    text = torch.cat(stream.heldout)
    assert torch.equal(w[0, 1:], text[:32])  # the first window starts at the first token
    with pytest.raises(QkvError, match="fewer than --seq-len"):
        heldout_windows(stream, seq_len=10**6, count=1)


def test_the_copying_phase_draws_only_random_repeats(stream_and_tokenizer):
    stream, _ = stream_and_tokenizer
    text = stream.train.tolist()
    cfg = BatchConfig(seq_len=64, repeat_prob=0.0, random_prob=0.0, min_span=5, max_span=5,
                      random_vocab=100, copy_steps=3)
    for step in range(3):  # plain English after the phase, random repeats inside it
        ids = get_batch(stream, cfg, batch_size=4, seed=0, step=step).ids[:, 1:]
        assert torch.equal(ids[:, 5:], ids[:, :-5]) and bool((ids < 100).all())
    late = get_batch(stream, cfg, batch_size=4, seed=0, step=3)
    assert not bool(late.copied.any())
    row = late.ids[0, 1:].tolist()
    assert any(text[i:i + 64] == row for i in range(len(text) - 63))
