"""What every ``qkv train MODEL`` shares: the options of a run, one ``--flag`` per field of the
model's training config, and the command line that repeats the run.

    qkv train MODEL [--out DIR] [--resume] [--slim] [--force] [--quiet] [--threads N] [--<field> V …]

``qkv.cli.translate`` (``qkv train translate``) and ``qkv.cli.lm`` (``qkv train lm``) add these
to their parsers (each with its own help texts and value bounds) and record
:func:`run_command` in each checkpoint, so a run can be repeated.
"""

from __future__ import annotations

import argparse
import shlex
from dataclasses import MISSING, fields

from qkv.cli import options


def config_options(config_class: type) -> list[tuple[str, type, object]]:
    """(field, type, default) for every field of a training config dataclass that becomes a
    ``--flag``: all with a default, except the upper-case class constants.

    Example:
        >>> from qkv.lm.train import LMTrainConfig
        >>> config_options(LMTrainConfig)[0]
        ('steps', <class 'int'>, 2000)
    """
    return [(f.name, type(f.default), f.default) for f in fields(config_class)
            if not f.name.isupper() and f.default is not MISSING]


def add_config_options(parser: argparse.ArgumentParser, config_class: type, *,
                       helps: dict[str, str], type_of) -> None:
    """One ``--flag`` per :func:`config_options` field, default None (= not given, so a resumed
    run keeps its recorded value): a bool as ``--flag`` / ``--no-flag``, any other value parsed
    by ``type_of(name, kind)``; the help is ``helps[name]`` (or the name in words) and the default."""
    for name, kind, default in config_options(config_class):
        flag = "--" + name.replace("_", "-")
        text = f"{helps.get(name, name.replace('_', ' '))} (default {default})"
        if kind is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=text)
        else:
            parser.add_argument(flag, type=type_of(name, kind), default=None,
                                metavar="N" if kind is int else "X", help=text)


def given_options(args: argparse.Namespace, config_class: type) -> dict:
    """{field: value} for the config options given on the command line, in field order."""
    return {name: getattr(args, name) for name, *_ in config_options(config_class)
            if getattr(args, name) is not None}


def add_run_options(parser: argparse.ArgumentParser, *, default_out: str, threads_help: str) -> None:
    """Add --out, --resume, --slim, --force, --quiet and --threads (default 1) to ``parser``."""
    parser.add_argument("--out", type=options.path(), default=None, metavar="DIR",
                        help=f"checkpoint directory (default {default_out})")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run in --out (options not given are taken from it)")
    parser.add_argument("--slim", action="store_true",
                        help="leave no optimizer state in the final checkpoint (smaller; not resumable)")
    parser.add_argument("--force", action="store_true",
                        help="train into a non-empty --out (its old checkpoint files are deleted); with "
                             "--resume, accept a different --threads (the run is recorded as inexact)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--threads", type=options.threads(), default=1, help=threads_help)


def run_command(model: str, out: str, args: argparse.Namespace, given: dict) -> str:
    """The command line that reproduces this run, options in a fixed order: the run's own
    flags, then the ``given`` training options (a bool as ``--flag`` / ``--no-flag``).

    Example:
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
