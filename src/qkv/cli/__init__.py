"""The `qkv` command line: one file per command group, wired here by `COMMANDS`.

Each command's `add_<command>(parser)` adds its arguments and sets `func` to a function
`(args) -> int` (the exit code); most commands' `func` is `qkv.cli.command.run`, which
runs the command's `Command` (check outputs → load → progress → result →
show), so a command module holds its arguments and the one call that computes its result.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

# Every command: name → ("module:function" that adds its arguments to its parser, the line
# ``qkv --help`` lists it with), in that order. A command's module is imported only when the
# command runs or its help is shown (options.add_commands), so ``qkv --help``, ``--version`` and
# every argument error import no torch (tests/cli/test_startup.py measures it).
COMMANDS: dict[str, tuple[str, str]] = {
    "explain": ("qkv.cli.explain:add_explain",
                "explain one token's attention on a real model (all heads, or one step by step)"),
    "heads": ("qkv.cli.explain:add_heads",
              "rank heads by the weight from one word to another, or run a probe set"),
    "softmax-demo": ("qkv.cli.explain:add_softmax_demo",
                     "why divide by √d_k: softmax saturating as the dimension grows"),
    "faithfulness": ("qkv.cli.faithfulness:add_faithfulness",
                     "which explanation methods agree with ablation (Spearman ρ per method)"),
    "train": ("qkv.cli.translate:add_train", "train a model (qkv train translate | lm | reader)"),
    "translate": ("qkv.cli.translate:add_translate",
                  "translate with an encoder-decoder (the toy grammar's English→French model by "
                  "default)"),
    "evaluate": ("qkv.cli.translate:add_evaluate",
                 "exact match, BLEU and head alignment of a translation model"),
    "walkthrough": ("qkv.cli.demo:add_walkthrough",
                    "the seeds' worked example: q, k, v, scores, weights, output"),
    "view": ("qkv.cli.view:add_view", "a local web viewer: every head, the step-by-step numbers, offline"),
    "needle": ("qkv.cli.needle:add_needle",
               "needle in a haystack: accuracy and retrieval-head attention over depth × length"),
    "atlas": ("qkv.cli.atlas:add_atlas", "every head's metrics over a corpus, and where each is strongest"),
    "why": ("qkv.cli.why:add_why",
            "why a head's query lines up with a key: its score split by component"),
    "show": ("qkv.cli.show:add_show", "any kind of result by its name and fields (qkv show --help "
                                      "lists them)"),
}


def build_parser(*, lazy: bool = False) -> argparse.ArgumentParser:
    """The `qkv` parser. `lazy`: each command's arguments added when it is parsed (what
    `main` does); otherwise every command's at once (the tests walk them all)."""
    from qkv.cli.options import Parser, add_commands  # one-line errors; every option's type checks its value

    parser = Parser(
        prog="qkv", description="Transformer self-attention, computed and explained number by number.")
    parser.add_argument("--version", action="version", version=f"qkv {_version()}")
    parser.lazy = lazy
    sub = add_commands(parser, COMMANDS, dest="command", metavar="COMMAND",
                       title="one of these (qkv COMMAND --help for its options):")
    parser.set_defaults(func=functools.partial(missing_command, "qkv", sub))
    return parser


def _version() -> str:
    from qkv import __version__

    return __version__


def missing_command(prog: str, sub: argparse.Action, args=None) -> int:
    """`qkv` or `qkv train` alone: one error line naming the commands, not a usage block
    (as a command's `func`: `functools.partial(missing_command, prog, sub)`)."""
    print(f"qkv: error: {prog} needs a command: {', '.join(sub.choices)} (see {prog} --help)",
          file=sys.stderr)
    return 2


def _closed_streams() -> bool:
    """Whether stdout was closed by the caller (`qkv … >&-`): Python then sets `sys.stdout`
    to None. A closed stderr becomes /dev/null, so an error line cannot fall through to stdout."""
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w")
    if sys.stdin is None:  # <&-: read as empty input
        sys.stdin = open(os.devnull)
    return sys.stdout is None


def _torch_threads(args: argparse.Namespace) -> None:
    """torch on one CPU thread unless told otherwise: by the command's `--threads` (translate,
    evaluate, train: default 1 too) or by OMP_NUM_THREADS. qkv's matrices are small (one
    sentence on MiniLM: 14 × 384), a second thread gains them nothing, and on a busy machine
    torch's threads spin waiting for one another — measured on 2 busy cores: `qkv heads --probe
    coref` 38 s wall and 25 s of CPU with torch's default 2 threads, 5.5 s and 4.2 s with one;
    `qkv view TEXT --html` 63-70 s against 6.4 s (issue 32's "102 s for one sentence")."""
    if isinstance(args.func, functools.partial) and args.func.func is missing_command:
        return  # no command: nothing runs torch
    if getattr(args, "threads", None) is None and "OMP_NUM_THREADS" not in os.environ:
        import torch

        torch.set_num_threads(1)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `qkv` console script and `python -m qkv`."""
    from qkv.cli.output import finish_output, write_failed
    from qkv.errors import QkvError

    if _closed_streams():
        print("qkv: error: standard output is closed, so no result could be written (give it a "
              "file or a pipe)", file=sys.stderr)
        return 2
    parser = build_parser(lazy=True)
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
