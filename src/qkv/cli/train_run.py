"""What every ``qkv train MODEL`` shares: the options of a run and the command line that repeats it.

    qkv train MODEL [--out DIR] [--resume] [--slim] [--force] [--quiet] [--threads N] [MODEL's options]

``qkv.cli.translate`` (``qkv train translate``) and ``qkv.cli.lm`` (``qkv train lm``) add these
to their parsers and record :func:`run_command` in each checkpoint, so a run can be repeated.
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
        ('seed', <class 'int'>, 0)
    """
    return [(f.name, type(f.default), f.default) for f in fields(config_class)
            if not f.name.isupper() and f.default is not MISSING]


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
