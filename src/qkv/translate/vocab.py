"""Word-level vocabularies for the two languages, trained with the `tokenizers` library.

The grammar's tokens are whole words (French splits off the elided "l'" and "d'"), so a
`WordLevel` model is the right tokenizer: one id per word, learned from the training corpus,
plus four special tokens with fixed ids:

```text
[PAD]=0  [BOS]=1  [EOS]=2  [UNK]=3
```

English input is lower-cased, and one final ".", "!" or "?" is dropped (the grammar has neither
capitals nor punctuation). Words the model never saw are **refused**, not mapped to [UNK]: a
translation of "[UNK]" would be a silent guess, so `Vocab.encode_en` raises a
`QkvError` that lists every unknown word.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

from qkv.errors import QkvError
from qkv.text import is_blank, shown
from qkv.files import atomic_write_text
from qkv.translate.grammar import detokenize_fr

PAD, BOS, EOS, UNK = "[PAD]", "[BOS]", "[EOS]", "[UNK]"
SPECIALS = (PAD, BOS, EOS, UNK)
PAD_ID, BOS_ID, EOS_ID, UNK_ID = range(4)

_FINAL_PUNCT = re.compile(r"\s*[.!?]\s*$")


def _word_level(language: str) -> Tokenizer:
    tok = Tokenizer(models.WordLevel(unk_token=UNK))
    tok.normalizer = normalizers.Lowercase()
    splits = [pre_tokenizers.WhitespaceSplit()]
    if language == "fr":
        # "l'arbre" -> "l'", "arbre": the same split as grammar.tokenize_fr.
        splits.append(pre_tokenizers.Split("'", behavior="merged_with_previous"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(splits)
    return tok


def train_tokenizer(sentences: Iterable[str], language: str) -> Tokenizer:
    """A WordLevel tokenizer whose vocabulary is every word of `sentences`.

    Examples:
        >>> tok = train_tokenizer(["the cat eats", "the dog"], "en")
        >>> tok.encode("the dog").ids[1] > 3, tok.token_to_id("[EOS]")
        (True, 2)
    """
    if language not in ("en", "fr"):
        raise ValueError(f"language must be 'en' or 'fr', got {language!r}")
    tok = _word_level(language)
    trainer = trainers.WordLevelTrainer(special_tokens=list(SPECIALS), min_frequency=1,
                                        show_progress=False)
    tok.train_from_iterator(sentences, trainer=trainer)
    return tok


def normalize_en(text: str) -> str:
    """Lower case, single spaces, no final sentence punctuation.

    Examples:
        >>> normalize_en("  The cat is RED. ")
        'the cat is red'
    """
    return " ".join(_FINAL_PUNCT.sub("", text).lower().split())


@dataclass
class Vocab:
    """The English (source) and French (target) tokenizers of one translation model.

    Examples:
        >>> v = Vocab.train(["the cat eats"], ["le chat mange"])
        >>> v.decode_fr(v.encode_fr("le chat mange")[1:-1])
        'le chat mange'
    """

    en: Tokenizer
    fr: Tokenizer

    FILES = {"en": "tokenizer_en.json", "fr": "tokenizer_fr.json"}

    @classmethod
    def train(cls, en_sentences: Iterable[str], fr_sentences: Iterable[str]) -> "Vocab":
        return cls(train_tokenizer(en_sentences, "en"), train_tokenizer(fr_sentences, "fr"))

    @property
    def src_size(self) -> int:
        return self.en.get_vocab_size()

    @property
    def tgt_size(self) -> int:
        return self.fr.get_vocab_size()

    def unknown_words(self, text: str) -> list[str]:
        """The words of English `text` outside the vocabulary, in order, without repeats."""
        clean = normalize_en(text)
        enc = self.en.encode(clean, add_special_tokens=False)
        # An unknown word's token is "[UNK]"; its offsets still point at the word itself.
        words = [clean[a:b] for (a, b), i in zip(enc.offsets, enc.ids) if i == UNK_ID]
        return list(dict.fromkeys(words))

    def encode_en(self, text: str) -> list[int]:
        """Ids of `text` followed by [EOS]; QkvError for empty text or unknown words.

        Examples:
            >>> v = Vocab.train(["the cat eats"], ["le chat mange"])
            >>> v.encode_en("The cat eats.") == v.encode_en("the cat eats")
            True
        """
        clean = normalize_en(text)
        if not clean or is_blank(clean):
            raise QkvError(f"nothing to translate: the text {shown(text)} has no words")
        unknown = self.unknown_words(clean)
        if unknown:
            listed = ", ".join(map(shown, unknown[:10])) + (", …" if len(unknown) > 10 else "")
            raise QkvError(f"unknown English word{'s' * (len(unknown) > 1)} "
                           f"{listed} in {shown(clean, 200)}; the model knows "
                           f"{self.src_size - len(SPECIALS)} words (qkv translate --vocab lists them)")
        return self.en.encode(clean, add_special_tokens=False).ids + [EOS_ID]

    def encode_fr(self, text: str) -> list[int]:
        """[BOS] + ids of French `text` + [EOS] (the decoder's input and target, shifted)."""
        return [BOS_ID] + self.fr.encode(text, add_special_tokens=False).ids + [EOS_ID]

    def fr_tokens(self, ids: Iterable[int]) -> list[str]:
        """French tokens of `ids`, stopping at [EOS] and skipping [BOS]/[PAD]."""
        out = []
        for i in ids:
            if i == EOS_ID:
                break
            if i not in (BOS_ID, PAD_ID):
                out.append(self.fr.id_to_token(int(i)))
        return out

    def en_tokens(self, ids: Iterable[int]) -> list[str]:
        """English tokens of `ids`, stopping at [EOS]."""
        out = []
        for i in ids:
            if i == EOS_ID:
                break
            if i != PAD_ID:
                out.append(self.en.id_to_token(int(i)))
        return out

    def decode_fr(self, ids: Iterable[int]) -> str:
        """The French sentence for generated `ids` (apostrophes glued to the next word)."""
        return detokenize_fr(self.fr_tokens(ids))

    def words(self, language: str = "en") -> list[str]:
        """The known words of a language, sorted, without special tokens."""
        tok = self.en if language == "en" else self.fr
        return sorted(w for w in tok.get_vocab() if w not in SPECIALS)

    # -- files -------------------------------------------------------------------------------
    def save(self, directory: str | Path) -> dict[str, str]:
        """Write both tokenizers atomically; return {language: file name}."""
        for name, text in self.texts().items():
            atomic_write_text(Path(directory) / name, text)
        return dict(self.FILES)

    def texts(self) -> dict[str, str]:
        """{file name: JSON text} of both tokenizers, as `save` writes them."""
        return {name: getattr(self, lang).to_str(pretty=True) for lang, name in self.FILES.items()}

    @classmethod
    def load(cls, directory: str | Path) -> "Vocab":
        """Read both tokenizers; QkvError naming the file if one is missing or corrupt."""
        texts = {}
        for name in cls.FILES.values():
            path = Path(directory) / name
            if not path.is_file():
                raise QkvError(f"{directory}: missing tokenizer file {name}")
            texts[name] = path.read_bytes()
        return cls.from_texts(texts, directory)

    @classmethod
    def from_texts(cls, texts: dict[str, bytes], directory: str | Path) -> "Vocab":
        """Both tokenizers from their files' bytes ({file name: bytes}, checked by the caller)."""
        toks = {}
        for lang, name in cls.FILES.items():
            path = Path(directory) / name
            try:
                toks[lang] = Tokenizer.from_str(texts[name].decode("utf-8"))
            except Exception as e:  # the tokenizers library raises plain Exception subclasses
                raise QkvError(f"{path}: not a valid tokenizer file ({str(e).splitlines()[0][:120]})") from None
            for i, special in enumerate(SPECIALS):
                if toks[lang].token_to_id(special) != i:
                    raise QkvError(f"{path}: special token {special} must have id {i}")
        return cls(**toks)
