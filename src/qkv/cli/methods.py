"""The contribution-method flags of `qkv explain` and `qkv heads`: `--method`, `--target`
and `qkv explain --compare` (see [`qkv.explain.contributions`][qkv.explain.contributions]).

    qkv explain TEXT --token it --method norm [--png FILE] [--json]
    qkv explain TEXT --token it --method grad --target "a dog ate the pizza"
    qkv explain TEXT --token it --compare [--target TEXT] [--layer L] [--top K]
    qkv heads TEXT --from it --to pizza --method alti      qkv heads --probe coref --method norm

Kept apart from `qkv.cli.explain` so the commands' own file only wires these in.
"""

from __future__ import annotations

import argparse

from qkv.cli import options
from qkv.errors import QkvError

FLAGS = {"method": "--method", "target_text": "--target"}


def add_options(p: argparse.ArgumentParser, *, compare: bool) -> None:
    """Add `--method` and `--target` (and `--compare` to `qkv explain`)."""
    # The help lists the registry's names, read when it is shown (a new method then needs no
    # edit here; the registry imports torch, which parsing does not).
    def method_help() -> str:
        from qkv.explain.contributions import DEFAULT, METHODS

        return (f"rank by what each token contributes instead of the raw weight: "
                f"{', '.join(METHODS)} (default {DEFAULT}; see docs/tutorial.md, \"Why values?\")")

    p.add_argument("--method", type=options.name(), default=None, metavar="METHOD",
                   help=options.Later(method_help))
    p.add_argument("--target", dest="target_text", type=options.text(), default=None,
                   metavar="TEXT", help="--method grad on an encoder: a second text; the cosine "
                                        "similarity of the two sentence embeddings is differentiated")
    if compare:
        p.add_argument("--compare", action="store_true",
                       help="the top words into --token by every method, side by side")


def check_explain(args: argparse.Namespace) -> None:
    """Refuse flag combinations the methods do not take, before a model loads."""
    from qkv.explain.contributions import get_method

    method = get_method(args.method) if args.method is not None else None  # unknown: listed
    if args.compare and (args.method is not None or args.head is not None or args.no_projection
                         or args.png or args.to):
        raise QkvError("--compare runs every method itself; it takes no --method, --head, "
                       "--no-projection, --png or --to")
    if method is not None and not method.raw and (args.head is not None or args.no_projection):
        raise QkvError(f"--method {args.method} ranks the overview (every head or layer for "
                       "--token); it takes no --head or --no-projection")


def check_heads(args: argparse.Namespace) -> None:
    from qkv.explain.contributions import get_method

    if args.method is not None:
        get_method(args.method)
    if args.probe is not None and args.target_text is not None:
        raise QkvError("--target is not read with --probe: each probe sentence is explained on "
                       "its own (--method grad needs a decoder there)")


def method_args(args: argparse.Namespace) -> dict:
    """`method=` and `target_text=` for [`qkv.explain.explain`][qkv.explain.explain] /
[`heads`][qkv.explain.heads]."""
    from qkv.explain.contributions import DEFAULT

    return {"method": args.method or DEFAULT, "target_text": args.target_text}


def run_compare(model, args: argparse.Namespace, *, flags) -> int:
    """`qkv explain TEXT --compare`: every method's top words for `--token`."""
    from qkv.cli.command import show
    from qkv.cli.progress import Bars
    from qkv.explain.contributions.compare import compare

    _estimate_compare(model, args.text)
    with Bars(enabled=not args.json) as bars:  # seconds: value zeroing runs t + 1 copies
        result = compare(model, args.text, token=args.token, words=args.words, top=args.top,
                         layer=args.layer, target_text=args.target_text, progress=bars)
    return show(args, result, flags=flags)


NOTE_FROM_TOKENS = 128  # below this --compare takes seconds; above it, say up front what it costs


def _estimate_compare(model, text: str, file=None) -> float | None:
    """On a long text, time one forward pass and say on stderr what `--compare` will cost
    before it starts (it ran ~2 minutes silently on 500 tokens). Value-zeroing alone runs one
    forward of t + 1 copies of the text, so (t + 1) × one (warm) pass is the estimate given — a
    rough one: a batch of copies runs faster per copy, the other methods add their own passes.
    Returns it in seconds, or None for a short text."""
    import sys
    import time

    import torch

    from qkv.explain import forward

    ids = torch.tensor([forward.encode(model, text).ids], dtype=torch.long)  # (1, t)
    t = ids.shape[1]
    if t < NOTE_FROM_TOKENS:
        return None
    with torch.no_grad():
        model(ids, torch.ones_like(ids))  # the first pass also pages the weights in: not timed
        start = time.perf_counter()
        model(ids, torch.ones_like(ids))
    one = time.perf_counter() - start
    guess = (t + 1) * one
    print(f"qkv: note: --compare on {t} tokens runs every method; value-zeroing alone runs "
          f"{t + 1} copies of the text and one pass takes {one:.2f} s here: expect on the order "
          f"of {_duration(guess)}", file=file or sys.stderr, flush=True)
    return guess


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} minutes"
