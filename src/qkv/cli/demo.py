"""`qkv walkthrough`: the seeds' worked example with numbers computed by qkv."""

from __future__ import annotations

import argparse

from qkv.cli import options
from qkv.errors import QkvError

MAX_DIM = 512  # three dim × dim matrices and every vector printed: beyond this nothing is readable


def add_walkthrough(p: argparse.ArgumentParser) -> None:
    p.description = "Attention step by step on four tokens with random (seeded) weights."
    p.add_argument("tokens", nargs="*", type=options.text(most=1000),
                   default=["cat", "apple", "tree", "juice"],
                   help="the tokens, one word each (default: cat apple tree juice)")
    p.add_argument("--token", type=options.word(), default=None,
                   help="the query token, one of the tokens (default: the second)")
    p.add_argument("--dim", type=options.integer(2, MAX_DIM, why="the printed vectors' width"),
                   default=4, help=f"embedding and head dimension (even, 2…{MAX_DIM})")
    p.add_argument("--seed", type=options.seed(), default=0, help="seed of the random weights")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from qkv.walkthrough import render, worked_example

    tokens = list(args.tokens)
    focus = min(1, len(tokens) - 1) if tokens else 0
    if args.token is not None:
        if args.token not in tokens:
            raise QkvError(f"--token {args.token!r} is not one of the tokens {tokens}")
        focus = tokens.index(args.token)
    print(render(worked_example(tokens, dim=args.dim, seed=args.seed), focus))
    return 0
