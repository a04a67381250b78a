"""`qkv show KIND TEXT [--FIELD VALUE …]`: any result kind, through its row of the kinds table.

    qkv show row-entropy "The dog found some pizza next to the baby and ate it" --layer 2 --head 5
    qkv show steps TEXT --token it --layer 3 --head 1 --json
    qkv show effects --model lm --probe induction

Every row of `qkv.explain.kinds.KINDS` with a `run` (the viewer's endpoints) is a kind
this command shows, with no code of its own: its request `fields` are its flags (`--layer`,
`--token`, `--words` …, each checked by its [`Field`][qkv.explain.kinds.Field] type before the
model loads), its `needs` the capability asked of `--model`, and its `render` / `json` /
`figure` / `page` how it is printed and drawn (`qkv.cli.command.show`; a row with no
`render` prints its JSON). A new kind is shown here once its row is in the table.

The flags are the table's fields, read once per version of qkv's source and kept
(`qkv.cli.options.cached`: the table imports torch, which parsing then does not); which of
them a kind takes, and which it needs, is checked against its row before the model loads.
"""

from __future__ import annotations

import argparse

from qkv.cli import options
from qkv.cli.command import Command

EXAMPLE = "The dog found some pizza next to the baby and ate it"


def shown_kinds() -> dict:
    """The rows this command shows: a `run` that takes a model (not a long document's)."""
    from qkv.explain.kinds import KINDS

    return {k.name: k for k in KINDS.values() if k.run is not None and not k.document}


def _kinds_help() -> str:
    lines = []
    for row in shown_kinds().values():
        flags = " ".join(_flag(f.name) + ("" if f.type == "bool" else f" {f.type.upper()}")
                         for f in row.fields)
        lines.append(f"  {row.name}{'' if row.text else ' (no TEXT)'} {flags}".rstrip())
    return "kinds and their fields:\n" + "\n".join(lines)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def field_flags() -> list[list[str]]:
    """[name, type] of every request field of a shown kind, once each (`--layer` is one flag
    for every kind with a layer)."""
    seen: dict[str, str] = {}
    for row in shown_kinds().values():
        for f in row.fields:
            seen.setdefault(f.name, f.type)
    return [[name, kind] for name, kind in seen.items()]


TYPES = {"index": lambda: options.integer(0, 2**31 - 1), "token": options.word,
         "method": options.name, "probe": options.name}


def _check(args: argparse.Namespace) -> None:
    """The kind known, TEXT given where it needs one, its fields given and no other kind's
    (before a model loads); `args.row` and `args.fields` for `_run`."""
    from qkv.errors import QkvError

    kinds = shown_kinds()
    if args.kind not in kinds:
        raise QkvError(f"unknown kind {args.kind!r}; known: {', '.join(kinds)}")
    row = kinds[args.kind]
    if row.text and args.text is None:
        raise QkvError(f"qkv show {row.name} needs a TEXT")
    if not row.text and args.text is not None:
        raise QkvError(f"qkv show {row.name} runs on its own: give no TEXT")
    given = {name: value for name, value in vars(args).items()
             if name.startswith("field_") and value is not None}
    mine = {f"field_{f.name}": f for f in row.fields}
    for name in given.keys() - mine.keys():
        raise QkvError(f"{_flag(name[6:])} is not a field of {row.name}; its fields: "
                       f"{' '.join(_flag(f.name) for f in row.fields) or 'none'}")
    for name, f in mine.items():
        if f.required and name not in given:
            raise QkvError(f"qkv show {row.name} needs {_flag(f.name)}")
    args.row = row
    args.fields = {f.name: given.get(name, f.default) for name, f in mine.items()}


def _run(model, args, progress):
    from qkv.errors import QkvError

    row = args.row
    if not getattr(model.capabilities, row.needs):
        raise QkvError(f"qkv show {row.name} needs a model with {row.needs.replace('_', '-')}; "
                       f"{args.model!r} has none")
    if row.from_map:  # run(map): the head's map, picked by the layer/head/words fields
        from qkv.explain.maps import attention_map

        return row.run(attention_map(model, args.text, **args.fields))
    return row.run(model, args.text, **args.fields)


SHOW = Command(_run, check=_check, page="show.html")


def add_show(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Compute one kind of result — any row of the kinds table the viewer answers — and print "
        "it as its row says (a table, or --json); the kind's request fields are its flags.")
    p.epilog = options.Later(lambda: _kinds_help() + f'\nexample: qkv show row-entropy "{EXAMPLE}" '
                                                     "--layer 2 --head 5")
    p.add_argument("kind", type=options.name(), metavar="KIND",
                   help="the kind of result (listed below with its fields)")
    p.add_argument("text", nargs="?", type=options.text(), default=None,
                   help="the text to run the model on (not for a kind that runs on its own)")
    for name, kind in options.cached(field_flags):  # the table's fields, read once per version
        if kind == "bool":
            p.add_argument(_flag(name), dest=f"field_{name}", action="store_const", const=True,
                           default=None, help=f"the {name} field (where the kind has one)")
        else:
            p.add_argument(_flag(name), dest=f"field_{name}", type=TYPES[kind](), default=None,
                           metavar=kind.upper(), help=f"the {name} field (where the kind has one)")
    options.add_model_argument(p, default="minilm")
    p.add_argument("--top", type=options.integer(1, 10_000), default=10,
                   help="how many items a kind's table lists, where it lists some (default 10)")
    options.add_output_arguments(
        p, png="also draw it, for a kind that has a figure",
        html="also write it as a self-contained page, for a kind that has one")
    SHOW.add_to(p)
