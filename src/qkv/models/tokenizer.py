"""Text → token ids, keeping where every token came from (character span and word).

A thin wrapper around the Hugging Face `tokenizers` library (Rust, fast). What it adds:

* one loader for the three layouts a checkpoint directory may have: `tokenizer.json`,
  GPT-2's byte-level BPE files `vocab.json` + `merges.txt`, or BERT's `vocab.txt`;
* an [`Encoding`][qkv.models.tokenizer.Encoding] record with each token's character offsets and word
  index, which the explainer uses to group sub-word tokens back into the words a reader typed;
* one rule for text that does not fit the model (see
  [`Tokenizer.encode`][qkv.models.tokenizer.Tokenizer.encode]);
* [`display_token`][qkv.models.tokenizer.display_token], the one place a token string becomes the
  text a reader is shown (`"Ġdog"` → `"dog"`, `"Ċ"` → `"↵"`): the viewer's pages, the CLI's tables
  and the PNGs all ask it.
"""

from __future__ import annotations

import os
import re
import warnings
from dataclasses import dataclass
from typing import Callable, Container, Sequence

import tokenizers
import torch
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors

from qkv.errors import QkvError
from qkv.files import parse_json, read_json, read_regular
from qkv.text import check_text

BERT_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
GPT2_SPECIALS = ("<|endoftext|>",)


def _byte_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet, character → byte: the printable bytes stand for themselves,
    the others (space, newline, control bytes, 0x7F–0xA0, 0xAD) are shifted to U+0100 onwards
    (space is `Ġ` U+0120, newline `Ċ` U+010A)."""
    kept = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    shifted = [b for b in range(256) if b not in kept]
    return {**{chr(b): b for b in kept}, **{chr(256 + n): b for n, b in enumerate(shifted)}}


BYTE_ALPHABET = _byte_alphabet()
SENTENCEPIECE_SPACE = "▁"
_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece's byte tokens: "<0x0A>"
# whitespace a reader would not see, as the marks shown instead
VISIBLE = {"\n": "↵", "\r": "␍", "\t": "⇥"}
SPACE_MARK = "␣"  # a token that is only spaces (a bare "Ġ")


def display_token(token: str) -> str:
    """The text a reader is shown for `token`, a tokenizer's token string — the one place
    this is decided (the viewer, the CLI's tables, the PNGs ask it).

    * Byte-level BPE (GPT-2, Llama 3, qkv's reader): each character stands for a byte (`Ġ` a
      space, `Ċ` a newline, `âĢĻ` the three bytes of `’`); the bytes are decoded as UTF-8,
      a token that ends inside a character shows its loose bytes as `\\xNN`. A token is read
      this way when every character is in the byte alphabet and it has a shifted character
      (U+0100 onwards) or decodes as UTF-8 — so a WordPiece `"café"` stays itself.
    * SentencePiece: `▁` is a space; a byte token `<0x0A>` is its byte.
    * The space that starts a word is dropped (`"Ġdog"` → `"dog"`, as a word is typed); a
      newline, a tab and a carriage return show as `↵`, `⇥` and `␍`; a token of spaces
      only shows one `␣` per space (a bare space would be an empty label).
    * Anything else (`"[CLS]"`, `"##ing"`, `"<|endoftext|>"`) is shown as it is.

    Examples:
        >>> [display_token(t) for t in ["Ġdog", "Ċ", "ĠĠ", "âĢĻ", "▁le", "<0x0A>", "##ing", "café"]]
        ['dog', '↵', '␣␣', '’', 'le', '↵', '##ing', 'café']
    """
    return display_text(_decoded(token))


def display_text(text: str) -> str:
    """A piece of text as a label: the word-start space dropped, `↵ ⇥ ␍` for a newline, a tab
    and a carriage return, `␣` for each space of a label of spaces only
    ([`display_token`][qkv.models.tokenizer.display_token] after decoding; a word's text, a
    context's key, as they are).

    Examples:
        >>> display_text(" dog"), display_text("\\n"), display_text("  "), display_text("łza")
        ('dog', '↵', '␣␣', 'łza')
    """
    if text.strip(" "):
        if text.startswith(" ") and text[1:].strip():
            text = text[1:]  # the word-start marker: the word as typed
    elif text:
        return SPACE_MARK * len(text)
    return "".join(VISIBLE.get(c, c) for c in text)


def _decoded(token: str) -> str:
    """`token` with its tokenizer's markers decoded (see
[`display_token`][qkv.models.tokenizer.display_token])."""
    if SENTENCEPIECE_SPACE in token or _BYTE_FALLBACK.search(token):
        text = token.replace(SENTENCEPIECE_SPACE, " ")
        return _BYTE_FALLBACK.sub(lambda m: chr(int(m.group(1), 16)) if int(m.group(1), 16) < 0x80
                                  else m.group(0), text)
    if not token or any(c not in BYTE_ALPHABET for c in token):
        return token
    raw = bytes(BYTE_ALPHABET[c] for c in token)
    if any(ord(c) >= 256 for c in token):
        return raw.decode("utf-8", errors="backslashreplace")
    try:
        return raw.decode("utf-8")  # "âĢĻ" → "’"; plain ASCII is itself
    except UnicodeDecodeError:
        return token  # not byte-level: a vocabulary's own accented word ("café")


@dataclass(frozen=True)
class Encoding:
    """One text, tokenised. All lists have one entry per token.

    Attributes:
        ids: token ids.
        tokens: the token strings (`"##ing"` for a BERT word piece, `"Ġworld"` for GPT-2).
        offsets: `(start, end)` character span of each token in the original text, without
            the space a word-start marker stands for (`"Ġdog"` → `dog`, `"▁dog"` → `dog`,
            whatever the tokenizer file's `trim_offsets`); `(0, 0)` for special tokens
            such as `[CLS]` / `[SEP]`.
        word_ids: index of the word each token belongs to (`word_ids`: split at spaces
            and between letters and punctuation, for `##`-, `Ġ`- and `▁`-marked
            vocabularies alike), None for special tokens.
        special: True for tokens the tokenizer added (`[CLS]`, `[SEP]`), not from the text.

    Examples:
        >>> enc = Tokenizer.from_dir(minilm_dir).encode("Tokenizers rock")   # doctest: +SKIP
        >>> enc.tokens, enc.word_ids                                          # doctest: +SKIP
        (['[CLS]', 'token', '##izer', '##s', 'rock', '[SEP]'], [None, 0, 0, 0, 1, None])
    """

    ids: list[int]
    tokens: list[str]
    offsets: list[tuple[int, int]]
    word_ids: list[int | None]
    special: list[bool]

    def __len__(self) -> int:
        return len(self.ids)


@dataclass(frozen=True)
class BatchEncoding:
    """Several texts, tokenised and right-padded to the longest.

    Attributes:
        input_ids: (b, t) long, padded with the tokenizer's pad id.
        attention_mask: (b, t) long, 1 for real tokens and 0 for padding.
        encodings: the per-text [`Encoding`][qkv.models.tokenizer.Encoding] (unpadded).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    encodings: list[Encoding]


class Tokenizer:
    """A `tokenizers.Tokenizer` with offsets, word ids and a length limit.

    Args:
        tokenizer: a `tokenizers.Tokenizer`; its own padding and truncation settings are
            switched off (qkv pads batches itself and never truncates silently).
        name: how error messages call the model (e.g. `"all-MiniLM-L6-v2"`).
        max_length: the most tokens (special tokens included) the model takes, or None.

    Over-long text: [`encode`][qkv.models.tokenizer.Tokenizer.encode] raises `QkvError` ("text is N
    tokens; `<model>` takes at most M …") unless `truncate=True`, in which case it keeps the first M
    tokens (special tokens kept) and emits a `warnings.warn` naming both numbers. Failing loudly is
    the default because an explanation of a silently cut text would explain the wrong text.
    """

    def __init__(self, tokenizer: tokenizers.Tokenizer, *, name: str = "the model",
                 max_length: int | None = None):
        tokenizer.no_padding()
        tokenizer.no_truncation()
        self._tok = tokenizer
        self._truncating: dict[int, tokenizers.Tokenizer] = {}
        self.name = name
        self.max_length = max_length
        self.pad_id = _pad_id(tokenizer)

    # -- loading ---------------------------------------------------------------------------
    @classmethod
    def from_dir(cls, path: str | os.PathLike, *, name: str | None = None,
                 max_length: int | None = None, files: Container[str] | None = None) -> "Tokenizer":
        """Load from a checkpoint directory: `tokenizer.json`, else `vocab.json` +
        `merges.txt` (GPT-2 byte-level BPE), else `vocab.txt` (BERT WordPiece).

        `max_length` defaults to `model_max_length` in `tokenizer_config.json` when present.
        `files`: the names a manifest lists; a file not among them is treated as absent.
        """
        path = os.fspath(path)
        if not os.path.isdir(path):
            raise QkvError(f"tokenizer directory {path} does not exist")
        present = lambda n: _present(path, n, files)  # noqa: E731
        config = _read_tokenizer_config(path) if present("tokenizer_config.json") else {}
        if max_length is None:
            limit = config.get("model_max_length")
            # HF writes a huge sentinel (1e30) when the limit is unknown.
            max_length = int(limit) if isinstance(limit, (int, float)) and 0 < limit < 1e9 else None
        name = name or os.path.basename(os.path.normpath(path))
        return cls(_load_tokenizer(path, config, present), name=name, max_length=max_length)

    # -- encoding ----------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def unk_token(self) -> str | None:
        """The token an unknown word becomes (`[UNK]`, `<unk>`), or None (byte-level BPE
        has no unknown words)."""
        token = getattr(self._tok.model, "unk_token", None)
        return token if isinstance(token, str) and self._tok.token_to_id(token) is not None else None

    def all_unknown(self, encoding: "Encoding") -> bool:
        """True when the text had tokens and every one of them is the unknown token: the model
        would see nothing of the text (English words given to a made-up-word vocabulary)."""
        unk = self.unk_token
        tokens = [t for t, sp in zip(encoding.tokens, encoding.special) if not sp]
        return unk is not None and bool(tokens) and all(t == unk for t in tokens)

    def token_to_id(self, token: str) -> int | None:
        """The id of `token` (`"[CLS]"`, `"Ġdog"`), None when the vocabulary lacks it."""
        return self._tok.token_to_id(token)

    def id_to_token(self, i: int) -> str | None:
        """The token string of id `i` (`"##ing"`, `"Ġworld"`), None outside the vocabulary."""
        return self._tok.id_to_token(int(i))

    @property
    def special_ids(self) -> frozenset[int]:
        """The ids of the special tokens (`[CLS]`, `<|endoftext|>`): never drawn as text."""
        return frozenset(i for i, t in self._tok.get_added_tokens_decoder().items() if t.special)

    def ordinary_ids(self) -> list[int]:
        """Every id that is not a special token, in order (what random text is drawn from).

        Examples:
            >>> tok.ordinary_ids()[:3]                    # doctest: +SKIP
            [0, 1, 2]
        """
        special = self.special_ids
        return [i for i in range(self.vocab_size) if i not in special]

    def encode(self, text: str, *, max_length: int | None = None, truncate: bool = False) -> Encoding:
        """Tokenise one text (special tokens added as the model expects).

        Args:
            text: the text.
            max_length: the token limit for this call (default: the model's, `self.max_length`).
            truncate: cut an over-long text to the limit with a warning instead of raising.

        Raises:
            QkvError: the text has more tokens than the limit and `truncate` is False.

        Examples:
            >>> tok.encode("Hello world").tokens          # doctest: +SKIP
            ['[CLS]', 'hello', 'world', '[SEP]']
        """
        if not isinstance(text, str):
            raise QkvError(f"text must be a string, got {type(text).__name__}")
        return self._encode_many([text], max_length=max_length, truncate=truncate)[0]

    def encode_batch(self, texts: Sequence[str], *, max_length: int | None = None,
                     truncate: bool = False) -> BatchEncoding:
        """Tokenise several texts and right-pad them into (b, t) tensors.

        Same length rule as [`encode`][qkv.models.tokenizer.Tokenizer.encode], applied to each text.
        """
        if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
            raise QkvError("texts must be a list of strings")
        encodings = self._encode_many(list(texts), max_length=max_length, truncate=truncate)
        t = max((len(e) for e in encodings), default=0)
        input_ids = torch.full((len(encodings), t), self.pad_id, dtype=torch.long)  # (b, t)
        attention_mask = torch.zeros(len(encodings), t, dtype=torch.long)  # (b, t)
        for i, e in enumerate(encodings):
            input_ids[i, : len(e)] = torch.tensor(e.ids, dtype=torch.long)
            attention_mask[i, : len(e)] = 1
        return BatchEncoding(input_ids, attention_mask, encodings)

    def decode(self, ids: Sequence[int] | torch.Tensor, *, skip_special_tokens: bool = True) -> str:
        """Token ids → text."""
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def _encode_many(self, texts: list[str], *, max_length: int | None,
                     truncate: bool) -> list[Encoding]:
        limit = self.max_length if max_length is None else max_length
        texts = [check_text(t) for t in texts]  # invalid UTF-8 (surrogateescape) → ValueError
        raw = self._tok.encode_batch(texts) if len(texts) > 1 else [self._tok.encode(texts[0])]
        if limit is not None:
            long = [i for i, e in enumerate(raw) if len(e.ids) > limit]
            for i in long:
                n = len(raw[i].ids)
                if not truncate:
                    raise QkvError(
                        f"text is {n} tokens; {self.name} takes at most {limit} "
                        f"(shorten it; from Python, truncate=True keeps the first {limit} tokens)"
                    )
                warnings.warn(f"text is {n} tokens; {self.name} takes at most {limit}: "
                              f"truncated to the first {limit} tokens", stacklevel=3)
                raw[i] = self._truncator(limit).encode(texts[i])
        return [_to_encoding(e, text) for e, text in zip(raw, texts)]

    def _truncator(self, limit: int) -> tokenizers.Tokenizer:
        """A copy of the tokenizer that truncates to `limit` (special tokens kept)."""
        if limit not in self._truncating:
            tok = tokenizers.Tokenizer.from_str(self._tok.to_str())
            tok.enable_truncation(limit)
            self._truncating[limit] = tok
        return self._truncating[limit]

    def __repr__(self) -> str:
        return (f"Tokenizer(name={self.name!r}, vocab_size={self.vocab_size}, "
                f"max_length={self.max_length})")


def _to_encoding(e: tokenizers.Encoding, text: str) -> Encoding:
    special = [bool(s) for s in e.special_tokens_mask]
    tokens = list(e.tokens)
    spans = [(int(a), int(b)) for a, b in e.offsets]
    raw_words = list(e.word_ids)
    offsets = []
    for i, ((a, b), s) in enumerate(zip(spans, special)):
        if s:
            offsets.append((0, 0))
            continue
        trimmed = _trim_leading_space(text, a, b)
        whole_space = trimmed[0] == trimmed[1] and a < b
        continues = i + 1 < len(spans) and not special[i + 1] and raw_words[i + 1] == raw_words[i]
        # a token that is only spaces keeps them, unless it is a marker starting a word ("Ġ" + "quick")
        offsets.append((a, b) if whole_space and not continues else trimmed)
    return Encoding(ids=list(e.ids), tokens=tokens, offsets=offsets,
                    word_ids=word_ids(text, offsets, raw_words, special), special=special)


def _trim_leading_space(text: str, a: int, b: int) -> tuple[int, int]:
    """The span without the whitespace its token's marker stands for (`"Ġdog"` → `dog`)."""
    while a < b and text[a].isspace():
        a += 1
    return a, b


def word_ids(text: str, offsets: list[tuple[int, int]], raw: list[int | None],
             special: list[bool]) -> list[int | None]:
    """Which word each token belongs to, the same way for every vocabulary.

    A token starts a new word when the tokenizer's pre-tokeniser says so (`raw` word ids
    differ), when text lies between it and the previous token (the space a `Ġ`/`▁` marker
    stands for: SentencePiece-style tokenizers without a pre-tokeniser put a whole text in one
    "word"), or when it switches between letters/digits and punctuation (`"dog" "."`, as
    BERT's and GPT-2's pre-tokenisers split). Special tokens get None.

    Examples:
        >>> # "▁the" "▁do" "g" ".", one pre-tokeniser word (raw ids all 0)
        >>> word_ids("the dog.", [(0, 3), (4, 6), (6, 7), (7, 8)], [0, 0, 0, 0], [False] * 4)
        [0, 1, 1, 2]
    """
    out: list[int | None] = []
    word, last_raw, last_end, last_kind = -1, object(), None, None
    for (a, b), r, s in zip(offsets, raw, special):
        if s:
            out.append(None)
            last_raw, last_end, last_kind = object(), None, None
            continue
        piece = text[a:b]
        kind = None if not piece else any(c.isalnum() for c in piece)
        new = (word < 0 or r != last_raw or last_end is None or a > last_end
               or (kind is not None and last_kind is not None and kind != last_kind))
        if new:
            word, last_kind = word + 1, None  # a word's kind is that of its first non-empty token
        out.append(word)
        last_raw, last_end = r, b
        last_kind = kind if last_kind is None else last_kind
    return out


def _pad_id(tok: tokenizers.Tokenizer) -> int:
    for token in ("[PAD]", "<pad>", "<|endoftext|>"):
        i = tok.token_to_id(token)
        if i is not None:
            return i
    # No pad token (GPT-2 style vocabularies): any id works, padded positions are masked out.
    return 0


def _present(path: str, name: str, files: Container[str] | None) -> bool:
    return os.path.lexists(os.path.join(path, name)) and (files is None or name in files)


def _read_tokenizer_config(path: str) -> dict:
    config = read_json(os.path.join(path, "tokenizer_config.json"))
    return config if isinstance(config, dict) else {}


def _load_tokenizer(path: str, config: dict, present: Callable[[str], bool]) -> tokenizers.Tokenizer:
    file = os.path.join(path, "tokenizer.json")
    if present("tokenizer.json"):
        text = read_regular(file)  # a FIFO would block the Rust reader forever
        parse_json(text, file)  # depth and syntax checked here, so errors name the file
        try:
            return tokenizers.Tokenizer.from_str(text.decode("utf-8-sig"))
        except Exception as e:  # the Rust side raises a bare Exception
            raise QkvError(f"{file} could not be read as a tokenizer: {e}") from None
    vocab, merges = os.path.join(path, "vocab.json"), os.path.join(path, "merges.txt")
    if present("vocab.json") and present("merges.txt"):
        read_regular(vocab), read_regular(merges)  # regular files only: a FIFO blocks the reader
        return byte_level_bpe(vocab, merges)
    vocab_txt = os.path.join(path, "vocab.txt")
    if present("vocab.txt"):
        read_regular(vocab_txt)
        return wordpiece(vocab_txt, lowercase=bool(config.get("do_lower_case", True)))
    raise QkvError(f"no tokenizer in {path}: expected tokenizer.json, vocab.json + merges.txt "
                   f"(GPT-2) or vocab.txt (BERT)")


def byte_level_bpe(vocab_file: str, merges_file: str) -> tokenizers.Tokenizer:
    """GPT-2's tokenizer: byte-level BPE, no special tokens added around the text."""
    try:
        tok = tokenizers.Tokenizer(models.BPE.from_file(vocab_file, merges_file))
    except Exception as e:
        raise QkvError(f"{vocab_file} / {merges_file} could not be read as a BPE vocabulary: {e}") from None
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    # trim_offsets: a token's span excludes the space it carries ("Ġworld" → "world").
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    tok.add_special_tokens([t for t in GPT2_SPECIALS if tok.token_to_id(t) is not None])
    return tok


def wordpiece(vocab_file: str, *, lowercase: bool = True) -> tokenizers.Tokenizer:
    """BERT's tokenizer from `vocab.txt`: `[CLS] text [SEP]` with WordPiece sub-words."""
    try:
        tok = tokenizers.Tokenizer(models.WordPiece.from_file(vocab_file, unk_token="[UNK]"))
    except Exception as e:
        raise QkvError(f"{vocab_file} could not be read as a WordPiece vocabulary: {e}") from None
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    if cls_id is None or sep_id is None:
        raise QkvError(f"{vocab_file} has no [CLS] or [SEP] token")
    tok.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    tok.decoder = decoders.WordPiece(prefix="##")
    tok.add_special_tokens([t for t in BERT_SPECIALS if tok.token_to_id(t) is not None])
    return tok
