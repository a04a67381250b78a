"""What every `qkv train MODEL` shares: the options of a run, one `--flag` per field of the
model's training config, and the command line that repeats the run.

    qkv train MODEL [--out DIR] [--resume] [--slim] [--force] [--quiet] [--threads N] [--<field> V …]

`qkv.cli.translate` (`qkv train translate`), `qkv.cli.lm` (`qkv train lm`) and
`qkv.cli.reader` add these to their parsers and record `run_command` in each checkpoint,
so a run can be repeated. Every field, declared with `qkv.training.config.option`, brings
its help and bounds from the dataclass (the `--flag` parses with the same bounds the config
checks); a trainer's `helps` may word a shared one its own way.
"""

from __future__ import annotations

import argparse
import shlex
from dataclasses import MISSING, asdict, fields

from qkv.cli import options
from qkv.training.config import Option, option_of


def config_options(config_class: type) -> list[tuple[str, type, object]]:
    """(field, type, default) for every field of a training config dataclass that becomes a
    `--flag`: all with a default, except the upper-case class constants.

    Examples:
        >>> from qkv.lm.train import LMTrainConfig
        >>> config_options(LMTrainConfig)[0]
        ('steps', <class 'int'>, 2000)
    """
    return [(f.name, type(f.default), f.default) for f in fields(config_class)
            if not f.name.isupper() and f.default is not MISSING]


def add_config_options(parser: argparse.ArgumentParser, config: str, *,
                       helps: dict[str, str] | None = None) -> None:
    """One `--flag` per `config_options` field of the training config `config`
    (`"module:Class"`), default None (= not given, so a resumed run keeps its recorded value):
    a bool as `--flag` / `--no-flag`, any other value parsed by its
    `Option`'s bounds (`option_type`). The help:
    `helps[name]` where a trainer words a shared option its own way ("sentences per step"),
    else the option's; then the default.

    The fields are read from the dataclass once per version of qkv's source and kept
    (`qkv.cli.options.cached`): the config modules import torch, and `qkv train lm
    --steps 0` is refused without it."""
    helps = helps or {}
    for name, kind, default, spec in options.cached(lambda: config_fields(config)):
        flag = "--" + name.replace("_", "-")
        text = f"{helps.get(name) or spec['help']} (default {default})"
        if kind == "bool":
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=text)
        else:
            parser.add_argument(flag, type=option_type(Option(**spec)), default=None,
                                metavar="N" if kind == "int" else "X", help=text)


def config_fields(config: str) -> list[list]:
    """[name, kind ("int", "float", "bool", "str"), default, the Option's fields] of every
    `--flag` field of the config `"module:Class"`: what `add_config_options` keeps.

    Examples:
        >>> config_fields("qkv.lm.train:LMTrainConfig")[0][:3]
        ['steps', 'int', 2000]
    """
    import importlib

    module, _, name = config.partition(":")
    config_class = getattr(importlib.import_module(module), name)
    return [[name, kind.__name__, default, asdict(option_of(config_class, name))]
            for name, kind, default in config_options(config_class)]


def option_type(spec: Option):
    """The checked argparse type of an option: its own bounds, the config's check on the CLI.

    Examples:
        >>> from qkv.training.config import Schedule, option_of
        >>> option_type(option_of(Schedule, "batch_size"))("4097")
        Traceback (most recent call last):
        argparse.ArgumentTypeError: must be at most 4096, got 4097
    """
    if spec.text:
        return options.path()
    if isinstance(spec.low, int) and isinstance(spec.high, int):
        return options.integer(spec.low, spec.high)
    return options.real(spec.low, spec.high, lo_open=spec.low_open, hi_open=spec.high_open)


def given_options(args: argparse.Namespace, config_class: type) -> dict:
    """{field: value} for the config options given on the command line, in field order."""
    return {name: getattr(args, name) for name, *_ in config_options(config_class)
            if getattr(args, name) is not None}


def add_run_options(parser: argparse.ArgumentParser, *, default_out: str, threads_help: str) -> None:
    """Add --out, --resume, --slim, --force, --quiet and --threads (default 1) to `parser`."""
    parser.add_argument("--out", type=options.path(), default=None, metavar="DIR",
                        help=f"checkpoint directory (default {default_out})")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run in --out (options not given are taken from it)")
    parser.add_argument("--slim", action="store_true",
                        help="leave no optimizer state in the final checkpoint (smaller; not resumable)")
    parser.add_argument("--force", action="store_true",
                        help="train into a non-empty --out (its old checkpoint files are deleted); with "
                             "--resume, accept a different --threads (the run is recorded as inexact)")
    parser.add_argument("--quiet", action="store_true",
                        help="no progress bar (one is drawn only when stderr is a terminal)")
    parser.add_argument("--threads", type=options.threads(), default=1, help=threads_help)


def run_command(model: str, out: str, args: argparse.Namespace, given: dict) -> str:
    """The command line that reproduces this run, options in a fixed order: the run's own
    flags, then the `given` training options (a bool as `--flag` / `--no-flag`).

    Examples:
        >>> args = argparse.Namespace(resume=True, slim=False, force=False, threads=1)
        >>> run_command("lm", "runs/my lm", args, {"steps": 10, "norm_first": False})
        "qkv train lm --out 'runs/my lm' --resume --threads 1 --steps 10 --no-norm-first"
    """
    parts = ["qkv", "train", model, "--out", out]
    parts += ["--resume"] * args.resume + ["--slim"] * args.slim + ["--force"] * args.force
    if args.threads is not None:
        parts += ["--threads", str(args.threads)]
    for name, value in given.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            parts.append(flag if value else "--no-" + flag[2:])
        else:
            parts += [flag, str(value)]
    return " ".join(shlex.quote(p) for p in parts)
