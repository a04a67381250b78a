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
    cfg = BatchConfig(seq_len=64, copy_prob=0.5, min_span=4, max_span=8, copy_len=32)
    a = get_batch(stream, cfg, batch_size=8, seed=1, step=7)
    b = get_batch(stream, cfg, batch_size=8, seed=1, step=7)
    c = get_batch(stream, cfg, batch_size=8, seed=1, step=8)
    assert torch.equal(a.ids, b.ids) and torch.equal(a.copies, b.copies)
    assert not (torch.equal(a.ids, c.ids) and torch.equal(a.copies, c.copies))
    assert a.ids.shape[1:] == (65,) and a.copies.shape[1:] == (33,)
    assert len(a.ids) + len(a.copies) // 2 == 8 and a.num_tokens == 8 * 64  # a window's tokens either way
    assert bool((a.ids[:, 0] == BOS_ID).all()) and bool((a.copies[:, 0] == BOS_ID).all())


def test_english_windows_are_slices_and_copies_continue_earlier_spans(stream_and_tokenizer):
    stream, _ = stream_and_tokenizer
    text = stream.train.tolist()
    cfg = BatchConfig(seq_len=64, copy_prob=0.5, min_span=4, max_span=8, copy_len=32)
    batch = get_batch(stream, cfg, batch_size=16, seed=0, step=0)
    assert len(batch.ids) and len(batch.copies)  # both kinds at this seed
    for row in batch.ids[:, 1:].tolist():  # an English window is a slice of the training stream
        assert any(text[i:i + 64] == row for i in range(len(text) - 63))
    ids, copied = batch.copies[:, 1:].tolist(), batch.copied[:, 1:].tolist()
    for row, marks in zip(ids, copied):
        assert BOS_ID not in row and 0.3 < sum(marks) / len(marks)
        for i, c in enumerate(marks):  # predictable only by looking back
            assert not c or any(row[j - 1] == row[i - 1] and row[j] == row[i] for j in range(1, i))
    assert not bool(batch.copied[:, 0].any())


def test_early_copies_draw_few_token_ids_and_later_ones_all(stream_and_tokenizer):
    stream, _ = stream_and_tokenizer
    cfg = BatchConfig(seq_len=64, copy_prob=1.0, min_span=5, max_span=5, copy_len=32, copy_vocab=100,
                      copy_steps=3)
    for step in range(3):  # copying sequences of ids < 100 during the first copy_steps
        batch = get_batch(stream, cfg, batch_size=4, seed=0, step=step)
        assert len(batch.ids) == 0 and batch.copies.shape == (8, 33)
        assert bool((batch.copies < 100).all())
    late = get_batch(stream, cfg, batch_size=8, seed=0, step=3)
    assert int(late.copies.max()) >= 100  # after them: the whole vocabulary
    english = get_batch(stream, BatchConfig(seq_len=64, copy_prob=0.0, min_span=5, max_span=5, copy_len=32,
                                            copy_vocab=100, copy_steps=3), batch_size=4, seed=0, step=0)
    assert english.ids.shape == (4, 65) and len(english.copies) == 0


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
