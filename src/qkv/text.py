"""Text from outside (argv, standard input, files) → `str`, decoded in one place.

Text reaches qkv three ways, and each carries bytes that are not UTF-8 differently:

* **command-line arguments** arrive as `str` already decoded by Python with
  `surrogateescape` (PEP 383): a byte `0xff` becomes the lone surrogate `U+DCFF`;
* **standard input and files** are read as `bytes` and decoded here;
* **library callers** pass `str`; one built with `surrogateescape` or holding a lone
  surrogate (`"\\ud800"`) cannot be encoded, and the tokenizer would fail on it with a
  `TypeError`.

`clean_text` turns all three into valid text or raises `TextError` (a
`ValueError`) naming the first bad byte and its position in bytes:

```text
the text is not valid UTF-8 (byte 0xff at position 8)
```

A leading UTF-8 byte-order mark (`EF BB BF`, `U+FEFF`) is dropped: editors on Windows write
one, and it is not a word. `check_text` only checks (the library uses it: dropping a
character there would shift the character offsets the caller gets back).

Examples:
    >>> clean_text(b"\\xef\\xbb\\xbfthe cat")
    'the cat'
    >>> clean_text(b"the cat \\xff is red")
    Traceback (most recent call last):
    qkv.text.TextError: the text is not valid UTF-8 (byte 0xff at position 8)
"""

from __future__ import annotations

import unicodedata

from qkv.errors import QkvError

BOM = "\ufeff"
# Characters that end a line for someone (str.splitlines, editors, Unicode) but not for a stream
# split on "\n": inside one line they would silently join two sentences into one.
LINE_BREAKS = "\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"
SHOWN = 40  # characters of a user's word quoted back in a message (a 5 MB word stays 5 MB no more)


def is_blank(text: str) -> bool:
    """True when `text` has nothing a model could read: only white space, control characters
    and invisible format characters (zero-width spaces and joiners, BOMs, direction marks).

    Examples:
        >>> is_blank("\u200b\u200d \x07\ufeff"), is_blank("a\u200b")
        (True, False)
    """
    return all(c.isspace() or unicodedata.category(c) in ("Cc", "Cf", "Zs", "Zl", "Zp") for c in text)


def shown(text: str, most: int = SHOWN) -> str:
    """`repr(text)`, cut to `most` characters with its length said: for messages.

    Examples:
        >>> shown("x" * 100, most=5)
        "'xxxxx…' (100 characters)"
    """
    return repr(text) if len(text) <= most else f"{text[:most]!r}"[:-1] + f"…' ({len(text)} characters)"


def check_one_line(text: str, *, what: str = "the text") -> str:
    """`text` unchanged, or `TextError` when it holds a line break other than `\n`
    handling would see (`\r`, `\v`, `\f`, U+0085, U+2028 …): where one sentence per line
    is read, two sentences would otherwise be merged into one without a word.

    Examples:
        >>> check_one_line("the cat\u2028the dog")
        Traceback (most recent call last):
        qkv.text.TextError: the text holds a line break (U+2028) at character 7; put one sentence per line
    """
    for i, c in enumerate(text):
        if c in LINE_BREAKS:
            raise TextError(f"{what} holds a line break (U+{ord(c):04X}) at character {i}; put "
                            f"one sentence per line")
    return text


class TextError(QkvError):
    """Text that is not valid UTF-8 (a `ValueError`, like every `QkvError`)."""


def _surrogate_error(text: str, index: int, what: str) -> TextError:
    char = ord(text[index])
    position = len(text[:index].encode("utf-8", "surrogateescape"))
    if 0xDC80 <= char <= 0xDCFF:  # a byte that surrogateescape could not decode
        return TextError(f"{what} is not valid UTF-8 (byte 0x{char - 0xDC00:02x} at position {position})")
    return TextError(f"{what} is not valid Unicode (a lone surrogate U+{char:04X} at position "
                     f"{position})")


def check_text(text: str, *, what: str = "the text") -> str:
    """`text` unchanged, or `TextError` when it holds a lone surrogate (an undecodable
    byte carried by `surrogateescape`, or a broken UTF-16 pair).

    Examples:
        >>> check_text("naïve café")
        'naïve café'
    """
    if not isinstance(text, str):
        raise TextError(f"{what} must be a string, got {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise _surrogate_error(text, e.start, what) from None
    return text


def decode(data: bytes, *, what: str = "the text") -> str:
    """UTF-8 bytes → `str`; `TextError` naming the first bad byte. No BOM handling.

    Examples:
        >>> decode("é".encode())
        'é'
    """
    try:
        return bytes(data).decode("utf-8")
    except UnicodeDecodeError as e:
        raise TextError(f"{what} is not valid UTF-8 (byte 0x{data[e.start]:02x} at position "
                        f"{e.start})") from None


def clean_text(data: str | bytes, *, what: str = "the text") -> str:
    """Bytes or a `str` from outside → checked text without a leading byte-order mark."""
    text = decode(data, what=what) if isinstance(data, (bytes, bytearray)) else check_text(data, what=what)
    return text[1:] if text.startswith(BOM) else text


def read_lines(stream, *, what: str = "line"):
    """`(number, text_or_error)` for each line of a binary stream (numbers from 1).

    Each line is decoded on its own, so one bad line does not end the stream: it comes back as
    a `TextError` in place of its text. A BOM at the start of any line is dropped (`cat
    a.txt b.txt` puts the second file's in the middle of the stream); line ends are removed.

    Examples:
        >>> import io
        >>> [(n, str(t)) for n, t in read_lines(io.BytesIO(b"\\xef\\xbb\\xbfa\\n\\xffb\\n"))]
        [(1, 'a'), (2, 'line 2 is not valid UTF-8 (byte 0xff at position 0)')]
    """
    for number, raw in enumerate(stream, 1):
        raw = raw.rstrip(b"\r\n")
        try:
            line = decode(raw, what=f"{what} {number}")
        except TextError as e:
            yield number, e
            continue
        yield number, line[1:] if line.startswith(BOM) else line
