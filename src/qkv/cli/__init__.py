"""The ``qkv`` command line: one file per command group, wired here.

Each command module exposes ``register(subparsers)``, which adds its sub-commands and sets
``func`` on each parser to a function ``(args) -> int`` (the exit code).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# Command modules, in the order ``qkv --help`` lists them. A module that is missing (a feature
# not built yet) is skipped, so the CLI keeps working while the package grows.
COMMAND_MODULES = ("qkv.cli.explain", "qkv.cli.faithfulness", "qkv.cli.translate", "qkv.cli.demo",
                   "qkv.cli.view", "qkv.cli.needle", "qkv.cli.atlas", "qkv.cli.why")


def build_parser() -> argparse.ArgumentParser:
    from qkv.cli.options import Parser  # one-line errors; every option's type checks its value

    parser = Parser(
        prog="qkv", description="Transformer self-attention, computed and explained number by number.")
    parser.add_argument("--version", action="version", version=f"qkv {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND",
                                help="one of these (qkv COMMAND --help for its options):")
    parser.set_defaults(func=lambda args: missing_command("qkv", sub))
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name == name:
                continue
            raise
        module.register(sub)
    return parser


def _version() -> str:
    from qkv import __version__

    return __version__


def missing_command(prog: str, sub: argparse._SubParsersAction) -> int:
    """``qkv`` or ``qkv train`` alone: one error line naming the commands, not a usage block."""
    print(f"qkv: error: {prog} needs a command: {', '.join(sub.choices)} (see {prog} --help)",
          file=sys.stderr)
    return 2


def _closed_streams() -> bool:
    """Whether stdout was closed by the caller (``qkv … >&-``): Python then sets ``sys.stdout``
    to None. A closed stderr becomes /dev/null, so an error line cannot fall through to stdout."""
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w")
    if sys.stdin is None:  # <&-: read as empty input
        sys.stdin = open(os.devnull)
    return sys.stdout is None


def _torch_threads(args: argparse.Namespace) -> None:
    """torch on one CPU thread unless told otherwise: by the command's ``--threads`` (translate,
    evaluate, train: default 1 too) or by OMP_NUM_THREADS. qkv's matrices are small (one
    sentence on MiniLM: 14 × 384), a second thread gains them nothing, and on a busy machine
    torch's threads spin waiting for one another — measured on 2 busy cores: ``qkv heads --probe
    coref`` 38 s wall and 25 s of CPU with torch's default 2 threads, 5.5 s and 4.2 s with one;
    ``qkv view TEXT --html`` 63-70 s against 6.4 s (issue 32's "102 s for one sentence")."""
    if getattr(args, "threads", None) is None and "OMP_NUM_THREADS" not in os.environ:
        import torch

        torch.set_num_threads(1)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``qkv`` console script and ``python -m qkv``."""
    from qkv.cli.output import finish_output, write_failed
    from qkv.errors import QkvError

    if _closed_streams():
        print("qkv: error: standard output is closed, so no result could be written (give it a "
              "file or a pipe)", file=sys.stderr)
        return 2
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, --version, or a bad option (already printed on one line)
        return finish_output(e.code if isinstance(e.code, int) else 2)
    _torch_threads(args)
    try:
        return finish_output(int(args.func(args) or 0))
    except (QkvError, FileNotFoundError, PermissionError, IsADirectoryError) as e:
        print(f"qkv: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("qkv: interrupted", file=sys.stderr)
        return 130
    except OSError as e:  # stdout on a full disk or a closed pipe, a file that cannot be used
        return write_failed(e)
