"""`qkv needle`: where a decoder finds a needle and where it loses it, over depth × length.

    qkv needle --model reader --lengths 1024,4096,16384 --depths 0,50,100 [--samples N]
               [--haystack FILE] [--png FILE] [--html FILE] [--json]

Prints two depth × length tables (`qkv.explain.probes.needle.needle_map`): the share of the
needle's tokens the model predicts, and the retrieval heads' attention on the needle. `--png`
draws them as heat maps; `--html` writes the viewer's needle page with the map in it
(`qkv.view.needle_page`; `qkv view` shows a saved `--json` at `/needle`). Bars on
stderr (a terminal only, not with `--json`) while it works.
"""

from __future__ import annotations

import argparse
import sys

from qkv.cli import options
from qkv.cli.command import Command


def haystack_ids(model, path: str | None) -> list[int] | None:
    """The tokens of the text at `path` (None: none given); QkvError for an unreadable or
    empty file."""
    if path is None:
        return None
    from qkv.errors import QkvError
    from qkv.text import clean_text

    with open(path, "rb") as f:
        text = clean_text(f.read())
    ids = model.tokenizer.encode(text, max_length=sys.maxsize).ids if text.strip() else []
    if not ids:
        raise QkvError(f"--haystack {path!r} holds no text")
    return ids


def _needle(model, args, progress):
    from qkv.explain.probes.needle import needle_map

    return needle_map(model, lengths=args.lengths, depths=[d / 100 for d in args.depths],
                      samples=args.samples, needle=args.needle, top=args.top, seed=args.seed,
                      haystack=haystack_ids(model, args.haystack), progress=progress)


# How this command's flags spell the library's argument roles (see qkv.explain.wording).
NEEDLE = Command(_needle, flags={"lengths": "--lengths", "length": "--lengths", "depths": "--depths",
                                 "depth": "--depths", "needle": "--needle", "samples": "--samples",
                                 "top": "--top", "model": "--model", "probe": "--model"},
                 page="needle.html")


DESCRIPTION = (
    "Put a random-token needle at each depth of a haystack of each length, copy it again at "
    "the end (teacher-forced) and measure the share of its tokens the model predicts and the "
    "weight its retrieval heads (qkv heads --probe retrieval) put on it. O(N) memory per input.")


def add_needle(p: argparse.ArgumentParser) -> None:
    from qkv.reader import NAME

    p.description = DESCRIPTION
    p.epilog = f"example: qkv needle --model {NAME} --lengths 1024,4096 --depths 0,50,100"
    options.add_model_argument(p, default=NAME, self_attention=True, decoder=True)
    most = options.constant("qkv.explain.probes.retrieval:MAX_LENGTH")  # the library's bound too
    p.add_argument("--lengths", type=options.int_list(2, most, most=20), required=True,
                   metavar="N,N,…", help="input lengths in tokens, e.g. 1024,4096,32768")
    p.add_argument("--depths", type=options.int_list(0, 100, most=20), default=[0, 25, 50, 75, 100],
                   metavar="P,P,…", help="needle depths in percent of the haystack (default 0,25,50,75,100)")
    p.add_argument("--samples", type=options.integer(1, 100), default=1,
                   help="inputs per cell, each with its own needle (default 1)")
    p.add_argument("--needle", type=options.integer(2, 256), default=8,
                   help="needle length in tokens (default 8)")
    p.add_argument("--top", type=options.integer(1, 1024), default=4,
                   help="how many retrieval heads to read (default 4)")
    p.add_argument("--haystack", type=options.path(), default=None, metavar="FILE",
                   help="fill the haystack with this UTF-8 text's tokens (default: random tokens)")
    p.add_argument("--seed", type=options.seed(), default=0, help="the first input's seed (default 0)")
    options.add_output_arguments(
        p, png="also draw both maps as heat maps",
        html="also write both maps as a self-contained page (no server; qkv view shows a saved "
             "--json at /needle)")
    NEEDLE.add_to(p)
