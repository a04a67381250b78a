"""A tiny English→French grammar: a seeded parallel corpus with gold word alignments.

Every English sentence the grammar generates has exactly one French translation, and we know which
English words each French word comes from. That is what lets us score a cross-attention head: its
alignment accuracy is the fraction of French tokens whose most-attended English token is in the
token's gold set (`Pair.alignment`).

Sentences are lower case, without final punctuation, and follow one of three templates
(`[adj]` is an optional adjective; every noun phrase has an article):

    1. the [adj] noun  eats|sees|likes|finds|follows  the [adj] noun
    2. the [adj] noun  is|are  adj
    3. the [adj] noun  is|are  next to  the [adj] noun

Articles are "the", "a" or "an" ("an" when the next English word starts with a vowel: "an apple",
"a red apple"); plural nouns only take "the". French puts the adjective after the noun and makes
article, adjective and verb agree; "le"/"la" elide to "l'" before a vowel-initial noun (the noun
always follows the article in French, so "l'arbre rouge"), and "de" contracts with what follows:
du (de le), de la, de l', des (de les), d'un, d'une.

Tokens. English tokens are the whitespace-separated words. French tokens are the words, with the
elided "l'" and "d'" split off as tokens of their own: "l'arbre" is `["l'", "arbre"]` and
`detokenize_fr` glues a token ending in an apostrophe to the next one. Only the ASCII
apostrophe is used.

Gold alignment rules (for each French token, the English token indices it translates):

    noun, adjective, verb   the one English noun, adjective, verb (is/are too): always 1:1
    le la l' les un une     the English article of the same noun phrase (the, a, an)
    à, côté                 "next"
    de, d'                  "to"
    du, des                 "to" and the English article ("the"): the two fused into one word

Content words (nouns, adjectives, verbs) are exactly one-to-one: each aligns to one English token,
and no other French token aligns to that English token. `Pair.fr_roles` names each French
token's role ("det", "noun", "adj", "verb", "prep", "prep_det") so scores can be split by role.

    English tokens   0 the   1 red   2 apple   3 is   4 next   5 to   6 the   7 black   8 cats

    French tokens    la     pomme   rouge   est    à      côté   des      chats   noirs
    alignment        (0,)   (2,)    (1,)    (3,)   (4,)   (4,)   (5, 6)   (8,)    (7,)

Splits (`make_splits`) hold out some adjective–noun combinations (attributive "the red apple"
and predicative "the apple is red" alike) and some (subject noun, object noun) combinations: they
never occur in train or valid, and a test pair is *unseen* when it contains at least one of them.
Every noun and adjective still occurs in training on its own; only the combination is withheld.

Examples:

    >>> pair = make_pair("the cat is next to the tree")
    >>> pair.fr
    "le chat est à côté de l'arbre"
    >>> pair.fr_tokens
    ('le', 'chat', 'est', 'à', 'côté', 'de', "l'", 'arbre')
    >>> pair.alignment[5], pair.alignment[6]  # de <- "to", l' <- "the"
    ((4,), (5,))
    >>> translate_reference("the horses are hungry")
    'les chevaux sont affamés'
"""

from __future__ import annotations

import functools
import math
import random
import re
from dataclasses import dataclass, field
from typing import Literal

Gender = Literal["m", "f"]
Role = Literal["det", "noun", "adj", "verb", "prep", "prep_det"]


# --------------------------------------------------------------------------------------------
# Lexicon
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Numbered:
    """A word that agrees in number, in both languages: a noun, or a verb's third person.

    Examples:
        >>> NOUNS["horse"].fr(plural=True), VERBS["follow"].en(plural=False)
        ('chevaux', 'follows')
    """

    en_sg: str
    en_pl: str
    fr_sg: str
    fr_pl: str

    def en(self, plural: bool) -> str:
        return self.en_pl if plural else self.en_sg

    def fr(self, plural: bool) -> str:
        return self.fr_pl if plural else self.fr_sg


@dataclass(frozen=True)
class Noun(Numbered):
    """One noun in both languages. `fr_vowel`: the French noun elides a preceding le/la/de.

    Examples:
        >>> NOUNS["horse"].fr_pl
        'chevaux'
    """

    gender: Gender
    fr_vowel: bool = False


@dataclass(frozen=True)
class Adjective:
    """One adjective: English form and the four French agreeing forms.

    Examples:
        >>> ADJECTIVES["white"].fr("f", plural=True)
        'blanches'
    """

    en: str
    fr_m: str
    fr_f: str
    fr_mpl: str
    fr_fpl: str

    def fr(self, gender: Gender, plural: bool) -> str:
        if plural:
            return self.fr_mpl if gender == "m" else self.fr_fpl
        return self.fr_m if gender == "m" else self.fr_f


@dataclass(frozen=True)
class Verb(Numbered):
    """One verb in the present tense, third person: singular and plural forms.

    Examples:
        >>> VERBS["follow"].fr_pl
        'suivent'
    """


def _noun(en_sg: str, en_pl: str, fr_sg: str, fr_pl: str, gender: Gender, fr_vowel: bool = False) -> Noun:
    return Noun(en_sg, en_pl, fr_sg, fr_pl, gender, fr_vowel)


# Keyed by the English singular, which is the noun's lemma everywhere in this module. Dict order
# is the sampling order, so it is part of what a seed reproduces: append, never reorder.
NOUNS: dict[str, Noun] = {
    n.en_sg: n
    for n in (
        _noun("cat", "cats", "chat", "chats", "m"),
        _noun("dog", "dogs", "chien", "chiens", "m"),
        _noun("apple", "apples", "pomme", "pommes", "f"),
        _noun("tree", "trees", "arbre", "arbres", "m", fr_vowel=True),
        _noun("juice", "juices", "jus", "jus", "m"),
        _noun("pizza", "pizzas", "pizza", "pizzas", "f"),
        _noun("baby", "babies", "bébé", "bébés", "m"),
        _noun("bird", "birds", "oiseau", "oiseaux", "m", fr_vowel=True),
        _noun("house", "houses", "maison", "maisons", "f"),
        _noun("car", "cars", "voiture", "voitures", "f"),
        _noun("book", "books", "livre", "livres", "m"),
        _noun("girl", "girls", "fille", "filles", "f"),
        _noun("boy", "boys", "garçon", "garçons", "m"),
        _noun("table", "tables", "table", "tables", "f"),
        _noun("flower", "flowers", "fleur", "fleurs", "f"),
        _noun("horse", "horses", "cheval", "chevaux", "m"),
        _noun("child", "children", "enfant", "enfants", "m", fr_vowel=True),
        _noun("orange", "oranges", "orange", "oranges", "f", fr_vowel=True),
    )
}

ADJECTIVES: dict[str, Adjective] = {
    a.en: a
    for a in (
        Adjective("red", "rouge", "rouge", "rouges", "rouges"),
        Adjective("green", "vert", "verte", "verts", "vertes"),
        Adjective("black", "noir", "noire", "noirs", "noires"),
        Adjective("white", "blanc", "blanche", "blancs", "blanches"),
        Adjective("blue", "bleu", "bleue", "bleus", "bleues"),
        Adjective("hungry", "affamé", "affamée", "affamés", "affamées"),
        Adjective("tired", "fatigué", "fatiguée", "fatigués", "fatiguées"),
    )
}

# Keyed by the English base form; "be" only appears in templates 2 and 3.
VERBS: dict[str, Verb] = {
    "eat": Verb("eats", "eat", "mange", "mangent"),
    "see": Verb("sees", "see", "voit", "voient"),
    "like": Verb("likes", "like", "aime", "aiment"),
    "find": Verb("finds", "find", "trouve", "trouvent"),
    "follow": Verb("follows", "follow", "suit", "suivent"),
    "be": Verb("is", "are", "est", "sont"),
}
TRANSITIVE_VERBS: tuple[str, ...] = ("eat", "see", "like", "find", "follow")

EN_FUNCTION_WORDS: tuple[str, ...] = ("the", "a", "an", "next", "to")
FR_FUNCTION_WORDS: tuple[str, ...] = (
    "le", "la", "l'", "les", "un", "une", "à", "côté", "de", "du", "des", "d'",
)


@dataclass(frozen=True)
class Lexicon:
    """Every token the grammar can produce, per language, sorted.

    Examples:
        >>> "l'" in lexicon().fr and "next" in lexicon().en
        True
    """

    en: tuple[str, ...]
    fr: tuple[str, ...]


@functools.cache
def lexicon() -> Lexicon:
    """The English and French token vocabularies (for tokenizers and out-of-vocabulary checks)."""
    en = set(EN_FUNCTION_WORDS)
    fr = set(FR_FUNCTION_WORDS)
    for w in (*NOUNS.values(), *VERBS.values()):
        en |= {w.en_sg, w.en_pl}
        fr |= {w.fr_sg, w.fr_pl}
    for a in ADJECTIVES.values():
        en.add(a.en)
        fr |= {a.fr_m, a.fr_f, a.fr_mpl, a.fr_fpl}
    return Lexicon(en=tuple(sorted(en)), fr=tuple(sorted(fr)))


# --------------------------------------------------------------------------------------------
# Tokenisation
# --------------------------------------------------------------------------------------------


def tokenize_en(text: str) -> list[str]:
    """English tokens are whitespace-separated words.

    Examples:
        >>> tokenize_en("the cat eats the apple")
        ['the', 'cat', 'eats', 'the', 'apple']
    """
    return text.split()


def detokenize_en(tokens: list[str] | tuple[str, ...]) -> str:
    """Inverse of `tokenize_en`: join with single spaces.

    Examples:
        >>> detokenize_en(["the", "cats", "eat"])
        'the cats eat'
    """
    _check_tokens(tokens)
    return " ".join(tokens)


# A word ending in an apostrophe ("l'", "d'") is a token of its own, so "l'arbre" -> "l'", "arbre".
_FR_TOKEN = re.compile(r"[^\s']*'|[^\s']+")


def tokenize_fr(text: str) -> list[str]:
    """Split French on whitespace and after every apostrophe.

    Examples:
        >>> tokenize_fr("l'oiseau est à côté d'une orange")
        ["l'", 'oiseau', 'est', 'à', 'côté', "d'", 'une', 'orange']
    """
    return _FR_TOKEN.findall(text)


def detokenize_fr(tokens: list[str] | tuple[str, ...]) -> str:
    """Inverse of `tokenize_fr`: spaces between tokens, none after an elided "l'" or "d'".

    Examples:
        >>> detokenize_fr(["le", "chat", "est", "à", "côté", "de", "l'", "arbre"])
        "le chat est à côté de l'arbre"
    """
    _check_tokens(tokens)
    for t in tokens:
        # An apostrophe inside a token would be split off again by tokenize_fr, breaking the round trip.
        if "'" in t[:-1]:
            raise ValueError(f"French token {t!r} has an apostrophe before its last character")
    return _join_fr(tokens)


def _join_fr(tokens: list[str] | tuple[str, ...]) -> str:
    # Unchecked: realize() only emits lexicon tokens, and it runs ~30k times per make_splits.
    return " ".join(tokens).replace("' ", "'")


_WHITESPACE = re.compile(r"\s")


def _check_tokens(tokens: list[str] | tuple[str, ...]) -> None:
    for t in tokens:
        if not t or _WHITESPACE.search(t):
            raise ValueError(f"token {t!r} is empty or contains whitespace")


# --------------------------------------------------------------------------------------------
# Sentences: structure, realisation in both languages, parsing of English
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NounPhrase:
    """Article + optional adjective + noun. Indefinite noun phrases are singular.

    Examples:
        >>> NounPhrase("apple", plural=False, definite=False, adj="red")
        NounPhrase(noun='apple', plural=False, definite=False, adj='red')
    """

    noun: str
    plural: bool
    definite: bool
    adj: str | None = None

    def __post_init__(self) -> None:
        if self.noun not in NOUNS:
            raise ValueError(f"noun {self.noun!r} is not one of {sorted(NOUNS)}")
        if self.adj is not None and self.adj not in ADJECTIVES:
            raise ValueError(f"adjective {self.adj!r} is not one of {sorted(ADJECTIVES)}")
        if self.plural and not self.definite:
            raise ValueError(f"plural noun {self.noun!r} needs the definite article (there is no plural 'a')")


@dataclass(frozen=True)
class Sentence:
    """One sentence's structure: template 1 has `obj`, 2 has `pred_adj`, 3 has `obj`.

    Examples:
        >>> cat, apples = NounPhrase("cat", False, True, adj="red"), NounPhrase("apple", True, True)
        >>> s = Sentence(1, cat, verb="eat", obj=apples)
        >>> s.adj_noun(), s.noun_noun()
        ((('red', 'cat'),), (('cat', 'apple'),))
    """

    template: Literal[1, 2, 3]
    subj: NounPhrase
    verb: str = "be"
    obj: NounPhrase | None = None
    pred_adj: str | None = None

    def __post_init__(self) -> None:
        verbs = TRANSITIVE_VERBS if self.template == 1 else ("be",)
        ok = {
            1: self.obj is not None and self.pred_adj is None,
            2: self.obj is None and self.pred_adj in ADJECTIVES,
            3: self.obj is not None and self.pred_adj is None,
        }.get(self.template, False)
        if not ok or self.verb not in verbs:
            raise ValueError(
                f"template {self.template} takes verb in {verbs}, "
                f"{'a predicate adjective' if self.template == 2 else 'an object'}; got verb={self.verb!r}, "
                f"obj={self.obj!r}, pred_adj={self.pred_adj!r}"
            )

    def adj_noun(self) -> tuple[tuple[str, str], ...]:
        """(adjective, noun) lemma pairs: attributive ones, then the predicate adjective."""
        out = [(np.adj, np.noun) for np in (self.subj, self.obj) if np is not None and np.adj is not None]
        if self.pred_adj is not None:
            out.append((self.pred_adj, self.subj.noun))
        return tuple(out)

    def noun_noun(self) -> tuple[tuple[str, str], ...]:
        """The (subject noun, object noun) lemma pair, if the sentence has an object."""
        return () if self.obj is None else ((self.subj.noun, self.obj.noun),)


@dataclass(frozen=True)
class Pair:
    """One English sentence, its French translation and the gold word alignment.

    `alignment[j]` holds the English token indices that French token `j` translates (sorted,
    never empty); `fr_roles[j]` is French token `j`'s role. `adj_noun` and `noun_noun` are
    the English lemma combinations the sentence contains (see `Sentence`).

    Examples:
        >>> p = make_pair("the horses are hungry")
        >>> p.fr_tokens, p.alignment
        (('les', 'chevaux', 'sont', 'affamés'), ((0,), (1,), (2,), (3,)))
        >>> p.adj_noun, p.noun_noun
        ((('hungry', 'horse'),), ())
    """

    en: str
    fr: str
    en_tokens: tuple[str, ...]
    fr_tokens: tuple[str, ...]
    alignment: tuple[tuple[int, ...], ...]
    fr_roles: tuple[Role, ...]
    adj_noun: tuple[tuple[str, str], ...]
    noun_noun: tuple[tuple[str, str], ...]
    template: int

    @property
    def links(self) -> list[tuple[int, int]]:
        """The alignment as (fr_index, en_index) pairs.

        Examples:
            >>> make_pair("the cat is red").links
            [(0, 0), (1, 1), (2, 2), (3, 3)]
        """
        return [(j, i) for j, srcs in enumerate(self.alignment) for i in srcs]


def _en_article(np: NounPhrase, next_word: str) -> str:
    if np.definite:
        return "the"
    return "an" if next_word[0] in "aeiou" else "a"


def _en_np(np: NounPhrase) -> list[str]:
    noun = NOUNS[np.noun]
    words = ([np.adj] if np.adj else []) + [noun.en(np.plural)]
    return [_en_article(np, words[0])] + words


def _fr_article(np: NounPhrase) -> str:
    noun = NOUNS[np.noun]
    if np.plural:
        return "les"
    if not np.definite:
        return "un" if noun.gender == "m" else "une"
    if noun.fr_vowel:
        return "l'"
    return "le" if noun.gender == "m" else "la"


class _Builder:
    """Accumulates both sides of a pair; every French token names its English sources."""

    def __init__(self) -> None:
        self.en: list[str] = []
        self.fr: list[str] = []
        self.align: list[tuple[int, ...]] = []
        self.roles: list[Role] = []

    def en_words(self, words: list[str]) -> int:
        """Append English words; return the index of the first."""
        self.en.extend(words)
        return len(self.en) - len(words)

    def fr_word(self, word: str, srcs: tuple[int, ...], role: Role) -> None:
        self.fr.append(word)
        self.align.append(tuple(sorted(srcs)))
        self.roles.append(role)


def _emit_np(b: _Builder, np: NounPhrase, start: int, after_de: int | None = None) -> None:
    """French for the noun phrase whose English starts at `start`; `after_de` is the index of
    "to" when the phrase follows "à côté de", whose "de" contracts with the article."""
    noun = NOUNS[np.noun]
    i_art, i_adj, i_noun = start, start + 1, start + (2 if np.adj else 1)
    art = _fr_article(np)
    if after_de is None:
        b.fr_word(art, (i_art,), "det")
    elif art in ("le", "les"):
        b.fr_word("du" if art == "le" else "des", (after_de, i_art), "prep_det")
    else:
        b.fr_word("d'" if art in ("un", "une") else "de", (after_de,), "prep")
        b.fr_word(art, (i_art,), "det")
    b.fr_word(noun.fr(np.plural), (i_noun,), "noun")
    if np.adj:
        b.fr_word(ADJECTIVES[np.adj].fr(noun.gender, np.plural), (i_adj,), "adj")


def realize(s: Sentence) -> Pair:
    """Both languages and the gold alignment for a sentence structure.

    Examples:
        >>> realize(Sentence(2, NounPhrase("horse", plural=True, definite=True), pred_adj="hungry")).fr
        'les chevaux sont affamés'
    """
    b = _Builder()
    subj_start = b.en_words(_en_np(s.subj))
    verb = VERBS[s.verb]
    i_verb = b.en_words([verb.en(s.subj.plural)])
    _emit_np(b, s.subj, subj_start)
    b.fr_word(verb.fr(s.subj.plural), (i_verb,), "verb")
    if s.template == 1:
        assert s.obj is not None
        _emit_np(b, s.obj, b.en_words(_en_np(s.obj)))
    elif s.template == 2:
        assert s.pred_adj is not None
        i_adj = b.en_words([s.pred_adj])
        subj_noun = NOUNS[s.subj.noun]
        b.fr_word(ADJECTIVES[s.pred_adj].fr(subj_noun.gender, s.subj.plural), (i_adj,), "adj")
    else:
        assert s.obj is not None
        i_next = b.en_words(["next", "to"])
        b.fr_word("à", (i_next,), "prep")
        b.fr_word("côté", (i_next,), "prep")
        _emit_np(b, s.obj, b.en_words(_en_np(s.obj)), after_de=i_next + 1)
    return Pair(
        en=" ".join(b.en),
        fr=_join_fr(b.fr),
        en_tokens=tuple(b.en),
        fr_tokens=tuple(b.fr),
        alignment=tuple(b.align),
        fr_roles=tuple(b.roles),
        adj_noun=s.adj_noun(),
        noun_noun=s.noun_noun(),
        template=s.template,
    )


def _en_forms(words: dict[str, Numbered]) -> dict[str, tuple[str, bool]]:
    """English surface form -> (lemma, plural) of `words` (a form both numbers share: plural)."""
    return {**{w.en_sg: (k, False) for k, w in words.items()},
            **{w.en_pl: (k, True) for k, w in words.items()}}


# built once from the tables above
_EN_NOUN_FORMS = _en_forms(NOUNS)
_EN_VERB_FORMS = _en_forms(VERBS)


_EN_VOCAB = frozenset(lexicon().en)


class _Parser:
    """Recursive descent over the three templates; every error names the sentence and the word."""

    def __init__(self, en: str) -> None:
        self.en = en
        self.words = tokenize_en(en)
        self.i = 0
        for w in self.words:
            if w not in _EN_VOCAB:
                raise ValueError(f"cannot parse {en!r}: unknown word {w!r}")
        if not self.words:
            raise ValueError(f"cannot parse {en!r}: empty sentence")

    def fail(self, expected: str) -> ValueError:
        got = repr(self.words[self.i]) if self.i < len(self.words) else "end of sentence"
        return ValueError(f"cannot parse {self.en!r}: expected {expected} at word {self.i}, got {got}")

    def peek(self) -> str | None:
        return self.words[self.i] if self.i < len(self.words) else None

    def take(self) -> str:
        w = self.words[self.i]
        self.i += 1
        return w

    def noun_phrase(self) -> NounPhrase:
        if self.peek() not in ("the", "a", "an"):
            raise self.fail("an article (the, a, an)")
        art_at = self.i
        art = self.take()
        adj = self.take() if self.peek() in ADJECTIVES else None
        if self.peek() not in _EN_NOUN_FORMS:
            raise self.fail("a noun")
        noun, plural = _EN_NOUN_FORMS[self.peek()]  # type: ignore[index]
        if plural and art != "the":
            raise self.fail(f"a singular noun after {art!r}")
        self.take()
        np = NounPhrase(noun, plural, definite=art == "the", adj=adj)
        if art != "the" and art != _en_article(np, self.words[art_at + 1]):
            self.i = art_at
            raise self.fail(f"{_en_article(np, self.words[art_at + 1])!r} before {self.words[art_at + 1]!r}")
        return np

    def sentence(self) -> Sentence:
        subj = self.noun_phrase()
        if self.peek() not in _EN_VERB_FORMS:
            raise self.fail("a verb")
        verb, plural = _EN_VERB_FORMS[self.peek()]  # type: ignore[index]
        if plural != subj.plural:
            raise self.fail(f"a {'plural' if subj.plural else 'singular'} verb")
        self.take()
        s: Sentence
        if verb != "be":
            s = Sentence(1, subj, verb=verb, obj=self.noun_phrase())
        elif self.peek() == "next":
            self.take()
            if self.peek() != "to":
                raise self.fail("'to' after 'next'")
            self.take()
            s = Sentence(3, subj, obj=self.noun_phrase())
        elif self.peek() in ADJECTIVES:
            s = Sentence(2, subj, pred_adj=self.take())
        else:
            raise self.fail("an adjective or 'next to'")
        if self.i != len(self.words):
            raise self.fail("end of sentence")
        return s


def parse(en: str) -> Sentence:
    """The structure of an English sentence of the grammar; `ValueError` naming the word otherwise.

    Examples:
        >>> s = parse("a dog is tired")
        >>> s.template, s.subj, s.pred_adj
        (2, NounPhrase(noun='dog', plural=False, definite=False, adj=None), 'tired')
    """
    return _Parser(en).sentence()


def make_pair(en: str) -> Pair:
    """The full `Pair` (translation, tokens, alignment) for an English sentence of the grammar.

    Examples:
        >>> make_pair("a tired child sees the green trees").fr
        'un enfant fatigué voit les arbres verts'
    """
    return realize(parse(en))


def translate_reference(en: str) -> str:
    """The grammar's exact French for `en`; `ValueError` naming the sentence and word otherwise.

    Examples:
        >>> translate_reference("the red apple is next to the black cats")
        'la pomme rouge est à côté des chats noirs'
    """
    return make_pair(en).fr


# --------------------------------------------------------------------------------------------
# Sampling and splits
# --------------------------------------------------------------------------------------------

# Template 2 has only 18 nouns x 3 articles x 8 adjective choices x 7 predicates = 3024 distinct
# sentences, so it gets a small share: at 23k pairs it still leaves new ones for the test split.
TEMPLATE_WEIGHTS: tuple[float, float, float] = (0.47, 0.06, 0.47)
ADJ_PROBABILITY = 0.5  # of an attributive adjective on each noun phrase

_NOUN_LEMMAS = tuple(NOUNS)
_ADJ_LEMMAS = tuple(ADJECTIVES)


_NOUNS_EXCEPT: dict[str | None, tuple[str, ...]] = {
    x: tuple(n for n in _NOUN_LEMMAS if n != x) for x in (None, *_NOUN_LEMMAS)
}


def _sample_np(rng: random.Random, exclude: str | None = None) -> NounPhrase:
    noun = rng.choice(_NOUNS_EXCEPT[exclude])
    # the + singular, the + plural, a/an + singular: equally likely.
    kind = rng.randrange(3)
    adj = rng.choice(_ADJ_LEMMAS) if rng.random() < ADJ_PROBABILITY else None
    return NounPhrase(noun, plural=kind == 1, definite=kind != 2, adj=adj)


def sample_sentence(rng: random.Random) -> Sentence:
    """A random sentence structure. Subject and object nouns differ, so that every noun in a
    sentence has one unambiguous source for attention to find.

    Examples:
        >>> realize(sample_sentence(random.Random(0))).en == realize(sample_sentence(random.Random(0))).en
        True
    """
    template = rng.choices((1, 2, 3), weights=TEMPLATE_WEIGHTS)[0]
    subj = _sample_np(rng)
    if template == 1:
        return Sentence(1, subj, verb=rng.choice(TRANSITIVE_VERBS), obj=_sample_np(rng, exclude=subj.noun))
    if template == 2:
        return Sentence(2, subj, pred_adj=rng.choice(_ADJ_LEMMAS))
    return Sentence(3, subj, obj=_sample_np(rng, exclude=subj.noun))


@dataclass(frozen=True)
class Splits:
    """Train/valid/test pairs and the combinations held out of train and valid.

    `held_out_adj_noun` holds (adjective, noun) lemma pairs, `held_out_noun_noun` holds
    (subject noun, object noun) lemma pairs. No English sentence occurs twice in the whole corpus.
    Immutable (tuples of frozen pairs), so one cached instance can be shared by every caller.

    Examples:
        >>> s = make_splits(seed=0, n_train=50, n_valid=5, n_test=10)
        >>> len(s.train), len(s.test_unseen), any(s.is_unseen(p) for p in s.train)
        (50, 5, False)
    """

    seed: int
    train: tuple[Pair, ...]
    valid: tuple[Pair, ...]
    test: tuple[Pair, ...]
    held_out_adj_noun: frozenset[tuple[str, str]] = field(default_factory=frozenset)
    held_out_noun_noun: frozenset[tuple[str, str]] = field(default_factory=frozenset)

    def is_unseen(self, pair: Pair) -> bool:
        """True when the pair contains at least one held-out combination."""
        return _contains_held_out(
            pair.adj_noun, pair.noun_noun, self.held_out_adj_noun, self.held_out_noun_noun
        )

    @property
    def test_seen(self) -> tuple[Pair, ...]:
        return tuple(p for p in self.test if not self.is_unseen(p))

    @property
    def test_unseen(self) -> tuple[Pair, ...]:
        return tuple(p for p in self.test if self.is_unseen(p))


def _contains_held_out(
    adj_noun: tuple[tuple[str, str], ...],
    noun_noun: tuple[tuple[str, str], ...],
    held_adj_noun: frozenset[tuple[str, str]],
    held_noun_noun: frozenset[tuple[str, str]],
) -> bool:
    return not (held_adj_noun.isdisjoint(adj_noun) and held_noun_noun.isdisjoint(noun_noun))


def _hold_out(
    rng: random.Random, candidates: list[tuple[str, str]], fraction: float
) -> frozenset[tuple[str, str]]:
    """Pick `round(fraction * len(candidates))` combinations, spread so that no first or second
    element is held out much more often than the others (each lemma keeps most of its partners)."""
    n = round(fraction * len(candidates))
    if n == 0:
        return frozenset()
    firsts = {a for a, _ in candidates}
    seconds = {b for _, b in candidates}
    cap_first = math.ceil(n / len(firsts)) + 1
    cap_second = math.ceil(n / len(seconds)) + 1
    order = sorted(candidates)  # sorted first: set iteration order must not leak into the draw
    rng.shuffle(order)
    chosen: list[tuple[str, str]] = []
    count_first: dict[str, int] = {}
    count_second: dict[str, int] = {}
    for a, b in order:
        if count_first.get(a, 0) < cap_first and count_second.get(b, 0) < cap_second:
            chosen.append((a, b))
            count_first[a] = count_first.get(a, 0) + 1
            count_second[b] = count_second.get(b, 0) + 1
            if len(chosen) == n:
                return frozenset(chosen)
    raise AssertionError(f"could only hold out {len(chosen)} of {n} combinations under the caps")


def make_splits(
    seed: int = 0,
    n_train: int = 20_000,
    n_valid: int = 1_000,
    n_test: int = 2_000,
    unseen_fraction: float = 0.5,
    held_out_fraction: float = 0.1,
) -> Splits:
    """Deterministic train/valid/test splits with held-out combinations.

    `held_out_fraction` of the adjective–noun combinations and of the (subject, object) noun
    combinations never occur in train or valid; `round(unseen_fraction * n_test)` test pairs
    contain at least one of them, the rest contain none. Same seed, same splits.

    Examples:
        >>> sizes = dict(n_train=20, n_valid=2, n_test=4)
        >>> make_splits(seed=3, **sizes) == make_splits(seed=3, **sizes)
        True
    """
    for name, n in (("n_train", n_train), ("n_valid", n_valid), ("n_test", n_test)):
        if n < 0:
            raise ValueError(f"{name} ({n}) must be >= 0")
    if not 0.0 <= unseen_fraction <= 1.0:
        raise ValueError(f"unseen_fraction ({unseen_fraction}) must be in [0, 1]")
    if not 0.0 <= held_out_fraction <= 0.5:
        raise ValueError(f"held_out_fraction ({held_out_fraction}) must be in [0, 0.5]")

    rng = random.Random(seed)
    held_adj_noun = _hold_out(rng, [(a, n) for a in _ADJ_LEMMAS for n in _NOUN_LEMMAS], held_out_fraction)
    held_noun_noun = _hold_out(
        rng, [(s, o) for s in _NOUN_LEMMAS for o in _NOUN_LEMMAS if s != o], held_out_fraction
    )
    n_unseen = round(unseen_fraction * n_test)
    if n_unseen and not (held_adj_noun or held_noun_noun):
        raise ValueError(
            f"unseen_fraction ({unseen_fraction}) asks for unseen test pairs but held_out_fraction "
            f"({held_out_fraction}) holds out no combination"
        )

    used: set[str] = set()

    def draw(n: int, unseen: bool, split: str) -> list[Pair]:
        out: list[Pair] = []
        # Rejection sampling; the cap turns "the grammar has run out of new sentences" into an error.
        max_attempts = 20 * n + 10_000
        for _ in range(max_attempts):
            if len(out) == n:
                return out
            s = sample_sentence(rng)
            if _contains_held_out(s.adj_noun(), s.noun_noun(), held_adj_noun, held_noun_noun) != unseen:
                continue
            pair = realize(s)
            if pair.en in used:
                continue
            used.add(pair.en)
            out.append(pair)
        if len(out) == n:
            return out
        raise ValueError(
            f"could not draw {n} distinct {split} sentences in {max_attempts} attempts; ask for fewer"
        )

    train = draw(n_train, unseen=False, split="train")
    valid = draw(n_valid, unseen=False, split="valid")
    test = draw(n_unseen, unseen=True, split="unseen test")
    test += draw(n_test - n_unseen, unseen=False, split="seen test")
    rng.shuffle(test)
    return Splits(seed, tuple(train), tuple(valid), tuple(test), held_adj_noun, held_noun_noun)
