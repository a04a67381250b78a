"""`qkv explain`, `qkv heads` and `qkv softmax-demo`: attention on a real model, explained.

    qkv explain TEXT [--model minilm|PATH] [--token WORD|INDEX] [--layer L] [--head H] [--words]
                     [--top K] [--to WORD] [--png FILE] [--json] [--no-projection]
    qkv heads TEXT --from WORD --to WORD [--json]      qkv heads --probe coref [--json]
    qkv softmax-demo [--dims 4,16,64,256,1024]

Layers, heads, token indices and occurrences (`it@0`) all count from 0.

These commands parse their flags, call [`qkv.explain`][qkv.explain] (which computes every number),
and print the result (`qkv.explain.render`, `qkv.explain.render_cross`), its `to_dict()`
(`--json`) or a figure (`qkv.explain.figures`). The library's errors and notes name its
arguments (`token`, `source`); `FLAGS` re-spells them as this command line's flags
(`--token`, `--from`) — see `qkv.explain.wording`.
"""

from __future__ import annotations

import argparse

from qkv.cli import methods, options
from qkv.cli.command import check_length, load_model, show
from qkv.cli.output import check_files, print_json
from qkv.errors import QkvError

# How the flags spell the library's argument roles (qkv.explain.wording.ARGUMENTS for the rest).
FLAGS = {
    "token": "--token", "to": "--to", "layer": "--layer", "head": "--head", "words": "--words",
    "top": "--top", "source": "--from", "target": "--to", "probe": "--probe", "dims": "--dims",
    "keys": "--keys", "trials": "--trials", "model": "--model", "effects_probe": "--probe",
    "mode": "--mode", **methods.FLAGS,
}

EXAMPLE = "The dog found some pizza next to the baby and ate it"

# Limits of the numeric flags (qkv.cli.options checks them before anything runs).
MAX_INDEX = 100_000  # layers and heads: far above any model qkv loads; the model checks its own
MAX_TOP = 10_000  # items listed: more lines than any text has tokens or any model heads
MAX_DIM = 16_384  # softmax-demo: one dimension
MAX_KEYS = 4_096
MAX_TRIALS = 100_000
# softmax-demo draws 256 queries' keys at a time (256 · keys · d float64) and keeps every
# query's weights for the Jacobian (trials · keys² float64): both are kept under this.
DEMO_BYTES = 1 << 30
EXPLAIN_TOP = 3  # attended words listed per head
HEADS_TOP = 10  # heads listed by qkv heads (--json: all unless --top)


def add_explain(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Without --layer/--head: every layer and head ranked by the chosen token's largest "
        "attention weight. With --layer L --head H: that head's arithmetic with the real numbers. "
        "Layers, heads and indices count from 0.")
    p.epilog = f'example: qkv explain "{EXAMPLE}" --token it'
    p.add_argument("text", type=options.text(), help="the text to run the model on")
    options.add_model_argument(p, default="minilm")
    p.add_argument("--token", type=options.word(), default=None, metavar="WORD|INDEX",
                   help="the token to explain: a word (its last occurrence), WORD@N (occurrence N, "
                        "from 0) or an index (default: the last word). A whole number is always "
                        "an index, even when the text has it as a word: write 7@0 for the word 7")
    p.add_argument("--layer", type=options.integer(-MAX_INDEX, MAX_INDEX), default=None, help="layer, from 0")
    p.add_argument("--head", type=options.integer(-MAX_INDEX, MAX_INDEX), default=None,
                   help="head within the layer, from 0 (needs --layer)")
    p.add_argument("--words", action="store_true",
                   help="group sub-word tokens into words (weights into a word summed, from a word averaged)")
    p.add_argument("--top", type=options.integer(1, MAX_TOP), default=None,  # None: not given
                   help=f"how many attended words to list per head (default {EXPLAIN_TOP})")
    p.add_argument("--to", type=options.word(), default=None, metavar="WORD|INDEX",
                   help="highlight the heads whose largest weight is on this word (a whole number "
                        "is an index)")
    p.add_argument("--png", type=options.path(), default=None, metavar="FILE",
                   help="also draw a heat map (.png/.svg/.pdf): one head's map with --layer/--head, "
                        "else every head's row for the token")
    p.add_argument("--json", action="store_true", help="print every number as one JSON object")
    p.add_argument("--no-projection", action="store_true",
                   help="ablation: attend with q = k = v = x (no W_Q, W_K, W_V); how often does a "
                        "token attend most to itself?")
    methods.add_options(p, compare=True)
    p.set_defaults(func=run_explain)


def add_heads(p: argparse.ArgumentParser) -> None:
    # The probe names are the library's table, read when the help is shown (options.Later); a
    # new probe then needs no edit here.
    p.description = options.Later(
        lambda: "Every (layer, head) ranked by the weight from --from to --to (words; weights "
                "into a word summed, from a word averaged), or with --probe NAME each head's "
                f"score on a probe set: {_probe_list()}.")
    p.epilog = f'examples:\n  qkv heads "{EXAMPLE}" --from it --to pizza\n  qkv heads --probe coref'
    p.add_argument("text", nargs="?", type=options.text(), default=None,
                   help="the text (not with --probe)")
    options.add_model_argument(p, default="minilm", self_attention=True)
    p.add_argument("--from", dest="source", type=options.word(), default=None, metavar="WORD|INDEX",
                   help="the word attention comes from (default: the last word; a whole number "
                        "is an index)")
    p.add_argument("--to", dest="target", type=options.word(), default=None, metavar="WORD|INDEX",
                   help="the word attention goes to (a whole number is an index)")
    p.add_argument("--probe", type=options.name(), default=None, metavar="NAME",
                   help=options.Later(lambda: f"run a probe set instead: {', '.join(_probes())}"))
    p.add_argument("--top", type=options.integer(1, MAX_TOP), default=None,
                   help=f"how many heads to list (default {HEADS_TOP}; with --json every head)")
    p.add_argument("--ablate", action="store_true",
                   help="with --probe: each head's effect on the probe's task when it is ablated, "
                        "beside its score (see qkv faithfulness)")
    p.add_argument("--json", action="store_true", help="print a JSON list, largest first")
    methods.add_options(p, compare=False)
    p.set_defaults(func=run_heads)


def add_softmax_demo(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Random queries and keys with unit-variance entries: q·k has standard deviation √d, so "
        "without scaling the softmax saturates (one weight near 1, gradients near 0) as d grows; "
        "dividing by √d keeps it steady.")
    p.add_argument("--dims", type=options.int_list(1, MAX_DIM, most=32), default=[4, 16, 64, 256, 1024],
                   help=f"comma-separated dimensions d, each 1…{MAX_DIM} (default 4,16,64,256,1024)")
    p.add_argument("--keys", type=options.integer(2, MAX_KEYS), default=10,
                   help=f"keys per query (default 10, at most {MAX_KEYS})")
    p.add_argument("--trials", type=options.integer(1, MAX_TRIALS), default=2000,
                   help=f"random queries per dimension (default 2000, at most {MAX_TRIALS})")
    p.add_argument("--seed", type=options.seed(), default=0,
                   help="seed of the random queries and keys (default 0)")
    p.add_argument("--json", action="store_true", help="print every number as one JSON object")
    p.set_defaults(func=run_softmax_demo)


def _probes() -> list[str]:
    from qkv.explain.probes import registry

    return registry.names()


def _probe_list() -> str:
    """Every registered probe and what it runs on, as the probe registry says."""
    from qkv.explain.probes.registry import PROBES

    return "; ".join(f"{p.name} ({p.sequences})" for p in PROBES.values())


# -- shared helpers ------------------------------------------------------------------------------
def _print_json(obj, **kw) -> None:
    print_json(obj, **kw)  # built whole, then written: never half a document on stdout


def _self_attention_model(args):
    """The model `--model` names, refused when `qkv heads` has no self-attention to rank."""
    model = load_model(args)
    if not model.capabilities.self_attention:
        raise QkvError(f"qkv heads ranks the self-attention heads of an encoder such as minilm; "
                       f"{args.model!r} is a translation model: use qkv explain TEXT --model "
                       f"{args.model} for its cross-attention")
    return model


# -- qkv explain -----------------------------------------------------------------------------------
@options.in_flags(FLAGS)
def run_explain(args: argparse.Namespace) -> int:
    from qkv.explain.forward import check_text, check_top

    if args.head is not None and args.layer is None:
        raise QkvError(f"--head {args.head} needs --layer (heads are counted within a layer)")
    if args.head is not None and (args.to is not None or args.top is not None):
        raise QkvError("--top and --to rank every head; with --layer/--head one head is shown step "
                       "by step, so leave them out (or drop --head)")
    args.top = EXPLAIN_TOP if args.top is None else args.top  # given or not, told apart above
    check_top(args.top)
    check_files(args, example="explain.html")
    model = load_model(args)
    if model.capabilities.cross_attention:
        return _explain_translation(model, args)
    if args.no_projection and (args.head is not None or args.png or args.to or args.token or args.words):
        raise QkvError("--no-projection takes no --token, --head, --to, --words or --png "
                       "(it reports every token of every layer, or of --layer L)")
    methods.check_explain(args)
    check_text(args.text)
    check_length(model, args.text)
    if args.compare:
        return methods.run_compare(model, args, flags=FLAGS)
    if args.no_projection:
        return _explain_ablation(model, args)
    if args.head is not None:
        return _explain_steps(model, args)
    return _explain_overview(model, args)


def _show(args, result, *, model=None, figure=None) -> int:
    """Print `result` as its row of `qkv.explain.kinds.KINDS` says (`qkv.cli.command.show`)."""
    return show(args, result, flags=FLAGS, model=model, figure=figure)


def _explain_overview(model, args) -> int:
    from qkv.explain import explain

    ov = explain(model, args.text, token=args.token, words=args.words, top=args.top, to=args.to,
                 layer=args.layer, **methods.method_args(args))
    return _show(args, ov, model=model)


def _explain_steps(model, args) -> int:
    from qkv.explain import attention_map, explain_head

    st = explain_head(model, args.text, token=args.token, layer=args.layer, head=args.head,
                      words=args.words)

    def figure():
        from qkv.explain.rendering.figures import map_figure

        return map_figure(attention_map(model, args.text, layer=args.layer, head=args.head,
                                        words=args.words))
    code = _show(args, st, model=model, figure=figure)
    if not args.json:
        _layer_steps(model, args, st.token_index)
    return code


def _layer_steps(model, args, token: int) -> None:
    """After a head's steps, what the layer's own mixer adds to them (an indexer's selection, a
    gated output): every row of the kinds table that answers this layer (its `layers`), printed
    by its own `render` (`qkv show KIND` gives each alone, and its JSON)."""
    from qkv.explain.kinds import KINDS

    for row in KINDS.values():
        if row.layers is not None and args.layer in row.layers(model):
            result = row.run(model, args.text, token=token, layer=args.layer, head=args.head)
            print()
            show(argparse.Namespace(text=args.text, json=False), result, flags=FLAGS, model=model)


def _explain_ablation(model, args) -> int:
    from qkv.explain import no_projection

    return _show(args, no_projection(model, args.text, layer=args.layer), model=model)


def _explain_translation(model, args) -> int:
    """`qkv explain` for an encoder-decoder: its cross-attention (see qkv.explain.cross),
    checked against the model's own gold alignment when it has one (the toy grammar's)."""
    from qkv.explain import cross_attention, cross_attention_head

    if args.to is not None or args.no_projection or args.words:
        raise QkvError("--to, --words and --no-projection are for self-attention models; a translation "
                       "model's cross-attention is shown per target token (--token, --layer, --head)")
    if args.method or args.compare or args.target_text:
        raise QkvError("--method, --compare and --target explain self-attention models; a "
                       "translation model's cross-attention is shown per target token (--token, "
                       "--layer, --head)")
    if args.head is not None:
        result = cross_attention_head(model, args.text, token=args.token, layer=args.layer,
                                      head=args.head)
    else:
        result = cross_attention(model, args.text, token=args.token, top=args.top,
                                      layer=args.layer)
    return _show(args, result)


# -- qkv heads -------------------------------------------------------------------------------------
@options.in_flags(FLAGS)
def run_heads(args: argparse.Namespace) -> int:
    from qkv.explain.forward import check_text, check_top

    args.top_given = args.top is not None
    args.top = HEADS_TOP if args.top is None else args.top
    check_top(args.top)
    methods.check_heads(args)
    if args.probe is not None:
        if args.text is not None or args.source or args.target:
            raise QkvError("--probe runs on its own sentences; give no TEXT, --from or --to with it")
        if args.probe not in _probes():  # fail before the model loads
            raise QkvError(f"unknown probe {args.probe!r}; known probes: {', '.join(_probes())}")
        if args.ablate:
            from qkv.cli.faithfulness import run_heads_ablate

            return run_heads_ablate(_self_attention_model(args), args)
        return _heads_probe(_self_attention_model(args), args)
    if args.ablate:
        raise QkvError("--ablate needs --probe (the task whose loss the ablation changes)")
    if args.text is None:
        raise QkvError('give a TEXT with --from/--to (qkv heads "TEXT" --from it --to pizza), '
                       "or --probe coref")
    if args.target is None:
        raise QkvError("--to is needed: the word whose incoming weight ranks the heads")
    check_text(args.text)
    return _heads_pair(_self_attention_model(args), args)


def _heads_pair(model, args) -> int:
    from qkv.explain import heads

    ranking = heads(model, args.text, source=args.source, target=args.target,
                    **methods.method_args(args))
    return _show(args, ranking, model=model)


def _heads_probe(model, args) -> int:
    from qkv.cli.progress import Bars
    from qkv.explain import probe

    with Bars(enabled=not args.json) as bars:  # coref: 49 sentences, a forward each
        result = probe(model, args.probe, method=methods.method_args(args)["method"], progress=bars)
    return _show(args, result)


# -- qkv softmax-demo ----------------------------------------------------------------------------
@options.in_flags(FLAGS)
def run_softmax_demo(args: argparse.Namespace) -> int:
    from qkv.explain.rendering.render import console, render_saturation
    from qkv.explain.saturation import saturation

    dims = args.dims
    _check_demo_size(dims, args.keys, args.trials)
    rows = saturation(dims, keys=args.keys, trials=args.trials, seed=args.seed)
    if args.json:
        _print_json([r.to_dict() for r in rows])
    else:
        render_saturation(console(), rows, keys=args.keys, trials=args.trials, seed=args.seed)
    return 0


def _check_demo_size(dims: list[int], keys: int, trials: int) -> None:
    """QkvError when softmax-demo's arrays would pass `DEMO_BYTES` (before any is made)."""
    chunk = 256 * keys * max(dims) * 8  # one chunk of keys, float64
    jacobian = trials * keys * keys * 8  # every query's softmax Jacobian, float64
    if max(chunk, jacobian) > DEMO_BYTES:
        raise QkvError(f"--dims {max(dims)} --keys {keys} --trials {trials} needs "
                       f"{max(chunk, jacobian) / 2**30:.1f} GiB at once (the limit is "
                       f"{DEMO_BYTES / 2**30:.0f} GiB): lower --keys, --trials or the largest --dims")
