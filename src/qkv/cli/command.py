"""The one pattern of a command that computes a [`qkv.explain`][qkv.explain] result, written once.

    check outputs → load → progress → result → show (table or JSON) and write files

A command module adds its arguments and describes the rest as a `Command`: the checks
that need no model, and the one call into the library (`compute`). `run` does every
step in that order; how the result is shown comes from its row of
`qkv.explain.kinds.KINDS` (`show`):

* `--json`: the row's `json` of `to_dict()`, built whole before a byte is written;
* otherwise the row's `render` (a table on the terminal; a row without one: its JSON);
* `--png FILE`: the row's `figure`; `--html FILE`: the row's `page` — each written
  atomically, after the result, and said on stderr (`wrote FILE`).

Outputs are checked before the model loads, so a typo in `--png` costs nothing; a library
error naming an argument (`token`) is re-spelled as the command's flag (`--token`). The
model comes from `load_model`: `--model` on `--device` in `--dtype`
(`qkv.cli.options.add_model_argument` adds all three).

Example (`qkv why`'s whole body):

Examples:
    >>> WHY = Command(lambda model, args, progress: score_attribution(
    ...     model, args.text, layer=args.layer, head=args.head, token=args.token, key=args.to),
    ...     flags={"key": "--to"}, page="why.html")               # doctest: +SKIP
"""

from __future__ import annotations

import argparse
import functools
import shlex
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

from qkv.cli.output import check_files, print_json, say_written, write_files


@dataclass(frozen=True)
class Command:
    """A command's steps besides its arguments.

    Attributes:
        compute: `(model, args, progress) → result`: the one library call (`model` None when
            `loads` is False; `progress(stage, done, total)` draws bars on a terminal).
        flags: the library's argument names → this command's flags (`{"key": "--to"}`), for
            errors and notes.
        check: `args → None`: refuses what it can before anything loads (raises QkvError);
            it may read an input file into `args` (so a bad file costs no model load).
        page: the file name `--html` suggests when given a directory (`"why.html"`).
        loads: whether the command loads `--model`.
    """

    compute: Callable[[Any, argparse.Namespace, Callable], Any]
    flags: dict[str, str] = field(default_factory=dict)
    check: Callable[[argparse.Namespace], None] | None = None
    page: str = "page.html"
    loads: bool = True

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        """Make `parser`'s command run this (its `func`)."""
        parser.set_defaults(func=functools.partial(run, self))


def run(command: Command, args: argparse.Namespace) -> int:
    """Every step of `command` for the parsed `args`, in order; the exit code."""
    from qkv.cli.progress import Bars
    from qkv.explain.wording import ArgumentError

    try:
        if command.check is not None:
            command.check(args)
        check_files(args, example=command.page)
        model = load_model(args) if command.loads else None
        with Bars(enabled=not getattr(args, "json", False)) as bars:
            result = command.compute(model, args, bars)
        return show(args, result, flags=command.flags)
    except ArgumentError as e:  # the library's argument names, in this command's flags
        from qkv.cli.options import spelling

        raise e.spelled(spelling(command.flags)) from None


def load_model(args: argparse.Namespace, name: str | None = None):
    """`--model` (or the model `name`) as [`qkv.load`][qkv.load] reads it, on `--device` in
    `--dtype` where they are given (otherwise the CPU, in the dtype the checkpoint stores)."""
    from qkv.models import load

    given = {}
    if getattr(args, "device", None) is not None:
        given["device"] = args.device
    if getattr(args, "dtype", None) is not None:
        import torch

        given["dtype"] = getattr(torch, args.dtype)
    return load(args.model if name is None else name, **given)


def check_length(model, text: str) -> None:
    """A text longer than `model` takes: the one sentence for it
    (`qkv.explain.wording.too_long`, spelled `--model reader` by `options.in_flags`),
    before the forward."""
    from qkv.explain.wording import too_long

    tokenizer = model.tokenizer  # a self-attention model's (models.protocol.SelfAttentionModel)
    limit = tokenizer.max_length if tokenizer is not None else None  # None: a bare transformers model
    if limit is None:
        return
    n = len(tokenizer.encode(text, max_length=sys.maxsize).ids)
    if n > limit:
        raise too_long(n, model.name, limit)


def show(args: argparse.Namespace, result, *, flags: dict[str, str], model=None,
         figure: Callable[[], Any] | None = None) -> int:
    """Print `result` as its row of `qkv.explain.kinds.KINDS` says and write the files
    asked for (see the module doc). `model`: a self-attention model whose result holding NaN/inf
    is refused naming where it first computed one; `figure()` draws `--png` instead of the
    row's `figure` (a figure that needs more than the result)."""
    import inspect
    from importlib import import_module

    from qkv.explain.kinds import kind_of
    from qkv.explain.rendering.render import console

    row, doc = kind_of(result), result.to_dict()
    if model is not None:
        _refuse_non_finite(model, args.text, doc)
    for note in getattr(result, "notes", ()):
        print(f"qkv: note: {note.spelled(flags)}", file=sys.stderr)
    if figure is None and row.figure is not None:
        figure = functools.partial(row.figure, result)
    written = write_files(args, figure=figure,
                          page=functools.partial(row.page, result) if row.page else None)
    if getattr(args, "json", False) or not row.render:  # a kind with no table: its JSON
        data = row.json(doc)
        if getattr(args, "top_given", False) and isinstance(data, list):
            data = data[:args.top]  # qkv heads --json --top N: N heads (all without --top)
        print_json(data, ensure_ascii=False)  # UTF-8 out, as the text came in
    else:
        module, _, name = row.render.partition(":")
        render = getattr(import_module(module), name)
        options = {"names": flags, "top": getattr(args, "top", None),
                   "model_arg": shlex.quote(str(getattr(args, "model", "")))}
        wanted = inspect.signature(render).parameters
        render(console(), result, **{k: v for k, v in options.items()
                                     if k in wanted and v is not None})
    say_written(written)
    return 0


def _refuse_non_finite(model, text: str, result: dict) -> None:
    """QkvError naming the first layer and head where the model computed NaN/inf, when the
    result to be shown holds one (a broken model; the numbers would mean nothing)."""
    from qkv.cli.output import first_non_finite
    from qkv.errors import QkvError
    from qkv.explain.forward import trace

    where = first_non_finite(result)
    if where is not None:
        trace(model, text, slice(None))  # traces every row; raises NonFiniteError at the first layer and head
        raise QkvError(f"the result holds a non-finite number at {where}: the model's weights "
                       f"or input give NaN or infinity, so there is nothing true to show")
