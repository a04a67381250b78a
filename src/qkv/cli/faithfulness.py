"""`qkv faithfulness`: which explanation methods agree with ablation, per probe.

    qkv faithfulness --model lm --probe induction [--mode zero|mean] [--sequences N] [--png FILE] [--json]
    qkv faithfulness --model minilm --probe coref

Each head is ablated alone and the probe's metric measured
([`qkv.explain.head_effects`][qkv.explain.head_effects]); every contribution method scores the heads
on the same probe; the table is Spearman's ρ between the two
([`qkv.explain.causal.faithfulness.faithfulness`][qkv.explain.causal.faithfulness.faithfulness]).
`--png` draws each head's effect against its attention score. While it works, bars on stderr (a
terminal only, not with `--json`) show the ablations and the methods scored.
"""

from __future__ import annotations

import argparse

from qkv.cli import options
from qkv.cli.command import Command
from qkv.cli.output import print_json
from qkv.cli.progress import Bars


def _check(args: argparse.Namespace) -> None:
    """Refuse an unknown probe or mode before a model loads (one line, naming the flag)."""
    from qkv.errors import QkvError
    from qkv.explain.causal.interventions import MODES

    if args.probe not in _probes():
        raise QkvError(f"unknown --probe {args.probe!r}; known: {', '.join(_probes())}")
    if args.mode not in MODES:
        raise QkvError(f"unknown --mode {args.mode!r}; known: {', '.join(MODES)}")


def _faithfulness(model, args, progress):
    from qkv.explain.causal.faithfulness import faithfulness

    # minutes on coref: bars on a terminal's stderr
    return faithfulness(model, args.probe, mode=args.mode, sequences=args.sequences,
                        progress=progress)


# How this command's flags spell the library's argument roles (see qkv.explain.wording).
FAITHFULNESS = Command(_faithfulness, flags={"effects_probe": "--probe", "probe": "--probe",
                                             "mode": "--mode", "method": "--method",
                                             "sequences": "--sequences", "length": "--length"},
                       check=_check)


def add_faithfulness(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Ablate every head alone and measure the probe's task (induction: loss on the repeated "
        "half; previous-token: loss on alternating pairs; coref: how far the pronoun's final "
        "vector turns), score every head with every contribution method on the same probe, and "
        "print the rank correlation of each method with the ablation effects.")
    p.epilog = "example: qkv faithfulness --model lm --probe induction"
    options.add_model_argument(p, default="minilm", self_attention=True)
    p.add_argument("--probe", type=options.name(), required=True, metavar="PROBE",
                   help=options.Later(lambda: f"one of {', '.join(_probes())} (the first two for "
                                              f"decoders)"))
    p.add_argument("--mode", type=options.name(), default="zero", metavar="MODE",
                   help="ablation: zero (the head's output set to 0) or mean (its mean over the "
                        "text's positions); default zero")
    most = options.constant("qkv.explain.probes.induction:MAX_SEQUENCES")  # the library's bound too
    p.add_argument("--sequences", type=options.integer(1, most), default=8,
                   help="random sequences for induction / previous-token (default 8)")
    options.add_output_arguments(p, png="also draw each head's effect against its attention score")
    FAITHFULNESS.add_to(p)


def _probes() -> list[str]:
    """The probes faithfulness compares methods on, as the probe registry says."""
    from qkv.explain.probes import registry

    return registry.compared()


def run_heads_ablate(model, args: argparse.Namespace) -> int:
    """`qkv heads --probe P --ablate`: each head's ablation effect beside its probe score."""
    from qkv.explain.causal.faithfulness import method_scores
    from qkv.explain.causal.head_effects import head_effects
    from qkv.explain.rendering.render import console
    from qkv.explain.rendering.render_faithfulness import render_effects

    from qkv.explain.contributions import DEFAULT

    method = args.method or DEFAULT
    with Bars(enabled=not args.json) as bars:
        effects = head_effects(model, args.probe, progress=bars)
    scores = method_scores(model, args.probe, method, sequences=effects.sequences, length=None, seed=0)
    if args.json:
        print_json(effects.to_dict() | {"method": method, "scores": scores.tolist()})
    else:
        render_effects(console(), effects, scores if scores.shape[1] > 1 else None, top=args.top)
    return 0
