"""Word grouping and the --token/--from/--to choice, on the real all-MiniLM-L6-v2 tokenizer."""

import pytest
import torch

from qkv.errors import QkvError
from qkv.explain.select import (
    choose, choose_in, group_columns, group_rows, token_units, word_units,
)
from qkv.models.loading import minilm_dir
from qkv.models.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.from_dir(minilm_dir())


TEXT = "The pizzeria's owner ate it, and it was good."


def test_words_regroup_word_pieces(tok):
    enc = tok.encode(TEXT)
    words = word_units(enc, TEXT)
    assert "pizzeria" in words.labels  # one word, whatever the word pieces
    group = words.groups[words.labels.index("pizzeria")]
    assert len(group) > 1, "the test needs a word the tokenizer splits"
    assert [enc.tokens[i] for i in group][0] == "pi"
    # every token belongs to exactly one unit, in order
    assert [i for g in words.groups for i in g] == list(range(len(enc.ids)))
    assert words.labels[0] == "[CLS]" and words.labels[-1] == "[SEP]"
    assert words.special[0] and words.special[-1] and not any(words.special[1:-1])
    assert words.labels[1] == "The"  # the text as typed, not the lower-cased token


def test_tokens_are_one_unit_each(tok):
    enc = tok.encode(TEXT)
    units = token_units(enc)
    assert units.labels == enc.tokens and units.groups == [(i,) for i in range(len(enc.ids))]


@pytest.mark.parametrize("t", [1, 3, 7])  # query rows: one token, a few, fewer than the s tokens
def test_grouping_keeps_distributions(tok, t):
    enc = tok.encode(TEXT)
    words = word_units(enc, TEXT)
    s, U = len(enc.ids), len(words)
    w = torch.rand(2, t, s, dtype=torch.float64).softmax(-1)  # (h, t, s): t query rows
    cols = group_columns(w, words)  # (h, t, U)
    assert cols.shape == (2, t, U)
    assert torch.allclose(cols.sum(-1), torch.ones(2, t, dtype=torch.float64))
    # "into a word: summed", checked against a plain loop over the t rows
    u = words.labels.index("pizzeria")
    g = list(words.groups[u])
    for row in range(t):
        assert torch.allclose(cols[:, row, u], sum(w[:, row, j] for j in g))
    # "from a word: averaged": rows over the s tokens, any last dim (here t)
    x = torch.rand(2, s, t, dtype=torch.float64)  # (h, s, t)
    rows = group_rows(x, words)  # (h, U, t)
    assert rows.shape == (2, U, t)
    assert torch.allclose(rows[:, u], sum(x[:, j] for j in g) / len(g))
    full = torch.rand(2, s, s, dtype=torch.float64).softmax(-1)  # (h, s, s): every token's row
    both = group_rows(group_columns(full, words), words)  # (h, U, U)
    assert torch.allclose(both.sum(-1), torch.ones(2, U, dtype=torch.float64))


def test_choose_last_occurrence_with_note(tok):
    enc = tok.encode(TEXT)
    units = token_units(enc)
    it = [i for i, x in enumerate(enc.tokens) if x == "it"]
    c = choose("it", units)
    assert c.unit == it[-1]
    note = str(c.note)
    assert "occurs 2 times" in note and "it@0" in note and str(it[0]) in note
    assert choose("it@0", units).unit == it[0] and choose("IT@1", units).note is None


def test_choose_default_is_last_word(tok):
    enc = tok.encode(TEXT)
    units = word_units(enc, TEXT)
    assert units.labels[choose(None, units).unit] == "good"  # not the final "."
    assert choose(None, token_units(tok.encode("?!"))).unit == 2  # no word: the last non-special


@pytest.mark.parametrize("spec, message", [
    ("cat", "'cat' is not a token of the text; the tokens are: 0:[CLS] 1:the"),
    ("99", "token 99 is out of range: the text has"),
    ("-1", "token -1 is out of range"),
    ("it@2", "'it' occurs 2 time(s) (occurrences count from 0: it@0 … it@1)"),
])
def test_choose_errors_name_the_value(tok, spec, message):
    units = token_units(tok.encode(TEXT))
    with pytest.raises(QkvError) as e:
        choose(spec, units)
    assert message in str(e.value) and "\n" not in str(e.value)
    assert str(e.value).startswith("token ") and e.value.argument == "token"


def test_errors_and_notes_name_the_role_they_were_given(tok):
    """The caller's role names the argument; the CLI re-spells roles as its flags."""
    units = token_units(tok.encode(TEXT))
    with pytest.raises(QkvError) as e:
        choose("cat", units, role="target")
    assert str(e.value).startswith("target 'cat' is not a token")
    assert str(e.value.spelled({"target": "--to"})).startswith("--to 'cat' is not a token")
    note = choose("it", units, role="source").note
    assert "Pick another with source it@0 (occurrences count from 0) or source" in str(note)
    assert "Pick another with --from it@0" in note.spelled({"source": "--from"})


def test_split_word_found_in_token_mode(tok):
    enc = tok.encode(TEXT)
    units, c = choose_in("pizzeria", enc, TEXT, words=False)
    assert not units.words
    word = word_units(enc, TEXT)
    assert c.unit == word.groups[word.labels.index("pizzeria")][-1]
    assert "Add words=True to treat it as one word." in str(c.note)
    assert "Add --words to treat it as one word." in c.note.spelled({"words": "--words"})
    units, c = choose_in("pizzeria", enc, TEXT, words=True)
    assert units.labels[c.unit] == "pizzeria" and c.note is None
