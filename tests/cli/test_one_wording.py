"""One condition, one sentence, whichever command meets it (issue 40): the same bad input given
to ``qkv explain``, ``heads``, ``why``, ``view --file``, ``needle`` and ``atlas`` ends in the same
one-line error, up to the flag that carried it (``--token`` / ``--to``) and the unit it counts
(``token`` / ``word``: ``heads --to`` picks words). A text longer than the model was worded two
ways before: ``explain`` named ``--model reader``, ``why`` and ``view --file`` a Python
``truncate=True``.
"""

from __future__ import annotations

import re

import pytest

from qkv.cli import main

TEXT = "baka bela dima"
LONG = "baka bela dima " * 40  # 121 tokens; the shipped lm takes 65


@pytest.fixture
def files(tmp_path):
    (tmp_path / "short.txt").write_text(TEXT)
    (tmp_path / "long.txt").write_text(LONG)
    return tmp_path


def commands(text: str, path, model: str, token: str) -> dict[str, list[str]]:
    """Each command given ``text`` (or the file holding it), ``model`` and, where it takes one, a
    token to explain."""
    return {
        "explain": ["explain", text, "--model", model, "--token", token],
        "heads": ["heads", text, "--model", model, "--to", token],
        "why": ["why", text, "--model", model, "--token", token, "--to", "baka", "--layer", "0",
                "--head", "0"],
        "view --file": ["view", "--file", str(path), "--model", model, "--no-browser"],
        "needle": ["needle", "--model", model, "--lengths", "50"],
        "atlas": ["atlas", "--model", model, "--file", str(path)],
    }


def errors(capsys, runs: dict[str, list[str]]) -> dict[str, str]:
    out = {}
    for name, argv in runs.items():
        code = main(argv)
        err = [x for x in capsys.readouterr().err.splitlines() if x.startswith("qkv: error:")]
        assert code == 2 and len(err) == 1, (name, code, err)
        out[name] = err[0]
    return out


def shape(message: str) -> str:
    """The sentence without what differs by command: the flag that named the token, its unit."""
    message = re.sub(r"--(token|to)\b", "FLAG", message)
    return re.sub(r"\b(token|word)(s?)\b", r"UNIT\2", message)


def test_a_text_longer_than_the_model_is_one_sentence(capsys, files):
    runs = commands(LONG, files / "long.txt", "lm", "baka")
    got = errors(capsys, {k: runs[k] for k in ("explain", "heads", "why", "view --file")})
    assert len(set(got.values())) == 1, got
    assert next(iter(got.values())) == (
        "qkv: error: the text is 121 tokens and qkv-lm takes at most 65; shorten it, or read it "
        "with --model reader (up to 131,072 tokens)")


def test_an_unknown_model_is_one_sentence(capsys, files):
    got = errors(capsys, commands(TEXT, files / "short.txt", "nosuch", "baka"))
    assert len(set(got.values())) == 1, got
    assert next(iter(got.values())).startswith("qkv: error: unknown model 'nosuch': known names are")


def test_a_token_not_in_the_text_is_one_sentence(capsys, files):
    runs = commands(TEXT, files / "short.txt", "lm", "zebra")
    got = errors(capsys, {k: runs[k] for k in ("explain", "heads", "why")})
    assert len({shape(m) for m in got.values()}) == 1, got
    assert shape(got["explain"]) == ("qkv: error: FLAG 'zebra' is not a UNIT of the text; the UNITs "
                                     "are: 0:<bos> 1:baka 2:bela 3:dima")
