"""The grammar's gold alignment for a sentence: what the translation model answers when asked
for its `gold_alignment(text)` ([`qkv.models.protocol`][qkv.models.protocol]), so that
[`qkv.explain.cross_attention`][qkv.explain.cross_attention] checks each head against it.

The explanation library does not know the toy grammar: it asks the model, and a model that
learned no grammar (a transformers encoder-decoder) has no gold alignment.

Examples:
    >>> french, links = grammar_gold("the red apple is next to the black cats")
    >>> french[:3], links[:3]              # "la" ← the, "pomme" ← apple, "rouge" ← red
    (['la', 'pomme', 'rouge'], [(0,), (2,), (1,)])
    >>> grammar_gold("the zebra")[:40]
    'no gold alignment: the text is not a sen'
"""

from __future__ import annotations

from qkv.translate.grammar import make_pair
from qkv.translate.vocab import normalize_en


def grammar_gold(text: str) -> tuple[list[str], list[tuple[int, ...]]] | str:
    """(the grammar's French tokens, per French token the English token indices it translates),
    or a sentence saying why there is none (the text is not a sentence of the grammar)."""
    try:
        pair = make_pair(normalize_en(text))
    except ValueError as e:
        return f"no gold alignment: the text is not a sentence of the grammar ({e})"
    return list(pair.fr_tokens), [tuple(a) for a in pair.alignment]
