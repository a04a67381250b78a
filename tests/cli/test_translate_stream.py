"""``qkv translate`` on standard input: one bad line is reported and skipped, never the stream."""

import io
import sys

from qkv.cli import main


def run_stdin(capsys, monkeypatch, data: bytes, *argv):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))
    code = main(["translate", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_an_unknown_word_midway_does_not_drop_the_rest(capsys, monkeypatch):
    """Issue 9: an unknown word on line 5,001 of 10,000 stopped the stream. Here line 31 of 60."""
    lines = ["the cat is red"] * 60
    lines[30] = "the zebra is red"
    code, out, err = run_stdin(capsys, monkeypatch, ("\n".join(lines) + "\n").encode())
    assert code == 2
    assert out.split("\n")[:-1] == ["le chat est rouge"] * 30 + [""] + ["le chat est rouge"] * 29
    assert err.splitlines() == [
        "qkv: line 31: unknown English word 'zebra' in 'the zebra is red'; the model knows 60 "
        "words (qkv translate --vocab lists them); its output line is empty",
        "qkv: error: 1 of 60 lines not translated (line 31); their output lines are empty"]


def test_invalid_utf8_and_a_bom_on_stdin(capsys, monkeypatch):
    data = b"\xef\xbb\xbfthe cat is red\nthe cat \xff is red\r\n\nthe dog is red\n"
    code, out, err = run_stdin(capsys, monkeypatch, data)
    assert code == 2 and out == "le chat est rouge\n\n\nle chien est rouge\n"
    assert err.splitlines() == [
        "qkv: line 2 is not valid UTF-8 (byte 0xff at position 8); its output line is empty",
        "qkv: error: 1 of 4 lines not translated (line 2); their output lines are empty"]


def test_a_latin1_file_names_its_first_bad_line(capsys, monkeypatch):
    code, out, err = run_stdin(capsys, monkeypatch, "the café is red\n".encode("latin-1"))
    assert code == 2 and out == "\n"
    assert err.splitlines()[0] == ("qkv: line 1 is not valid UTF-8 (byte 0xe9 at position 7); "
                                   "its output line is empty")


def test_a_bom_only_stream_is_clean(capsys, monkeypatch):
    code, out, err = run_stdin(capsys, monkeypatch, b"\xef\xbb\xbfthe cat is red\n")
    assert (code, out, err) == (0, "le chat est rouge\n", "")


def test_many_failures_are_counted_on_one_error_line(capsys, monkeypatch):
    code, out, err = run_stdin(capsys, monkeypatch, b"zebra\n" * 7)
    assert code == 2 and out == "\n" * 7
    assert err.splitlines()[-1] == ("qkv: error: 7 of 7 lines not translated (lines 1, 2, 3, 4, 5, "
                                    "…); their output lines are empty")
    assert sum(line.startswith("qkv: error:") for line in err.splitlines()) == 1


def test_invalid_utf8_in_the_argument(capsys):
    code = main(["translate", "the cat \udcff is red"])  # how Python hands argv's byte 0xff over
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err == "qkv: error: the text is not valid UTF-8 (byte 0xff at position 8)\n"
