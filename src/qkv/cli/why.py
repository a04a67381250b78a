"""`qkv why`: why does a head's query of one token line up with the key of another?

    qkv why "The dog found some pizza next to the baby and ate it" --token it --to pizza --layer 3 --head 1
    qkv why TEXT --token 7 --to 4 --layer 1 --head 0 --model lm [--top N] [--json] [--png FILE]
                                                                 [--html FILE]

The head's scaled score, split into (query component × key component) terms — embeddings, each
earlier head, each feed-forward, bias — that sum to it (`qkv.explain.score_attribution`). An MLA
layer's score (DeepSeek V2/V3, the sparse layers of V3.2 and GLM-DSA) prints its content and RoPE
parts on a line of their own; a gated head's (Qwen3-Next, 3.5) says the gate acts after it; a key
a sparse layer's indexer left out is one line with the margin it missed the cut by.
`--html`: the viewer's "why this weight" panel for it as one self-contained page
(`qkv.view.export.result_page`), written whole or not at all.
"""

from __future__ import annotations

import argparse

from qkv.cli import options
from qkv.cli.command import Command

EXAMPLE = "The dog found some pizza next to the baby and ate it"


def _why(model, args, progress):
    from qkv.explain import score_attribution

    return score_attribution(model, args.text, layer=args.layer, head=args.head, token=args.token,
                             key=args.to)


WHY = Command(_why, flags={"token": "--token", "key": "--to", "layer": "--layer", "head": "--head",
                           "top": "--top"}, page="why.html")


def add_why(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Split one head's pre-softmax score of a key into (query component × key component) "
        "terms — the embeddings, every earlier head, every feed-forward and a bias — exactly "
        "(norms frozen at the forward's scale, RoPE as its rotation); the terms sum to the "
        "forward's score. An MLA head's score is also split into its content and RoPE parts.")
    p.epilog = f'example: qkv why "{EXAMPLE}" --token it --to pizza --layer 3 --head 1'
    p.add_argument("text", type=options.text(), help="the text to run the model on")
    options.add_model_argument(p, default="minilm", self_attention=True)
    p.add_argument("--token", type=options.word(), default=None, metavar="WORD|INDEX",
                   help="the query token: a word, WORD@N or an index (default: the last word)")
    p.add_argument("--to", type=options.word(), required=True, metavar="WORD|INDEX",
                   help="the key token: a word, WORD@N or an index")
    p.add_argument("--layer", type=options.integer(0, 1 << 16), required=True, help="layer, from 0")
    p.add_argument("--head", type=options.integer(0, 1 << 16), required=True,
                   help="head within the layer, from 0")
    p.add_argument("--top", type=options.integer(1, 10_000), default=12,
                   help="how many of the largest terms to list (default 12)")
    options.add_output_arguments(
        p, png="also draw the terms as a heat map (.png/.svg/.pdf)",
        html="also write the viewer's 'why this weight' panel for it as one self-contained page "
             "(no server, nothing loaded from the network)")
    WHY.add_to(p)
