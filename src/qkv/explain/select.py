"""Which rows and columns of the attention a person means: tokens, words, and `token="it@1"`.

A tokenizer cuts "pizzeria" into `pi ##zz ##eria`; a reader thinks in words. A `Units`
is the list of things shown on screen — one per token, or one per word (`words=True`), each with
the token positions it covers. Attention weights move from tokens to words by a fixed rule:

* weights **into** a word are **summed** over its tokens (the word gets all the attention its
  pieces got, so a row still sums to 1);
* weights **from** a word are **averaged** over its tokens' rows (each piece asks its own
  question; the word's answer is their mean, again a distribution).

Special tokens ([CLS], [SEP]) are never merged: each stays a unit of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from qkv.explain.wording import ArgumentError, Message
from qkv.models.tokenizer import display_text, display_token

# A token's label depends on its string alone: kept per vocabulary entry seen (each pick of a
# token among a text's would otherwise decode every token again: ~8 µs each).
_token_label = lru_cache(maxsize=1 << 16)(display_token)

# How many labels an error message lists before it elides the rest.
_LIST_LIMIT = 40

WORD_RULE = "weights into a word are summed over its tokens, weights from a word averaged"


@dataclass(frozen=True)
class Units:
    """The units shown on screen and the token positions each one covers.

    Attributes:
        labels: one display string per unit ("pizza", "[CLS]", "##zz").
        groups: for each unit, the token positions it covers (ascending, non-empty).
        special: for each unit, whether it is a special token ([CLS], [SEP], <|endoftext|>).
        words: True when units are words (`words=True`), False when they are tokens.
        num_tokens: the number of tokens the groups index into.
    """

    labels: list[str]
    groups: list[tuple[int, ...]]
    special: list[bool]
    words: bool
    num_tokens: int

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def kind(self) -> str:
        return "word" if self.words else "token"

    def listing(self) -> str:
        """`0:[CLS] 1:the 2:dog …` — what an error message shows so a user can pick."""
        items = [f"{i}:{label}" for i, label in enumerate(self.labels)]
        if len(items) > _LIST_LIMIT:
            items = items[:_LIST_LIMIT] + [f"… ({len(items) - _LIST_LIMIT} more)"]
        return " ".join(items)




def token_units(encoding) -> Units:
    """One unit per token.

    Examples:
        >>> from types import SimpleNamespace as E
        >>> u = token_units(E(tokens=["[CLS]", "hi", "[SEP]"], special=[True, False, True]))
        >>> u.labels, u.groups
        (['[CLS]', 'hi', '[SEP]'], [(0,), (1,), (2,)])
    """
    tokens = list(encoding.tokens)
    return Units(labels=[_token_label(t) for t in tokens], groups=[(i,) for i in range(len(tokens))],
                 special=[bool(s) for s in encoding.special], words=False, num_tokens=len(tokens))


def word_units(encoding, text: str) -> Units:
    """One unit per word of `text` (tokens sharing a word id), special tokens on their own.

    A word's label is the text it spans (so "The", not the lower-cased token "the").

    Examples:
        >>> from types import SimpleNamespace as E
        >>> enc = E(tokens=["[CLS]", "pi", "##zza", "[SEP]"], special=[True, False, False, True],
        ...         word_ids=[None, 0, 0, None], offsets=[(0, 0), (0, 2), (2, 5), (0, 0)])
        >>> u = word_units(enc, "pizza")
        >>> u.labels, u.groups
        (['[CLS]', 'pizza', '[SEP]'], [(0,), (1, 2), (3,)])
    """
    labels: list[str] = []
    groups: list[list[int]] = []
    special: list[bool] = []
    last_word = object()  # a sentinel no word id equals
    for i, (token, word, spec) in enumerate(zip(encoding.tokens, encoding.word_ids, encoding.special)):
        if spec or word is None:
            labels.append(_token_label(token))
            groups.append([i])
            special.append(True)
            last_word = object()
            continue
        if word == last_word:
            groups[-1].append(i)
        else:
            groups.append([i])
            special.append(False)
            labels.append("")
        last_word = word
    for u, group in enumerate(groups):
        if not special[u]:
            start, end = encoding.offsets[group[0]][0], encoding.offsets[group[-1]][1]
            piece = text[start:end]
            labels[u] = display_text(piece) if piece else _token_label(encoding.tokens[group[0]])
    return Units(labels=labels, groups=[tuple(g) for g in groups], special=special, words=True,
                 num_tokens=len(encoding.tokens))


def units_for(encoding, text: str, words: bool) -> Units:
    return word_units(encoding, text) if words else token_units(encoding)


# -- turning token-level weights into unit-level ones ------------------------------------------
def group_columns(weights: torch.Tensor, units: Units) -> torch.Tensor:
    """Weights into each unit: (..., s) over tokens → (..., U), summing a unit's columns.

    Examples:
        >>> from types import SimpleNamespace as E
        >>> enc = E(tokens=["a", "b", "c"], special=[False] * 3, word_ids=[0, 0, 1],
        ...         offsets=[(0, 1), (1, 2), (3, 4)])
        >>> group_columns(torch.tensor([0.2, 0.3, 0.5]), word_units(enc, "ab c")).tolist()
        [0.5, 0.5]
    """
    if weights.shape[-1] != units.num_tokens:
        raise ValueError(f"weights have {weights.shape[-1]} columns but the text has "
                         f"{units.num_tokens} tokens")
    # the unit of each token, built in one indexing (a loop over 8k units took 0.18 s a call)
    sizes = torch.tensor([len(g) for g in units.groups], dtype=torch.long)
    owner = torch.repeat_interleave(torch.arange(len(units)), sizes)  # (tokens,) in group order
    index = torch.empty(units.num_tokens, dtype=torch.long)
    index[torch.tensor([i for g in units.groups for i in g], dtype=torch.long)] = owner
    index = index.to(weights.device)
    out = weights.new_zeros(*weights.shape[:-1], len(units))  # (..., U)
    return out.index_add_(-1, index, weights)


def group_rows(weights: torch.Tensor, units: Units) -> torch.Tensor:
    """Weights from each unit: (..., t, ·) over tokens → (..., U, ·), averaging a unit's rows."""
    if weights.shape[-2] != units.num_tokens:
        raise ValueError(f"weights have {weights.shape[-2]} rows but the text has "
                         f"{units.num_tokens} tokens")
    rows = [weights[..., list(group), :].mean(dim=-2) for group in units.groups]
    return torch.stack(rows, dim=-2)  # (..., U, ·)


# -- choosing a unit from what the user typed --------------------------------------------------
@dataclass(frozen=True)
class Choice:
    """The unit a `token`/`to`/`source`/`target` value picked, and a note for the user.

    `note` (or None) says which occurrence or token was used when that was a guess; it names
    arguments by role (`Message`).
    """

    unit: int
    note: Message | None = None


def _matches(label: str, wanted: str) -> bool:
    label = label.lower()
    return label == wanted or (label.startswith("##") and label[2:] == wanted)


def _split_occurrence(spec: str) -> tuple[str, int | None]:
    word, at, n = spec.rpartition("@")
    if at and word and n.isdigit():
        return word, int(n)
    return spec, None


def _spec(spec: object, role: str) -> str:
    """`spec` as the text `choose` reads: a whole number (from Python) is an index."""
    if isinstance(spec, int) and not isinstance(spec, bool):
        return str(spec)
    if not isinstance(spec, str):
        raise ArgumentError(role, "{name} must be a word or an index, got {value!r}", value=spec)
    return spec


def choose(spec: str | int | None, units: Units, *, role: str = "token") -> Choice:
    """Resolve a user's choice of unit.

    `spec` is None (the last unit with a letter or digit, i.e. the last word, not a final
    full stop), an index (`"12"` or `12`, counting from 0 over the
    units shown), a word (`"it"`: its last occurrence, with a note when there are several) or
    `"it@0"` (the first occurrence; occurrences count from 0). Matching ignores case.
    `role` is the argument `spec` came from; messages name it (see `qkv.explain.wording`).

    Raises:
        ArgumentError: the word is not in the text (the message lists the units), the index or
            the occurrence is out of range.

    Examples:
        >>> from types import SimpleNamespace as E
        >>> u = token_units(E(tokens=["[CLS]", "it", "is", "it", "[SEP]"], special=[1, 0, 0, 0, 1]))
        >>> choose("it", u).unit, choose("it@0", u).unit, choose(None, u).unit
        (3, 1, 3)
        >>> str(choose("it", u).note)
        "'it' occurs 2 times (tokens 1, 3); using the last (token 3). Pick another with token it@0 (occurrences count from 0) or token 1."
    """
    if spec is None:
        plain = [i for i, s in enumerate(units.special) if not s]
        # The last *word*: skip a final "." or "?" — punctuation is rarely what one asks about.
        wordy = [i for i in plain if any(ch.isalnum() for ch in units.labels[i])]
        return Choice((wordy or plain or [len(units) - 1])[-1])
    spec = _spec(spec, role).strip()
    if not spec:
        raise ArgumentError(role, "{name} is empty; give a word or an index ({listing})",
                            listing=units.listing())
    if spec.lstrip("-").isdigit():
        index = int(spec)
        # A number is always an index; when it is also a word of the text, say how to pick that.
        also = ([i for i, label in enumerate(units.labels) if _matches(label, spec)]
                if spec.isdigit() else [])
        hint = (f"; a number is always an index: for the word {spec!r} (token {also[-1]}) write "
                f"{spec}@0" if also else "")
        if not 0 <= index < len(units):
            raise ArgumentError(role, "{name} {index} is out of range: the text has {n} {kind}s "
                                "(0–{last}): {listing}{hint}", index=index, n=len(units),
                                kind=units.kind, last=len(units) - 1, listing=units.listing(),
                                hint=hint)
        if also and index not in also:
            return Choice(index, Message("{name} {index} is read as an index ({kind} {index}, "
                                         "{label!r}); for the word {spec!r} write {spec}@0", role,
                                         index=index, kind=units.kind, label=units.labels[index],
                                         spec=spec))
        return Choice(index)
    word, occurrence = _split_occurrence(spec)
    found = [i for i, label in enumerate(units.labels) if _matches(label, word.lower())]
    if not found:
        raise ArgumentError(role, "{name} {spec!r} is not a {kind} of the text; the {kind}s are: "
                            "{listing}", spec=spec, kind=units.kind, listing=units.listing())
    if occurrence is not None:
        if occurrence >= len(found):
            raise ArgumentError(role, "{name} {spec!r}: {word!r} occurs {n} time(s) (occurrences "
                                "count from 0: {word}@0 … {word}@{last})", spec=spec, word=word,
                                n=len(found), last=len(found) - 1)
        return Choice(found[occurrence])
    note = None
    if len(found) > 1:
        note = Message("{word!r} occurs {n} times ({kind}s {where}); using the last ({kind} "
                       "{index}). Pick another with {name} {word}@0 (occurrences count from 0) or "
                       "{name} {first}.", role, word=word, n=len(found), kind=units.kind,
                       where=", ".join(str(i) for i in found), index=found[-1], first=found[0])
    return Choice(found[-1], note)


def choose_in(spec: str | int | None, encoding, text: str, *, words: bool,
              role: str = "token", units: Units | None = None) -> tuple[Units, Choice]:
    """The units to show and the one `spec` picks.

    In token mode a word the tokenizer split ("pizzeria" → pi ##zz ##eria) matches no single
    token; it is then found among the words and its **last** token is used, with a note
    suggesting `words=True` (`--words`). `units`: `units_for(encoding, text, words)` where the
    caller already built them (two picks in one text build them once).
    """
    units = units_for(encoding, text, words) if units is None else units
    spec = None if spec is None else _spec(spec, role)
    if words or spec is None or spec.strip().lstrip("-").isdigit():
        return units, choose(spec, units, role=role)
    word, _ = _split_occurrence(spec.strip())
    if any(_matches(label, word.lower()) for label in units.labels):
        return units, choose(spec, units, role=role)
    as_words = word_units(encoding, text)
    if not any(_matches(label, word.lower()) for label in as_words.labels):
        return units, choose(spec, units, role=role)  # raises: lists the tokens
    picked = choose(spec, as_words, role=role)
    group = as_words.groups[picked.unit]
    note = Message("{word!r} is {n} tokens ({pieces}); using its last token, {index}. Add {words} "
                   "to treat it as one word.", word=as_words.labels[picked.unit], n=len(group),
                   pieces=" ".join(units.labels[i] for i in group), index=group[-1])
    if picked.note:
        note = Message("{first} {second}", first=picked.note, second=note)
    return units, Choice(group[-1], note)
