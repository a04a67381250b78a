"""How qkv.explain's messages name the arguments they are about.

The same mistake reaches a user through two doors: a library call (`explain(model, text,
token="cat")`) and the command line (`qkv explain TEXT --token cat`). Each should be told in
its own words — `token 'cat' is not a token of the text` vs `--token 'cat' is not a token of
the text` — from one message written once.

So a message is a `Message`: a `str.format` template in which every argument appears
by its *role* — `{token}`, `{layer}`, `{head}`, `{words}`, … , and `{name}` for the
argument the message is about — plus the values it shows. Spelling it fills the roles in:

* `ARGUMENTS`, the default, spells a role as the library's keyword (`token`, `layer`,
  `words=True`); `str(message)` and `str(error)` use it;
* the CLI passes its own mapping (`qkv.cli.explain.FLAGS`: `--token`, `--from`, `--words`).

A mapping need only name the roles it spells differently; the rest keep the library's spelling.
Errors about arguments are
`ArgumentError` (a `QkvError`); `ArgumentError.spelled` gives the
same error in another spelling. Values are kept apart from the template, so a user's text with
braces in it is shown as typed.

Examples:
    >>> m = Message("{name} {value} is out of range; pick another with {layer}", "head", value=12)
    >>> str(m)
    'head 12 is out of range; pick another with layer'
    >>> m.spelled({"head": "--head", "layer": "--layer"})
    '--head 12 is out of range; pick another with --layer'
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from qkv.errors import QkvError

# How the library spells each role: its keyword argument (a flag-like one as the call that sets it).
ARGUMENTS: Mapping[str, str] = {
    "token": "token", "to": "to", "layer": "layer", "head": "head", "words": "words=True",
    "top": "top", "source": "source", "target": "target", "probe": "name", "dims": "dims",
    "keys": "keys", "trials": "trials", "model": "model",
    "method": "method", "target_text": "target_text",  # qkv.explain.contributions
    "key": "key", "component": "component",  # qkv.explain.circuits
    "mixer": "mixer",  # qkv.explain.mixer_maps (which of a layer's mixers)
    # fields of a probe file (qkv/data/coref.jsonl), named when one does not match its sentence
    "pronoun": "pronoun", "referent": "referent",
    # qkv.explain.interventions, head_effects, faithfulness (their probe= is "probe", not "name")
    "heads": "heads", "mode": "mode", "text_or_ids": "text_or_ids", "clean": "clean",
    "corrupted": "corrupted", "length": "length", "effects_probe": "probe",
    "block": "block", "rows": "rows",  # qkv.explain.document_results (a document's tiles, rows)
    "memory_limit": "memory_limit",  # qkv.explain.document
    "sequences": "sequences", "methods": "methods",  # head_effects, faithfulness
    # qkv.explain.retrieval, needle, atlas
    "needle": "needle", "depth": "depth", "samples": "samples", "k": "k", "lengths": "lengths",
    "depths": "depths", "window": "window", "contexts": "contexts", "first": "first",
    "text": "text", "reader": "qkv.load('reader')",  # the shipped model for long texts (CLI: --model reader)
}


@dataclass(frozen=True)
class Message:
    """A sentence that names arguments by role (see the module docstring).

    Attributes:
        template: a `str.format` template; roles and `{name}` are filled in by
            `spelled`, everything else from `values`.
        about: the role `{name}` stands for, or None.
        values: the numbers and words the sentence shows; a value that is itself a Message is
            spelled the same way (sentences joined into one note).
    """

    template: str
    about: str | None = None
    values: Mapping[str, object] = field(default_factory=dict)

    def __init__(self, template: str, about: str | None = None, **values: object):
        object.__setattr__(self, "template", template)
        object.__setattr__(self, "about", about)
        object.__setattr__(self, "values", dict(values))

    def spelled(self, names: Mapping[str, str] = ARGUMENTS) -> str:
        """The sentence with each role spelled as `names` says."""
        spelling = {**ARGUMENTS, **names}
        if self.about is not None:
            spelling["name"] = spelling[self.about]
        values = {k: v.spelled(names) if isinstance(v, Message) else v for k, v in self.values.items()}
        return self.template.format_map({**spelling, **values})

    def __str__(self) -> str:
        return self.spelled()


class ArgumentError(QkvError):
    """A bad argument to a [`qkv.explain`][qkv.explain] function; the message names it by its role.

    `str(error)` uses the library's names; `error.spelled(names)` is the same error as a
    plain `QkvError` in other words (the CLI's flags).

    Examples:
        >>> e = ArgumentError("top", "{name} must be at least 1, got {value}", value=0)
        >>> str(e), str(e.spelled({"top": "--top"}))
        ('top must be at least 1, got 0', '--top must be at least 1, got 0')
    """

    def __init__(self, about: str, template: str, **values: object):
        self.message = Message(template, about, **values)
        super().__init__(str(self.message))

    @property
    def argument(self) -> str:
        """The role of the argument at fault (`"token"`, `"layer"`, …)."""
        return self.message.about

    def spelled(self, names: Mapping[str, str]) -> QkvError:
        return QkvError(self.message.spelled(names))


def too_long(n: int, who: str, limit: int) -> ArgumentError:
    """The one sentence for a text with more tokens than the model takes, whichever command or
    call met it: how many, the model's limit, and the shipped model that reads long texts.

    Examples:
        >>> e = too_long(601, "qkv-lm", 65)
        >>> str(e)
        "the text is 601 tokens and qkv-lm takes at most 65; shorten it, or read it with qkv.load('reader') (up to 131,072 tokens)"
        >>> str(e.spelled({"reader": "--model reader"}))
        'the text is 601 tokens and qkv-lm takes at most 65; shorten it, or read it with --model reader (up to 131,072 tokens)'
    """
    from qkv.reader import max_positions

    most = max_positions()
    reader = Message(", or read it with {reader} (up to {most:,} tokens)", most=most) if limit < most else ""
    return ArgumentError("text", "the text is {n:,} tokens and {who} takes at most {limit:,}; "
                         "shorten it{reader_note}", n=n, who=who, limit=limit, reader_note=reader)
