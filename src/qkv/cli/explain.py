"""``qkv explain``, ``qkv heads`` and ``qkv softmax-demo``: attention on a real model, explained.

    qkv explain TEXT [--model minilm|PATH] [--token WORD|INDEX] [--layer L] [--head H] [--words]
                     [--top K] [--to WORD] [--png FILE] [--json] [--no-projection]
    qkv heads TEXT --from WORD --to WORD [--json]      qkv heads --probe coref [--json]
    qkv softmax-demo [--dims 4,16,64,256,1024]

Layers, heads, token indices and occurrences (``it@0``) all count from 0.

These commands parse their flags, call :mod:`qkv.explain` (which computes every number), and
print the result (:mod:`qkv.explain.render`, :mod:`qkv.explain.render_cross`), its ``to_dict()``
(``--json``) or a figure (:mod:`qkv.explain.figures`). The library's errors and notes name its
arguments (``token``, ``source``); :data:`FLAGS` re-spells them as this command line's flags
(``--token``, ``--from``) — see :mod:`qkv.explain.wording`.
"""

from __future__ import annotations

import argparse
import shlex
import sys

from qkv.cli import methods, options
from qkv.cli.output import print_json
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


def register(sub: argparse._SubParsersAction) -> None:
    _register_explain(sub)
    _register_heads(sub)
    _register_softmax_demo(sub)


def _register_explain(sub) -> None:
    p = sub.add_parser(
        "explain", help="explain one token's attention on a real model (all heads, or one step by step)",
        description="Without --layer/--head: every layer and head ranked by the chosen token's "
                    "largest attention weight. With --layer L --head H: that head's arithmetic with "
                    "the real numbers. Layers, heads and indices count from 0.",
        epilog=f'example: qkv explain "{EXAMPLE}" --token it')
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


def _register_heads(sub) -> None:
    # The probe names are the library's table (importing it costs ~0.1 s: qkv.cli.methods has
    # already imported qkv.explain); a new probe then needs no edit here.
    from qkv.explain.probes.find_heads import PROBES

    p = sub.add_parser(
        "heads", help=f"rank heads by the weight from one word to another, or run a probe ({', '.join(PROBES)})",
        description="Every (layer, head) ranked by the weight from --from to --to (words; weights "
                    "into a word summed, from a word averaged), or with --probe NAME each head's "
                    f"score on a probe set: {_probe_list()}.",
        epilog=f'examples:\n  qkv heads "{EXAMPLE}" --from it --to pizza\n  qkv heads --probe coref')
    p.add_argument("text", nargs="?", type=options.text(), default=None,
                   help="the text (not with --probe)")
    options.add_model_argument(p, default="minilm", self_attention=True)
    p.add_argument("--from", dest="source", type=options.word(), default=None, metavar="WORD|INDEX",
                   help="the word attention comes from (default: the last word; a whole number "
                        "is an index)")
    p.add_argument("--to", dest="target", type=options.word(), default=None, metavar="WORD|INDEX",
                   help="the word attention goes to (a whole number is an index)")
    p.add_argument("--probe", type=options.name(), default=None, metavar="NAME",
                   help=f"run a probe set instead: {', '.join(PROBES)}")
    p.add_argument("--top", type=options.integer(1, MAX_TOP), default=None,
                   help=f"how many heads to list (default {HEADS_TOP}; with --json every head)")
    p.add_argument("--ablate", action="store_true",
                   help="with --probe: each head's effect on the probe's task when it is ablated, "
                        "beside its score (see qkv faithfulness)")
    p.add_argument("--json", action="store_true", help="print a JSON list, largest first")
    methods.add_options(p, compare=False)
    p.set_defaults(func=run_heads)


def _register_softmax_demo(sub) -> None:
    p = sub.add_parser(
        "softmax-demo", help="why divide by √d_k: softmax saturating as the dimension grows",
        description="Random queries and keys with unit-variance entries: q·k has standard deviation "
                    "√d, so without scaling the softmax saturates (one weight near 1, gradients "
                    "near 0) as d grows; dividing by √d keeps it steady.")
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


def _probe_list() -> str:
    """The probe sets by kind, as the library's tables list them."""
    from qkv.explain.probes import find_heads, induction, retrieval

    return (f"{', '.join(find_heads.SENTENCE_PROBES)} over labelled sentences shipped with qkv; "
            f"{', '.join(induction.PROBES)} on repeated random tokens (for decoders); "
            f"{', '.join(retrieval.PROBES)} on needle-in-a-haystack inputs (decoders)")


# -- shared helpers ------------------------------------------------------------------------------
def _notes(notes) -> None:
    for note in notes:
        print(f"qkv: note: {note.spelled(FLAGS)}", file=sys.stderr)


def _print_json(obj, **kw) -> None:
    print_json(obj, **kw)  # built whole, then written: never half a document on stdout


def _refuse_non_finite(model, text: str, result: dict) -> None:
    """QkvError naming the first layer and head where the model computed NaN/inf, when the
    result to be shown holds one (a broken model; the numbers would mean nothing)."""
    from qkv.cli.output import first_non_finite
    from qkv.explain.forward import trace

    where = first_non_finite(result)
    if where is not None:
        trace(model, text, slice(None))  # traces every row; raises NonFiniteError at the first layer and head
        raise QkvError(f"the result holds a non-finite number at {where}: the model's weights "
                       f"or input give NaN or infinity, so there is nothing true to show")


def _save(fig, path: str) -> None:
    from qkv.explain.rendering.plots import save_atomic

    save_atomic(fig, path)


def _load(name: str):
    """The model ``--model`` names (any kind: qkv.load reads them all)."""
    from qkv.models import load

    return load(name)


def _self_attention_model(name: str):
    """The model ``--model`` names, refused when ``qkv heads`` has no self-attention to rank."""
    model = _load(name)
    if not model.capabilities.self_attention:
        raise QkvError(f"qkv heads ranks the self-attention heads of an encoder such as minilm; "
                       f"{name!r} is a translation model: use qkv explain TEXT --model "
                       f"{name} for its cross-attention")
    return model


def _check_png(path: str | None) -> None:
    if path:
        from qkv.explain.rendering.plots import check_writable

        check_writable(path)  # before the model runs, so a typo costs nothing


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
    _check_png(args.png)
    model = _load(args.model)
    if model.capabilities.cross_attention:
        return _explain_translation(model, args)
    if args.no_projection and (args.head is not None or args.png or args.to or args.token or args.words):
        raise QkvError("--no-projection takes no --token, --head, --to, --words or --png "
                       "(it reports every token of every layer, or of --layer L)")
    methods.check_explain(args)
    check_text(args.text)
    _check_length(model, args.text)
    if args.compare:
        return methods.run_compare(model, args, flags=FLAGS, print_json=_print_json)
    if args.no_projection:
        return _explain_ablation(model, args)
    if args.head is not None:
        return _explain_steps(model, args)
    return _explain_overview(model, args)


def _check_length(model, text: str) -> None:
    """A text longer than the model takes: the one sentence for it (qkv.explain.wording.too_long),
    before any method runs."""
    from qkv.explain.wording import too_long

    tokenizer = model.tokenizer  # a self-attention model's (models.protocol.SelfAttentionModel)
    limit = tokenizer.max_length if tokenizer is not None else None  # None: a bare transformers model
    if limit is None:
        return
    n = len(tokenizer.encode(text, max_length=sys.maxsize).ids)
    if n > limit:
        raise too_long(n, model.name, limit)


def _show(args, result, *, model=None, figure=None) -> int:
    """Print ``result`` as its row of :data:`qkv.explain.kinds.KINDS` says (``--json``: the row's
    ``json`` of ``to_dict()``); ``figure()`` draws ``--png``. A result holding NaN/inf from a
    self-attention ``model`` is refused, naming where the model first computed one."""
    import inspect
    from importlib import import_module

    from qkv.explain.kinds import kind_of
    from qkv.explain.rendering.render import console

    row, doc, png = kind_of(result), result.to_dict(), getattr(args, "png", None)
    if model is not None:
        _refuse_non_finite(model, args.text, doc)
    _notes(getattr(result, "notes", ()))
    if png and figure is not None:
        _save(figure(), png)
    if args.json:
        data = row.json(doc)
        if getattr(args, "top_given", False) and isinstance(data, list):
            data = data[:args.top]  # qkv heads --json --top N: N heads (all without --top)
        _print_json(data, ensure_ascii=False)  # UTF-8 out, as the text came in
    else:
        module, _, name = row.render.partition(":")
        render = getattr(import_module(module), name)
        options = {"names": FLAGS, "top": args.top, "model_arg": shlex.quote(str(args.model))}
        wanted = inspect.signature(render).parameters
        render(console(), result, **{k: v for k, v in options.items() if k in wanted})
    if png and figure is not None:
        print(f"wrote {png}", file=sys.stderr)
    return 0


def _explain_overview(model, args) -> int:
    from qkv.explain import explain

    ov = explain(model, args.text, token=args.token, words=args.words, top=args.top, to=args.to,
                 layer=args.layer, **methods.method_args(args))

    def figure():
        from qkv.explain.rendering.figures import overview_figure

        return overview_figure(ov)
    return _show(args, ov, model=model, figure=figure)


def _explain_steps(model, args) -> int:
    from qkv.explain import attention_map, explain_head

    st = explain_head(model, args.text, token=args.token, layer=args.layer, head=args.head,
                      words=args.words)

    def figure():
        from qkv.explain.rendering.figures import map_figure

        return map_figure(attention_map(model, args.text, layer=args.layer, head=args.head,
                                        words=args.words))
    return _show(args, st, model=model, figure=figure)


def _explain_ablation(model, args) -> int:
    from qkv.explain import no_projection

    return _show(args, no_projection(model, args.text, layer=args.layer), model=model)


def _explain_translation(model, args) -> int:
    """``qkv explain`` for an encoder-decoder: its cross-attention (see qkv.explain.cross),
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
        ca = result.attention
    else:
        result = ca = cross_attention(model, args.text, token=args.token, top=args.top,
                                      layer=args.layer)

    def figure():
        from qkv.explain.rendering.figures import cross_figure, cross_head_figure

        return (cross_head_figure(ca, args.layer, args.head) if args.head is not None
                else cross_figure(ca))
    return _show(args, result, figure=figure)


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
        from qkv.explain.probes.find_heads import PROBES

        if args.probe not in PROBES:  # fail before the model loads
            raise QkvError(f"unknown probe {args.probe!r}; known probes: {', '.join(PROBES)}")
        if args.ablate:
            from qkv.cli.faithfulness import run_heads_ablate

            return run_heads_ablate(_self_attention_model(args.model), args)
        return _heads_probe(_self_attention_model(args.model), args)
    if args.ablate:
        raise QkvError("--ablate needs --probe (the task whose loss the ablation changes)")
    if args.text is None:
        raise QkvError('give a TEXT with --from/--to (qkv heads "TEXT" --from it --to pizza), '
                       "or --probe coref")
    if args.target is None:
        raise QkvError("--to is needed: the word whose incoming weight ranks the heads")
    check_text(args.text)
    return _heads_pair(_self_attention_model(args.model), args)


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
    """QkvError when softmax-demo's arrays would pass :data:`DEMO_BYTES` (before any is made)."""
    chunk = 256 * keys * max(dims) * 8  # one chunk of keys, float64
    jacobian = trials * keys * keys * 8  # every query's softmax Jacobian, float64
    if max(chunk, jacobian) > DEMO_BYTES:
        raise QkvError(f"--dims {max(dims)} --keys {keys} --trials {trials} needs "
                       f"{max(chunk, jacobian) / 2**30:.1f} GiB at once (the limit is "
                       f"{DEMO_BYTES / 2**30:.0f} GiB): lower --keys, --trials or the largest --dims")
