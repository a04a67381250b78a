"""Word-level tokenizers trained on the corpus: they agree with the grammar's own tokenisation."""

from __future__ import annotations

import pytest

from qkv.errors import QkvError
from qkv.translate.data import load_splits
from qkv.translate.grammar import lexicon, tokenize_fr
from qkv.translate.vocab import BOS_ID, EOS_ID, PAD_ID, SPECIALS, UNK_ID, Vocab, normalize_en


@pytest.fixture(scope="module")
def splits():
    return load_splits(0)


@pytest.fixture(scope="module")
def vocab(splits):
    return Vocab.train([p.en for p in splits.train], [p.fr for p in splits.train])


def test_vocabulary_is_the_grammars_lexicon(vocab):
    # Every word of the grammar occurs in training (only combinations are held out).
    assert vocab.words("en") == sorted(lexicon().en)
    assert vocab.words("fr") == sorted(lexicon().fr)
    for i, special in enumerate(SPECIALS):
        assert vocab.en.token_to_id(special) == vocab.fr.token_to_id(special) == i
    assert (PAD_ID, BOS_ID, EOS_ID, UNK_ID) == (0, 1, 2, 3)


def test_tokens_match_the_grammar_on_every_test_pair(vocab, splits):
    for p in splits.test:
        assert vocab.en.encode(p.en, add_special_tokens=False).tokens == list(p.en_tokens)
        assert vocab.fr.encode(p.fr, add_special_tokens=False).tokens == list(p.fr_tokens)
        ids = vocab.encode_fr(p.fr)
        assert ids[0] == BOS_ID and ids[-1] == EOS_ID
        assert vocab.decode_fr(ids[1:]) == p.fr  # detokenised, apostrophes glued back
        assert vocab.fr_tokens(ids) == tokenize_fr(p.fr)


def test_english_is_normalised_before_encoding(vocab):
    assert normalize_en("  The CAT   is red. ") == "the cat is red"
    assert vocab.encode_en("The cat is red!") == vocab.encode_en("the cat is red")
    assert vocab.encode_en("the cat is red")[-1] == EOS_ID


def test_unknown_words_are_refused_with_their_list(vocab):
    assert vocab.unknown_words("the zebra eats a purple zebra") == ["zebra", "purple"]
    with pytest.raises(QkvError, match=r"unknown English words 'zebra', 'purple' in 'the zebra"):
        vocab.encode_en("the Zebra eats a purple zebra")
    with pytest.raises(QkvError, match=r"unknown English word 'cat,'"):
        vocab.encode_en("the cat, the dog")


@pytest.mark.parametrize("text", ["", "   ", "."])
def test_empty_text_is_refused(vocab, text):
    with pytest.raises(QkvError, match="nothing to translate"):
        vocab.encode_en(text)


def test_save_load_round_trip_and_corrupt_files(vocab, tmp_path):
    vocab.save(tmp_path)
    again = Vocab.load(tmp_path)
    assert again.en.get_vocab() == vocab.en.get_vocab()
    assert again.fr.get_vocab() == vocab.fr.get_vocab()
    (tmp_path / "tokenizer_fr.json").write_text("{not json")
    with pytest.raises(QkvError, match="tokenizer_fr.json: not a valid tokenizer file"):
        Vocab.load(tmp_path)
    (tmp_path / "tokenizer_fr.json").unlink()
    with pytest.raises(QkvError, match="missing tokenizer file tokenizer_fr.json"):
        Vocab.load(tmp_path)
