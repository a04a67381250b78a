"""qkv.text: text from argv, stdin, files and callers decoded in one place."""

import io

import io as _io

import pytest
import pytest as _pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qkv.errors import QkvError
from qkv.text import LINE_BREAKS, TextError, check_one_line, check_text, clean_text, decode, is_blank, read_lines, shown


def test_invalid_utf8_bytes_name_the_byte_and_its_position():
    with pytest.raises(TextError) as e:
        clean_text(b"the cat \xff is red")
    assert str(e.value) == "the text is not valid UTF-8 (byte 0xff at position 8)"
    assert isinstance(e.value, ValueError) and isinstance(e.value, QkvError)


def test_argv_bytes_via_surrogateescape_give_the_same_message():
    argv = b"the cat \xff is red".decode("utf-8", "surrogateescape")  # how Python builds sys.argv
    with pytest.raises(TextError, match=r"^the text is not valid UTF-8 \(byte 0xff at position 8\)$"):
        clean_text(argv)


def test_the_position_counts_bytes_not_characters():
    argv = "été \udce9".encode("utf-8", "surrogateescape").decode("utf-8", "surrogateescape")
    with pytest.raises(TextError, match=r"byte 0xe9 at position 6\)"):
        check_text(argv)
    with pytest.raises(TextError, match=r"byte 0xe9 at position 6\)"):
        decode("été ".encode() + b"\xe9")


def test_a_lone_surrogate_from_python_is_named():
    with pytest.raises(TextError, match=r"lone surrogate U\+D800 at position 2"):
        check_text("ab\ud800")


def test_a_bom_is_dropped_once_and_valid_text_kept():
    assert clean_text("\ufeffthe cat") == "the cat"
    assert clean_text(b"\xef\xbb\xbfthe cat") == "the cat"
    assert clean_text("\ufeff\ufeffx") == "\ufeffx"
    for s in ["", "naïve café", "猫が好き", "שלום", "🐈‍⬛ emoji"]:
        assert clean_text(s) == s == clean_text(s.encode())


def test_not_a_string():
    with pytest.raises(TextError, match="must be a string, got int"):
        check_text(5)


def test_read_lines_reports_bad_lines_in_place():
    lines = list(read_lines(io.BytesIO(b"\xef\xbb\xbfa\r\n\xffb\nc")))
    assert [(n, str(t)) for n, t in lines] == [
        (1, "a"), (2, "line 2 is not valid UTF-8 (byte 0xff at position 0)"), (3, "c")]
    assert isinstance(lines[1][1], TextError)


def test_the_tokenizer_and_embed_raise_valueerror(model):
    """Issue 9: ``TypeError: TextInputSequence must be str`` from the Rust tokenizer."""
    bad = b"the cat \xff is red".decode("utf-8", "surrogateescape")
    with pytest.raises(ValueError, match=r"not valid UTF-8 \(byte 0xff at position 8\)"):
        model.tokenizer.encode(bad)
    with pytest.raises(ValueError, match=r"not valid UTF-8 \(byte 0xff at position 8\)"):
        model.tokenizer.encode_batch(["fine", bad])
    with pytest.raises(ValueError, match=r"not valid UTF-8 \(byte 0xff at position 8\)"):
        model.embed(["fine", bad])


ANY_CHARS = st.text(st.characters(codec=None, exclude_categories=()), max_size=40)  # surrogates too


@settings(max_examples=200)
@given(data=st.binary(max_size=40))
def test_bytes_either_decode_or_name_the_first_bad_byte(data):
    try:
        text = clean_text(data)
    except TextError as e:
        # the first bad byte ends the longest prefix that is valid UTF-8 on its own
        first = max(i for i in range(len(data) + 1) if _valid(data[:i]))
        assert str(e).endswith(f"(byte 0x{data[first]:02x} at position {first})"), data
        with pytest.raises(TextError) as from_argv:  # the same bytes as sys.argv carries them
            clean_text(data.decode("utf-8", "surrogateescape"))
        assert str(from_argv.value) == str(e)
    else:
        assert text == data.decode("utf-8").removeprefix("\ufeff")
        # argv carries the same bytes as surrogates: the same verdict, the same text
        assert clean_text(data.decode("utf-8", "surrogateescape")) == text


def _valid(b: bytes) -> bool:
    try:
        b.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@settings(max_examples=200)
@given(text=ANY_CHARS)
def test_any_str_is_encoded_or_refused_with_valueerror(model, text):
    try:
        enc = model.tokenizer.encode(text)
    except ValueError:
        with pytest.raises(TextError):
            check_text(text)
    else:
        assert len(enc.ids) == len(enc.tokens) >= 2  # [CLS] … [SEP]


# -- issue 23: text that says nothing, lines inside lines, BOMs mid-stream, huge words ---------


@_pytest.mark.parametrize("text", ["", " \t\n", "\u200b", "\u200c\u200d\u2060\ufeff", "\x07\x00\x1b",
                                   "\u200e\u200f \u00a0\u3000"])
def test_only_invisible_or_control_characters_is_blank(text):
    assert is_blank(text)


@_pytest.mark.parametrize("text", ["a", "\u200bcat", "٣", "😀", "é"])
def test_a_visible_character_is_not_blank(text):
    assert not is_blank(text)


@_pytest.mark.parametrize("brk", list(LINE_BREAKS))
def test_every_line_break_inside_a_line_is_refused_naming_it(brk):
    with _pytest.raises(TextError, match=f"U\\+{ord(brk):04X}"):
        check_one_line(f"the cat{brk}the dog", what="line 3")
    assert check_one_line("the cat\tthe dog") == "the cat\tthe dog"  # a tab is a space


def test_a_bom_at_the_start_of_any_line_is_dropped():
    data = b"\xef\xbb\xbfa\n\xef\xbb\xbfb\nc\xef\xbb\xbf\n"
    assert [t for _, t in read_lines(_io.BytesIO(data))] == ["a", "b", "c\ufeff"]


def test_a_long_word_is_cut_in_messages():
    word = "z" * 5_000_000
    s = shown(word)
    assert len(s) < 80 and "5000000 characters" in s
    assert shown("cat") == "'cat'"
