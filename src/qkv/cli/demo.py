"""``qkv walkthrough``: the seeds' worked example with numbers computed by qkv."""

from __future__ import annotations

import argparse

from qkv.errors import QkvError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("walkthrough", help="the seeds' worked example: q, k, v, scores, weights, output",
                       description="Attention step by step on four tokens with random (seeded) weights.")
    p.add_argument("tokens", nargs="*", default=["cat", "apple", "tree", "juice"])
    p.add_argument("--token", default=None, help="the query token (default: the second)")
    p.add_argument("--dim", type=int, default=4, help="embedding and head dimension (even)")
    p.add_argument("--seed", type=int, default=0)
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
