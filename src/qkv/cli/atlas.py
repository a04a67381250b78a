"""`qkv atlas`: every head's metrics over a corpus, with the contexts where each is strongest.

    qkv atlas --model reader --file CORPUS.txt [--window W] [--contexts K] [--html FILE] [--json]

(`qkv.explain.probes.atlas.atlas`: induction, previous-token, retrieval, sink share, mean
distance, entropy; O(N) memory in the corpus.) `--html`: the viewer's atlas page with the atlas
in it, every head a point by two chosen metrics, a click listing its contexts
(`qkv.view.atlas_page`; `qkv view` shows a saved `--json` at `/atlas`). Bars on stderr
while it works (a terminal only, not with `--json`).
"""

from __future__ import annotations

import argparse

from qkv.cli import options
from qkv.cli.command import Command


def _read_corpus(args) -> None:
    """The corpus read (a missing file or invalid UTF-8 fails before the model loads)."""
    from qkv.text import clean_text

    with open(args.file, "rb") as f:
        args.corpus = clean_text(f.read())


def _atlas(model, args, progress):
    from qkv.explain.probes.atlas import atlas

    return atlas(model, args.corpus, window=args.window, first=args.first, contexts=args.contexts,
                 retrieval_samples=args.samples, progress=progress)


ATLAS = Command(_atlas, flags={"window": "--window", "first": "--first", "contexts": "--contexts",
                               "model": "--model", "samples": "--samples"},
                check=_read_corpus, page="atlas.html")


DESCRIPTION = (
    "Read a UTF-8 corpus in windows and give every head its induction, previous-token, "
    "retrieval, sink-share, mean-distance and entropy scores, with its top contexts (the rows "
    "whose largest weight past the sink is largest). O(N) memory in the corpus length.")


def add_atlas(p: argparse.ArgumentParser) -> None:
    from qkv.reader import NAME

    p.description = DESCRIPTION
    p.epilog = f"example: qkv atlas --model {NAME} --file book.txt --json"
    options.add_model_argument(p, default=NAME, self_attention=True, decoder=True)
    p.add_argument("--file", type=options.path(), required=True, metavar="CORPUS",
                   help="the corpus, a UTF-8 text file")
    p.add_argument("--window", type=options.integer(2, 1 << 17), default=None,
                   help="tokens a window (default 512, or the model's limit if fewer)")
    p.add_argument("--first", type=options.integer(1, 1 << 17), default=1,
                   help="how many first tokens of a window are the sink (default 1)")
    p.add_argument("--contexts", type=options.integer(0, 100), default=3,
                   help="top contexts kept per head (default 3)")
    p.add_argument("--samples", type=options.integer(1, 1000), default=8,
                   help="needle inputs of the retrieval score (default 8)")
    options.add_output_arguments(
        p, html="also write a page: every head a point by two metrics you choose, a click "
                "listing its contexts (self-contained, no server; qkv view shows a saved --json "
                "at /atlas)",
        json="print every number and context as JSON")
    ATLAS.add_to(p)
