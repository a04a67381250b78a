"""``qkv explain``, ``qkv heads`` and ``qkv softmax-demo``: attention on a real model, explained.

    qkv explain TEXT [--model minilm|PATH] [--token WORD|INDEX] [--layer L] [--head H] [--words]
                     [--top K] [--to WORD] [--png FILE] [--json] [--no-projection]
    qkv heads TEXT --from WORD --to WORD [--json]      qkv heads --probe coref [--json]
    qkv softmax-demo [--dims 4,16,64,256,1024]

Layers, heads, token indices and occurrences (``it@0``) all count from 0.
"""

from __future__ import annotations

import argparse
import json
import sys

from qkv.errors import QkvError

EXAMPLE = "The dog found some pizza next to the baby and ate it"


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
    p.add_argument("text", help="the text to run the model on")
    p.add_argument("--model", default="minilm", help="a known name (minilm) or a model directory")
    p.add_argument("--token", default=None, metavar="WORD|INDEX",
                   help="the token to explain: a word (its last occurrence), WORD@N (occurrence N, "
                        "from 0) or an index (default: the last word)")
    p.add_argument("--layer", type=int, default=None, help="layer, from 0")
    p.add_argument("--head", type=int, default=None, help="head within the layer, from 0 (needs --layer)")
    p.add_argument("--words", action="store_true",
                   help="group sub-word tokens into words (weights into a word summed, from a word averaged)")
    p.add_argument("--top", type=int, default=3, help="how many attended words to list per head (default 3)")
    p.add_argument("--to", default=None, metavar="WORD|INDEX",
                   help="highlight the heads whose largest weight is on this word")
    p.add_argument("--png", default=None, metavar="FILE",
                   help="also draw a heat map (.png/.svg/.pdf): one head's map with --layer/--head, "
                        "else every head's row for the token")
    p.add_argument("--json", action="store_true", help="print every number as one JSON object")
    p.add_argument("--no-projection", action="store_true",
                   help="ablation: attend with q = k = v = x (no W_Q, W_K, W_V); how often does a "
                        "token attend most to itself?")
    p.set_defaults(func=run_explain)


def _register_heads(sub) -> None:
    p = sub.add_parser(
        "heads", help="rank heads by the weight from one word to another, or run the coref probe",
        description="Every (layer, head) ranked by the weight from --from to --to (words; weights "
                    "into a word summed, from a word averaged), or with --probe coref each head's "
                    "accuracy at finding a pronoun's referent over sentences shipped with qkv.",
        epilog=f'example: qkv heads "{EXAMPLE}" --from it --to pizza')
    p.add_argument("text", nargs="?", default=None, help="the text (not with --probe)")
    p.add_argument("--model", default="minilm", help="a known name (minilm) or a model directory")
    p.add_argument("--from", dest="source", default=None, metavar="WORD|INDEX",
                   help="the word attention comes from (default: the last word)")
    p.add_argument("--to", dest="target", default=None, metavar="WORD|INDEX",
                   help="the word attention goes to")
    p.add_argument("--probe", default=None, metavar="NAME", help="run a probe set instead (coref)")
    p.add_argument("--top", type=int, default=10, help="how many heads to list (default 10)")
    p.add_argument("--json", action="store_true", help="print a JSON list, largest first")
    p.set_defaults(func=run_heads)


def _register_softmax_demo(sub) -> None:
    p = sub.add_parser(
        "softmax-demo", help="why divide by √d_k: softmax saturating as the dimension grows",
        description="Random queries and keys with unit-variance entries: q·k has standard deviation "
                    "√d, so without scaling the softmax saturates (one weight near 1, gradients "
                    "near 0) as d grows; dividing by √d keeps it steady.")
    p.add_argument("--dims", default="4,16,64,256,1024", help="comma-separated dimensions d")
    p.add_argument("--keys", type=int, default=10, help="keys per query (default 10)")
    p.add_argument("--trials", type=int, default=2000, help="random queries per dimension")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run_softmax_demo)


# -- shared helpers ------------------------------------------------------------------------------
def _note(message: str | None) -> None:
    if message:
        print(f"qkv: note: {message}", file=sys.stderr)


def _print_json(obj) -> None:
    json.dump(obj, sys.stdout, allow_nan=False)
    sys.stdout.write("\n")


def _translation_dir(model: str) -> bool:
    """Whether ``--model`` names a qkv translation model (a directory whose config.json has
    ``"model_type": "qkv-translation"``, or the shipped model's name)."""
    from qkv.translate.checkpoint import is_translation_model

    return is_translation_model(model)


def _check_top(top: int) -> None:
    if top < 1:
        raise QkvError(f"--top must be at least 1, got {top}")


# -- qkv explain -----------------------------------------------------------------------------------
def run_explain(args: argparse.Namespace) -> int:
    if _translation_dir(args.model):
        from qkv.explain.cross import explain_translation

        return explain_translation(args)
    from qkv.explain import forward

    _check_top(args.top)
    if args.head is not None and args.layer is None:
        raise QkvError(f"--head {args.head} needs --layer (heads are counted within a layer)")
    if args.no_projection and (args.head is not None or args.png or args.to or args.token or args.words):
        raise QkvError("--no-projection takes no --token, --head, --to, --words or --png "
                       "(it reports every token of every layer, or of --layer L)")
    if args.png:
        from qkv.explain.plots import check_writable

        check_writable(args.png)  # before the model runs, so a typo costs nothing
    forward.check_text(args.text)
    model = forward.load_model(args.model)
    forward.check_layer_head(model, args.layer, args.head)
    if args.no_projection:
        return _explain_ablation(model, args)
    if args.head is not None:
        return _explain_steps(model, args)
    return _explain_overview(model, args)


def _choose_unit(model, args):
    from qkv.explain import forward
    from qkv.explain.select import choose_in

    encoding = forward.encode(model, args.text)
    units, choice = choose_in(args.token, encoding, args.text, words=args.words, option="--token")
    _note(choice.note)
    return encoding, units, choice


def _explain_overview(model, args) -> int:
    import torch

    from qkv.explain import forward
    from qkv.explain.overview import overview, overview_json
    from qkv.explain.render import console, render_overview

    encoding, units, choice = _choose_unit(model, args)
    focus = None
    if args.to is not None:
        from qkv.explain.select import choose

        focus = choose(args.to, units, option="--to").unit
    traced = forward.trace(model, args.text, torch.tensor(units.groups[choice.unit]),
                           words=args.words, encoding=encoding)
    per_layer = [traced.weights(layer) for layer in range(len(traced.traces))]
    ov = overview(per_layer, traced.units, choice.unit, k=args.top, focus=focus, layer=args.layer)
    name = forward.model_name(model)
    if args.png:
        _grid_png(ov, args.png, name, forward.num_heads(model))
    if args.json:
        _print_json(overview_json(ov, tokens=traced.tokens, model=name, text=args.text))
    else:
        render_overview(console(), ov, model=name, layers=forward.num_layers(model),
                        heads=forward.num_heads(model))
    if args.png:
        print(f"wrote {args.png}", file=sys.stderr)
    return 0


def _grid_png(ov, path: str, model: str, heads: int) -> None:
    import torch

    from qkv.explain.plots import grid_map, save_atomic

    ordered = sorted(ov.rows, key=lambda r: (r.layer, r.head))
    rows = torch.stack([r.weights for r in ordered])  # (layers·heads, U)
    label = ov.units.labels[ov.unit]
    title = f"{model}: attention from {label!r}, every head (red dot: its largest weight)"
    if ov.focus is not None:
        title += f"\nred labels: heads whose largest weight is on {ov.units.labels[ov.focus]!r}"
    fig = grid_map(rows, ov.units.labels, heads=heads, title=title,
                   names=[f"L{r.layer} H{r.head}" for r in ordered],
                   highlight=[ov.highlighted(r) for r in ordered])
    save_atomic(fig, path)


def _explain_steps(model, args) -> int:
    import torch

    from qkv.explain import forward
    from qkv.explain.render import console, render_steps
    from qkv.explain.steps import head_steps, steps_json

    encoding, units, choice = _choose_unit(model, args)
    group = units.groups[choice.unit]
    position = group[-1]
    units_note = None
    if len(group) > 1:
        units_note = (f"{units.labels[choice.unit]!r} is {len(group)} tokens "
                      f"({', '.join(encoding.tokens[i] for i in group)}); the arithmetic is shown for "
                      f"its last token, {position} (pick another with --token INDEX, without --words)")
    # A heat map needs the head's whole map; otherwise keep only the explained row.
    rows = slice(None) if args.png else torch.tensor([position])
    traced = forward.trace(model, args.text, rows, words=args.words, encoding=encoding)
    layer_trace = traced.traces[args.layer].self_attn
    row = position if args.png else 0
    st = head_steps(model.layers[args.layer].self_attn, layer_trace, layer=args.layer,
                    head=args.head, row=row, tokens=traced.tokens)
    name = forward.model_name(model)
    if args.png:
        _head_png(traced, args, name)
    if args.json:
        _print_json(steps_json(st, model=name, text=args.text))
    else:
        entering = traced.hidden_states[args.layer][0, position]
        same = torch.equal(entering, layer_trace.query_input[0, row])
        source = (f"the vector entering layer {args.layer} at token {position} (hidden_states[{args.layer}]"
                  f"[{position}]), the {entering.numel()} numbers projected into q"
                  if same else
                  f"the layer's normalised input at token {position} (norm1(hidden_states[{args.layer}]"
                  f"[{position}]), pre-norm), the {entering.numel()} numbers projected into q")
        render_steps(console(), st, model=name, units_note=units_note, x_source=source)
    if args.png:
        print(f"wrote {args.png}", file=sys.stderr)
    return 0


def _head_png(traced, args, model: str) -> None:
    from qkv.explain.plots import head_map, save_atomic
    from qkv.explain.select import group_columns, group_rows

    w = traced.weights(args.layer)[args.head].double()  # (t, s)
    units = traced.units
    if units.words:
        w = group_rows(group_columns(w, units), units)  # (U, U)
    fig = head_map(w, units.labels, title=f"{model}: layer {args.layer}, head {args.head}")
    save_atomic(fig, args.png)


def _explain_ablation(model, args) -> int:
    from qkv.explain import forward
    from qkv.explain.ablation import ablation, ablation_json
    from qkv.explain.render import console, render_ablation

    encoding = forward.encode(model, args.text)
    traced = forward.trace(model, args.text, slice(None), encoding=encoding)
    layers = ablation(traced.traces)
    if args.layer is not None:
        layers = [layers[args.layer]]
    name = forward.model_name(model)
    if args.json:
        _print_json(ablation_json(layers, tokens=traced.tokens, model=name, text=args.text))
    else:
        render_ablation(console(), layers, model=name, tokens=traced.tokens,
                        width=traced.hidden_states[0].shape[-1])
    return 0


# -- qkv heads -------------------------------------------------------------------------------------
def run_heads(args: argparse.Namespace) -> int:
    from qkv.explain import forward

    _check_top(args.top)
    if _translation_dir(args.model):
        raise QkvError(f"qkv heads ranks the self-attention heads of an encoder such as minilm; "
                       f"{args.model!r} is a translation model: use qkv explain TEXT --model "
                       f"{args.model} for its cross-attention")
    if args.probe is not None:
        if args.text is not None or args.source or args.target:
            raise QkvError("--probe runs on its own sentences; give no TEXT, --from or --to with it")
        from qkv.explain.heads import load_probe

        load_probe(args.probe)  # an unknown name fails before the model loads
        return _heads_probe(forward.load_model(args.model), args)
    if args.text is None:
        raise QkvError('give a TEXT with --from/--to (qkv heads "TEXT" --from it --to pizza), '
                       "or --probe coref")
    if args.target is None:
        raise QkvError("--to is needed: the word whose incoming weight ranks the heads")
    forward.check_text(args.text)
    model = forward.load_model(args.model)
    return _heads_pair(model, args)


def _heads_pair(model, args) -> int:
    import torch

    from qkv.explain import forward
    from qkv.explain.heads import rank_pair
    from qkv.explain.render import console, render_pair
    from qkv.explain.select import choose, word_units

    encoding = forward.encode(model, args.text)
    units = word_units(encoding, args.text)
    source = choose(args.source, units, option="--from")
    target = choose(args.target, units, option="--to")
    _note(source.note)
    _note(target.note)
    traced = forward.trace(model, args.text, torch.tensor(units.groups[source.unit]), words=True,
                           encoding=encoding)
    ranked = rank_pair([traced.weights(layer) for layer in range(len(traced.traces))], units,
                       source.unit, target.unit)
    if args.json:
        _print_json([{"layer": h.layer, "head": h.head, "weight": h.weight} for h in ranked])
    else:
        render_pair(console(), ranked, model=forward.model_name(model), units=units,
                    source=source.unit, target=target.unit, top=args.top)
    return 0


def _heads_probe(model, args) -> int:
    from qkv.explain import forward
    from qkv.explain.heads import run_probe
    from qkv.explain.render import console, render_probe

    result = run_probe(model, args.probe)
    if args.json:
        n = len(result.items)
        _print_json([{"layer": l, "head": h, "weight": acc, "accuracy": acc, "correct": c, "n": n}
                     for l, h, acc, c in result.ranked()])
    else:
        render_probe(console(), result, model=forward.model_name(model), top=args.top)
    return 0


# -- qkv softmax-demo ----------------------------------------------------------------------------
def run_softmax_demo(args: argparse.Namespace) -> int:
    from qkv.explain.render import console
    from qkv.explain.saturation import render_saturation, saturation

    try:
        dims = [int(d) for d in args.dims.split(",") if d.strip()]
    except ValueError:
        raise QkvError(f"--dims must be comma-separated whole numbers, got {args.dims!r}") from None
    rows = saturation(dims, keys=args.keys, trials=args.trials, seed=args.seed)
    if args.json:
        _print_json([r.__dict__ for r in rows])
    else:
        render_saturation(console(), rows, keys=args.keys, trials=args.trials, seed=args.seed)
    return 0
