"""Every command-line option's value is checked here, once, by the type it is parsed with.

Each option of every `qkv` command takes its `type=` from this module (or is a flag with no
value, or has `choices`); `tests/cli/test_options.py` walks the whole parser and fails on an
option that does not, so a new option cannot skip the checks. A bad value ends the command
before anything runs, with one line that names the flag and the value:

```text
qkv: error: --threads must be at most 8 (4 × this machine's 2 CPU cores), got 100000
```

The helpers return argparse `type` callables (`str -> value`) that raise
`argparse.ArgumentTypeError` with a message that reads after the flag's name
("must be at least 1, got 0"); `Parser` prints it as `--flag <message>`.

    integer(lo, hi)          whole numbers in [lo, hi] (``hi`` may say why it is the limit)
    real(lo, hi)             finite floats in [lo, hi] (``nan``/``inf`` refused); open ends optional
    threads()                torch threads: 1 … 4 × the CPU cores
    seed()                   0 … 2**63 − 1 (what torch.Generator.manual_seed takes)
    int_list(lo, hi, most)   "4,16,64": comma-separated integer()s (``hi`` None: no upper bound)
    text()                   any text; invalid UTF-8 refused (qkv.text), a leading BOM dropped
    word()                   a word or an index (``--token``), same checks as text()
    path()                   a file or directory name: not empty, no NUL, valid UTF-8
    name()                   a short identifier-like value (a model or probe name, or a path)

Examples:
    >>> p = Parser(prog="qkv")
    >>> _ = p.add_argument("--top", type=integer(1, 100), default=3)
    >>> p.parse_args(["--top", "5"]).top
    5
    >>> integer(1, 100)("0")
    Traceback (most recent call last):
    argparse.ArgumentTypeError: must be at least 1, got 0
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import math
import os
import re
import sys
from typing import Any, Callable

from qkv.text import TextError, clean_text

#: The attribute every validating type carries; the parser test looks for it.
MARK = "_qkv_option"

# The most threads a torch op may start: a few per core is already past any gain, and libgomp
# fails to create tens of thousands ("Thread creation failed"; 100000 segfaulted).
THREADS_PER_CORE = 4

SEED_MAX = 2**63 - 1  # torch.Generator.manual_seed takes a 64-bit integer


def _mark(func, kind: str, **limits):
    setattr(func, MARK, {"kind": kind, **limits})
    func.__name__ = kind  # argparse names the type in some messages
    return func


def _show(raw: str, limit: int = 40) -> str:
    """The value as typed, quoted and shortened for a one-line message."""
    text = raw if len(raw) <= limit else raw[:limit] + "…"
    return repr(text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace"))


def integer(lo: int | None = None, hi: int | None = None, *, why: str = ""):
    """A whole number in `[lo, hi]`; `why` explains the upper limit in the message.

    Examples:
        >>> integer(1, 64, why="beams")("64")
        64
    """

    def parse(raw: str) -> int:
        s = raw.strip().replace("_", "")
        if not re.fullmatch(r"[+-]?\d{1,40}", s):
            raise argparse.ArgumentTypeError(f"must be a whole number, got {_show(raw)}")
        value = int(s)
        if lo is not None and value < lo:
            raise argparse.ArgumentTypeError(f"must be at least {lo}, got {value}")
        if hi is not None and value > hi:
            because = f" ({why})" if why else ""
            raise argparse.ArgumentTypeError(f"must be at most {hi}{because}, got {_shorten(value)}")
        return value

    return _mark(parse, "integer", lo=lo, hi=hi)


def _shorten(value: int) -> str:
    s = str(value)
    return s if len(s) <= 20 else f"{s[:8]}…({len(s)} digits)"


def real(lo: float | None = None, hi: float | None = None, *, lo_open: bool = False,
         hi_open: bool = False):
    """A finite float in `[lo, hi]` (`lo_open`/`hi_open` exclude the end itself).

    Examples:
        >>> real(0, 1)("0.5")
        0.5
        >>> real(0, lo_open=True)("nan")
        Traceback (most recent call last):
        argparse.ArgumentTypeError: must be a finite number, got 'nan'
    """

    def parse(raw: str) -> float:
        try:
            value = float(raw.strip().replace("_", ""))
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number, got {_show(raw)}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {_show(raw)}")
        if lo is not None and (value <= lo if lo_open else value < lo):
            word = "greater than" if lo_open else "at least"
            raise argparse.ArgumentTypeError(f"must be {word} {lo:g}, got {value:g}")
        if hi is not None and (value >= hi if hi_open else value > hi):
            word = "less than" if hi_open else "at most"
            raise argparse.ArgumentTypeError(f"must be {word} {hi:g}, got {value:g}")
        return value

    return _mark(parse, "real", lo=lo, hi=hi)


def cpu_cores() -> int:
    """The CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def threads():
    """Torch threads: 1 … `THREADS_PER_CORE` × the CPU cores."""
    cores = cpu_cores()
    hi = THREADS_PER_CORE * cores
    parse = integer(1, hi, why=f"{THREADS_PER_CORE} × this machine's {cores} CPU cores")
    getattr(parse, MARK)["threads"] = True  # tests keep to few threads on a shared machine
    return parse


def seed():
    """A random seed: 0 … 2**63 − 1."""
    return integer(0, SEED_MAX, why="a 64-bit seed")


def int_list(lo: int, hi: int | None, *, most: int, why: str = ""):
    """Comma-separated whole numbers, each in `[lo, hi]`, at most `most` of them.

    Examples:
        >>> int_list(1, 1024, most=8)("4, 16,64")
        [4, 16, 64]
    """
    one = integer(lo, hi, why=why)

    def parse(raw: str) -> list[int]:
        parts = [p for p in raw.split(",") if p.strip()]
        if not parts:
            raise argparse.ArgumentTypeError(f"must be comma-separated whole numbers, got {_show(raw)}")
        if len(parts) > most:
            raise argparse.ArgumentTypeError(f"must list at most {most} numbers, got {len(parts)}")
        values = []
        for p in parts:
            try:
                values.append(one(p))
            except argparse.ArgumentTypeError:
                span = f"from {lo} to {hi}" if hi is not None else f"of at least {lo}"
                raise argparse.ArgumentTypeError(f"must be comma-separated whole numbers {span}, "
                                                 f"got {_show(p.strip())}") from None
        return values

    return _mark(parse, "int_list", lo=lo, hi=hi, most=most)


# Stands for the argument in a text error; Parser.error puts in the flag (or "the text").
_ARG = "<arg>"


def _checked(raw: str) -> str:
    try:
        return clean_text(raw, what=_ARG)
    except TextError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def text(*, most: int = 1_000_000):
    """Any text (the input of a model): valid UTF-8, a leading BOM dropped, at most `most`
    characters (a model's own length limit is checked later, in its tokens)."""

    def parse(raw: str) -> str:
        value = _checked(raw)
        if len(value) > most:
            raise argparse.ArgumentTypeError(f"must be at most {most} characters, got {len(value)}")
        return value

    return _mark(parse, "text", most=most)


def word():
    """A word of the text, `WORD@N` or a token index (decided later, against the text)."""

    def parse(raw: str) -> str:
        value = _checked(raw)
        if len(value) > 1000:
            raise argparse.ArgumentTypeError(f"must be a word or an index, got {len(value)} characters")
        return value

    return _mark(parse, "word")


def path():
    """A file or directory name: not empty, no NUL byte, valid UTF-8 (`~` is expanded later)."""

    def parse(raw: str) -> str:
        if not raw:
            raise argparse.ArgumentTypeError("must not be empty")
        if "\0" in raw:
            raise argparse.ArgumentTypeError(f"must not contain a NUL byte, got {_show(raw)}")
        value = _checked(raw)
        if len(value.encode("utf-8")) > 4096:
            raise argparse.ArgumentTypeError("is longer than any path (4096 bytes)")
        return value

    return _mark(parse, "path")


def name():
    """A model or probe name, or a path (known names are looked up by the command)."""
    parse = path()
    return _mark(parse, "name")


def validates(action: argparse.Action) -> bool:
    """Whether `action`'s value goes through a check of this module (or needs none)."""
    if action.nargs in (0, argparse.PARSER):
        return True  # flags (--help and --version too) and sub-commands take no value
    if action.choices is not None:
        return True  # argparse refuses anything else
    return hasattr(action.type, MARK)


def unchecked_options(parser: argparse.ArgumentParser, prefix: str = "qkv") -> list[str]:
    """`"qkv explain --top"` for every option of every command that skips this module."""
    out = []
    for action in parser._actions:
        if action.nargs == argparse.PARSER:  # sub-commands
            for command, sub in action.choices.items():
                out += unchecked_options(sub, f"{prefix} {command}")
        elif not validates(action):
            out.append(f"{prefix} {action.option_strings[0] if action.option_strings else action.dest}")
    return out


def model_names(*, self_attention: bool = False, decoder: bool = False) -> str:
    """The names `--model` takes besides a directory, for help texts: the shipped models of
    `qkv.models.registry.SHIPPED` (a second name of the same model left out); with
    `self_attention`, only those explained by their self-attention (`qkv heads`); with
    `decoder`, only causal self-attention models that predict the next token, what `qkv
    needle` and `qkv atlas` read (each model is loaded to ask it: their help only).

    Examples:
        >>> model_names(self_attention=True)
        'lm, reader, minilm'
        >>> model_names(decoder=True)
        'lm, reader'
    """
    from qkv.models.registry import SHIPPED

    names: dict[str, str] = {}  # display name → the first name that ships it
    for name, shipped in SHIPPED.items():
        if (shipped.self_attention or not self_attention) and (not decoder or _predicts(name)):
            names.setdefault(shipped.display, name)
    return ", ".join(names.values())


def _predicts(name: str) -> bool:
    from qkv.models import load

    caps = load(name).capabilities
    return caps.self_attention and caps.causal and caps.next_token


class Later:
    """Help text made when it is shown, not when the parser is built: a text that lists one of the
    library's tables (shipped models, probes, contribution methods), whose modules import torch.
    So building a command's parser and checking its arguments import no torch.

    Showing it the first time reads the tables (~3 s: torch); the text is then kept in
    `help_cache_file`, a file named by the version of qkv's source (every `.py` file's
    name, size and time), so later helps read the file, and an edit or a new install of
    qkv makes the text again. Nothing keeps the file in step by hand: it is made from the tables.

    Examples:
        >>> help = Later(lambda: "one of " + ", ".join(["coref", "induction"]))
        >>> "coref" in help, str(help)
        (True, 'one of coref, induction')
    """

    def __init__(self, make: Callable[[], str]):
        self._make, self._text = make, None

    def __str__(self) -> str:
        if self._text is None:
            self._text = cached(self._make)
        return self._text

    def __contains__(self, part: str) -> bool:
        return part in str(self)

    def __getattr__(self, name: str):  # the text's own methods: strip, splitlines …
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(str(self), name)


def cached(make: Callable[[], Any]) -> Any:
    """`make()` (a JSON value), made once per version of qkv's source and then read from
    `help_cache_file`: what a parser needs from the library's tables (a help text, the
    fields of the result kinds) without importing them (torch) each time."""
    cache, key = _help_cache(), _key(make)
    if key not in cache:
        cache[key] = make()
        _save_help_cache(cache)
    return cache[key]


def constant(where: str):
    """A constant of the library, `"module:NAME"` (a bound such as
    `qkv.explain.probes.induction:MAX_SEQUENCES`), read once per version of qkv's source
    (`cached`), so a flag checks the library's own bound without importing torch.

    Examples:
        >>> constant("qkv.explain.probes.induction:MAX_SEQUENCES")
        1000
    """
    return cached(lambda: _constant(where))


def _constant(where: str):
    module, _, name = where.partition(":")
    return getattr(importlib.import_module(module), name)


def _key(make: Callable) -> str:
    """Where `make` is written and what it was made with (its closure's values)."""
    code = make.__code__
    cells = [repr(c.cell_contents) for c in make.__closure__ or ()]
    return f"{os.path.basename(code.co_filename)}:{code.co_firstlineno}:{code.co_qualname}:{cells}"


_HELP_CACHE: dict[str, Any] | None = None


def help_cache_file() -> str:
    """`$XDG_CACHE_HOME/qkv/help-<version>.json` (default `~/.cache`): the `Later`
    texts made for this version of qkv's source."""
    import hashlib

    import qkv

    root = os.path.dirname(os.path.abspath(qkv.__file__))
    version = hashlib.sha1(f"{sys.version}{root}".encode())
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = sorted(d for d in subfolders if d not in ("__pycache__", "data"))
        for file in sorted(f for f in files if f.endswith(".py")):
            st = os.stat(os.path.join(folder, file))
            version.update(f"{folder}/{file}:{st.st_size}:{st.st_mtime_ns}".encode())
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "qkv", f"help-{version.hexdigest()[:16]}.json")


def _help_cache() -> dict[str, Any]:
    global _HELP_CACHE
    if _HELP_CACHE is None:
        try:
            with open(help_cache_file(), encoding="utf-8") as f:
                _HELP_CACHE = dict(json.load(f))
        except (OSError, ValueError, TypeError):
            _HELP_CACHE = {}
    return _HELP_CACHE


def _save_help_cache(cache: dict[str, Any]) -> None:
    """Write the cache (atomically), removing other versions' files a day old (another checkout
    of qkv keeps its own meanwhile); a cache that cannot be written (a read-only home) only
    costs the next `--help` its tables again."""
    import time

    path = help_cache_file()
    folder = os.path.dirname(path)
    try:
        os.makedirs(folder, exist_ok=True)
        for old in os.listdir(folder):
            other = os.path.join(folder, old)
            if old.startswith("help-") and other != path and os.path.getmtime(other) < time.time() - 86400:
                os.remove(other)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(cache, f, ensure_ascii=False)
        os.replace(tmp, path)
    except OSError:
        pass


class HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, except that a description's or epilog's own line breaks are kept:
    each line is wrapped on its own, and an example command (an indented line, or one after
    `example: `) not at all, so it can be copied whole; a `Later` text is made here."""

    def _get_help_string(self, action):
        return str(action.help)

    def _format_text(self, text):
        return super()._format_text(str(text))

    def _fill_text(self, text, width, indent):
        fill = super()._fill_text
        return "\n".join(indent + line if line.startswith((" ", "example: ")) else fill(line, width, indent)
                         for line in text.splitlines())


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line, `qkv: error: <message>`, exit code 2.

    argparse's own format is a usage block and `qkv explain: error: argument --top: …`;
    the usage is one `--help` away, and the command is named at the end instead. Its help keeps
    the line breaks of descriptions and epilogs (`HelpFormatter`); sub-commands' parsers
    are Parsers too (argparse makes them of the parent's class).

    A sub-command's parser may be filled when it is first used (`add_commands`): `fill`
    names the function that adds its arguments, run by `filled` — so `qkv why …` imports
    the why command's module only, and no other command's.
    """

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)
        self.fill: str | None = None  # "module:function" that adds this command's arguments
        self.lazy = False  # sub-commands filled when used (True) or at once

    def filled(self) -> "Parser":
        """This parser with its arguments added (`fill(self)` run once)."""
        if self.fill is not None:
            where, self.fill = self.fill, None
            module, _, function = where.partition(":")
            getattr(importlib.import_module(module), function)(self)
        return self

    def parse_known_args(self, args=None, namespace=None):  # argparse's signature
        return super(Parser, self.filled()).parse_known_args(args, namespace)

    def format_help(self) -> str:
        return super(Parser, self.filled()).format_help()

    def error(self, message: str):  # argparse's signature
        print(f"qkv: error: {_one_line(message, self.prog)}", file=sys.stderr)
        self.exit(2)


def add_commands(parser: Parser, commands: dict[str, tuple[str, str]], *, dest: str,
                 metavar: str, title: str) -> argparse.Action:
    """Sub-commands of `parser` from a table, name → (`"module:function"` that adds the
    command's arguments to its parser, the one line `--help` lists it with). With
    `parser.lazy` a command's function runs (its module imported) only when the command is
    parsed or its help shown; otherwise at once (the tests walk every command's options).

    Examples:
        >>> p = Parser(prog="qkv"); p.lazy = True
        >>> _ = add_commands(p, {"walkthrough": ("qkv.cli.demo:add_walkthrough", "the example")},
        ...                  dest="command", metavar="COMMAND", title="one of these:")
        >>> p.parse_args(["walkthrough", "--dim", "6"]).dim
        6
    """
    sub = parser.add_subparsers(dest=dest, metavar=metavar, help=title)
    for name, (where, help) in commands.items():
        command = sub.add_parser(name, help=help)
        command.fill, command.lazy = where, parser.lazy
        if not parser.lazy:
            command.filled()
    return sub


def _one_line(message: str, prog: str) -> str:
    """argparse's `argument --top: must be …` → `--top must be …`; other messages (a missing
    argument, an unknown option) point to the command's `--help`."""
    m = re.match(r"argument ([^:]+?): (.*)$", message, re.S)
    if m and m.group(2).startswith(_ARG):  # text that is not valid UTF-8
        flag = m.group(1).split("/")[0]
        message = m.group(2).replace(_ARG, flag if flag.startswith("-") else "the text", 1)
    elif m and m.group(2).startswith(("must ", "is ")):  # one of this module's checks
        message = f"{m.group(1).split('/')[0]} {m.group(2)}"
    else:
        if m:
            message = f"{m.group(1).split('/')[0]}: {m.group(2)}"
        message += f" (see {prog} --help)"
    return " ".join(message.split())


def spelling(flags: dict[str, str]) -> dict[str, str]:
    """The library's argument names → a command's flags: `flags` and, for every command, the
    long-text model's (`reader` → `--model reader`)."""
    return {"reader": "--model reader", **flags}


def in_flags(flags: dict[str, str]):
    """Decorator for a command's `run(args)`: a [`qkv.explain`][qkv.explain] ArgumentError it raises
    is re-raised in the words of `flags` (the library says `token`, the command line `--token`)."""

    spelled_as = spelling(flags)

    def decorate(run):
        @functools.wraps(run)
        def wrapper(args: argparse.Namespace) -> int:
            from qkv.explain.wording import ArgumentError

            try:
                return run(args)
            except ArgumentError as e:
                raise e.spelled(spelled_as) from None

        return wrapper

    return decorate


DEVICES = ("cpu", "cuda", "mps")
DTYPES = ("float32", "bfloat16", "float16", "float64")  # names of torch's floating-point dtypes


def device():
    """A device torch can run on here: `cpu`, `cuda` (or `cuda:N`) or `mps`. Only a
    device other than the CPU imports torch (to ask it whether the device is there).

    Examples:
        >>> device()("cpu")
        'cpu'
        >>> device()("tpu")
        Traceback (most recent call last):
        argparse.ArgumentTypeError: must be one of cpu, cuda, mps (cuda:N for one GPU), got 'tpu'
    """

    def parse(raw: str) -> str:
        value = raw.strip().lower()
        kind, _, index = value.partition(":")
        if kind not in DEVICES or (index and (kind != "cuda" or not index.isdigit())):
            raise argparse.ArgumentTypeError(f"must be one of {', '.join(DEVICES)} (cuda:N for one "
                                             f"GPU), got {_show(raw)}")
        if kind != "cpu":
            _check_available(kind, int(index or 0))
        return value

    return _mark(parse, "device")


def _check_available(kind: str, index: int) -> None:
    import torch

    if kind == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if index >= count:
            have = f"{count} CUDA GPU{'s' * (count != 1)}" if count else "no CUDA GPU"
            built = "" if torch.version.cuda else f"; this torch {torch.__version__} is built without CUDA"
            raise argparse.ArgumentTypeError(f"must be a device this machine has: cuda"
                                             f"{f':{index}' if index else ''} is not ({have}{built}); "
                                             f"use cpu")
    elif not torch.backends.mps.is_available():
        raise argparse.ArgumentTypeError("must be a device this machine has: mps is not (Apple "
                                         "silicon's GPU); use cpu")


def add_model_argument(parser: argparse.ArgumentParser, *, default: str | None,
                       self_attention: bool = False, decoder: bool = False,
                       default_note: str = "") -> None:
    """`--model` (a shipped model's name or a model directory, its help listing the shipped
    names that fit: `self_attention`, or `decoder`: next-token decoders only), `--device`
    and `--dtype` (what `qkv.cli.command.load_model` passes to [`qkv.load`][qkv.load]).
    `default_note` follows the default in the help (`"; with --file, reader"`)."""
    what = "a decoder: " if decoder else ""
    shown = default if default is not None else "minilm"
    parser.add_argument(
        "--model", type=name(), default=default,
        help=Later(lambda: f"{what}a shipped model ({model_names(self_attention=self_attention, decoder=decoder)}) "
                           f"or a model directory (default {shown}{default_note})"))
    add_device_arguments(parser)


def add_device_arguments(parser: argparse.ArgumentParser) -> None:
    """`--device` and `--dtype`: where and in what floating-point type the model runs."""
    parser.add_argument("--device", type=device(), default=None,
                        help="where the model runs: cpu (the default), cuda, cuda:N or mps")
    parser.add_argument("--dtype", choices=DTYPES, default=None, metavar="DTYPE",
                        help=f"the weights' floating-point type: {', '.join(DTYPES)} (default: as "
                             "the checkpoint stores them)")


def add_output_arguments(parser: argparse.ArgumentParser, *, png: str | None = None,
                         html: str | None = None,
                         json: str = "print every number as one JSON object") -> None:
    """A command's outputs, each with its help (`None`: the command has none): `--png FILE`
    (the result's figure), `--html FILE` (its self-contained page) and `--json` (the result
    whole as JSON instead of its table). `qkv.cli.output` checks the files before the model
    loads and writes them after the result."""
    if png is not None:
        parser.add_argument("--png", type=path(), default=None, metavar="FILE", help=png)
    if html is not None:
        parser.add_argument("--html", type=path(), default=None, metavar="FILE", help=html)
    parser.add_argument("--json", action="store_true", help=json)
