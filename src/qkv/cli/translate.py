"""`qkv train translate`, `qkv translate` and `qkv evaluate`: the English→French model of the
toy grammar; `qkv translate` also runs a transformers encoder-decoder.

    qkv train translate [--out DIR] [--resume] [--slim] [--steps N] [--batch-size B] …
    qkv translate [TEXT] [--model DIR|translate] [--beam K] [--vocab]
                  (DIR: a qkv translation checkpoint, or a transformers encoder-decoder —
                   Marian, BART, mBART, M2M100, T5 — generating on qkv's attention)
    qkv evaluate [--model DIR|translate] [--beam K] [--json]

`--model translate` (the default) is the small checkpoint shipped with qkv.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time

from qkv.cli import missing_command, options
from qkv.cli.train_run import add_config_options, add_run_options, given_options, run_command
from qkv.cli.output import print_json
from qkv.cli.progress import Bars, drawn
from qkv.errors import QkvError

DEFAULT_OUT = "runs/translate"
MAX_BEAM = 64  # beams beyond the French vocabulary's few dozen words only cost time (100000: 72 s)




# -- qkv train translate --------------------------------------------------------------------------
# How `qkv train translate` words two of Schedule's options (their bounds, and every other
# option's help and bounds, come with TrainConfig's fields: training/config.py's option())
TRAIN_HELPS = {"batch_size": "sentences per step", "eval_every": "steps between validation passes"}


# The models ``qkv train`` trains, as qkv.cli.COMMANDS lists the commands (each module imported
# when its model is trained or its help shown: their options come from torch-importing configs).
TRAIN = {
    "translate": ("qkv.cli.translate:add_train_translate",
                  "the English→French encoder-decoder on the toy grammar"),
    "lm": ("qkv.cli.lm:add_train_lm",
           "a small Llama-architecture decoder on text with repeated spans (induction heads)"),
    "reader": ("qkv.cli.reader:add_train_reader",
               "a small Mistral-style decoder on the Python documentation (reads any length)"),
}


def add_train(p: options.Parser) -> None:
    p.description = "Train one of qkv's own models."
    models = options.add_commands(p, TRAIN, dest="model_kind", metavar="MODEL",
                                  title="the model to train (qkv train MODEL --help for its options):")
    p.set_defaults(func=functools.partial(missing_command, "qkv train", models))


def add_train_translate(t: argparse.ArgumentParser) -> None:
    t.description = (
        "Train the encoder-decoder Transformer on the grammar's training split: AdamW with "
        "warm-up and cosine decay, label smoothing, gradient clipping, validation as it goes, "
        "atomic checkpoints. A run is a pure function of its options: --resume continues a "
        "stopped run exactly where its last checkpoint was.")
    t.epilog = ("examples:\n  qkv train translate --out runs/translate\n"
                "  qkv train translate --out runs/translate --resume")
    add_run_options(t, default_out=DEFAULT_OUT,
                    threads_help="CPU threads for torch (default 1: the matrices are small, and a "
                                 "second thread makes every op wait for it on a busy machine)")
    add_config_options(t, "qkv.translate.train:TrainConfig", helps=TRAIN_HELPS)
    t.set_defaults(func=run_train)


def run_train(args: argparse.Namespace) -> int:
    from qkv.training.checkpoint import check_out_dir
    from qkv.translate.checkpoint import read_meta
    from qkv.translate.train import TrainConfig, train

    given = given_options(args, TrainConfig)
    out = str(check_out_dir(DEFAULT_OUT if args.out is None else args.out))
    _set_threads(args.threads)
    base = {}
    if args.resume:
        base = dict(read_meta(out).get("train") or {})
    cfg = TrainConfig.from_dict({**base, **given})
    command = run_command("translate", out, args, given)
    start = time.perf_counter()
    state = train(cfg, out, resume=args.resume, progress=drawn(not args.quiet), command=command,
                  slim=args.slim, force=args.force)
    ev = state.last_eval
    summary = f"trained to step {state.step} in {time.perf_counter() - start:.0f} s"
    if ev is not None:
        summary += (f"; validation: exact match {ev.exact_match:.2%} ({ev.sentences} sentences), "
                    f"loss {ev.loss:.4f}")
    print(f"{summary}; checkpoint in {out}")
    return 0


# -- qkv translate ---------------------------------------------------------------------------------
def add_translate(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Translate TEXT, or standard input line by line (one output line per input line). Input "
        "is lower-cased and a final . ! ? is dropped; words the model never saw are refused with "
        "their list (see --vocab), not guessed.")
    p.epilog = 'example: qkv translate "the red apple is next to the black cats" --beam 4'
    p.add_argument("text", nargs="?", type=options.text(), default=None,
                   help="the source text (default: read standard input)")
    p.add_argument("--model", type=options.name(), default="translate",
                   help="a translation model directory (qkv train translate's, or a transformers "
                        "encoder-decoder: Marian, BART, mBART, M2M100, T5), or 'translate' for "
                        "the shipped one (default)")
    p.add_argument("--beam", type=options.integer(1, MAX_BEAM), default=1, metavar="K",
                   help=f"beam width (1 = greedy, the default; at most {MAX_BEAM})")
    p.add_argument("--vocab", action="store_true",
                   help="list the English words the toy-grammar model knows")
    _threads_option(p)
    p.set_defaults(func=run_translate)


def _threads_option(p: argparse.ArgumentParser) -> None:
    # The model is small: its matrices gain nothing from a second thread, and on a busy machine
    # every op would wait for that thread to be scheduled (measured: 10x slower under load).
    p.add_argument("--threads", type=options.threads(), default=1,
                   help="CPU threads for torch (default 1)")


def _set_threads(threads: int | None) -> None:
    import torch

    if threads is None:
        return
    torch.set_num_threads(threads)


def _not_a_load_name(model) -> None:
    """`--model lm`/`minilm` (names `qkv.load` knows) are no translation directories: say
    what they are instead of "does not exist". (Here, not in translate/: models.loading imports
    that package.)"""
    from pathlib import Path

    from qkv.models.loading import KNOWN_MODELS

    if model is not None and str(model) in KNOWN_MODELS and not Path(str(model)).is_dir():
        raise QkvError(f"--model {str(model)!r} is not a translation model (it is one of the models "
                       f"qkv explain and qkv heads run); give 'translate' or a directory written "
                       f"by qkv train translate")


def _check_finite(ckpt, model: str) -> None:
    """A model whose weights hold NaN translates into garbage without a sign: refuse it."""
    from qkv.explain.finite import check_parameters

    check_parameters(ckpt.model, name=model)


def run_translate(args: argparse.Namespace) -> int:
    from qkv.text import check_one_line
    from qkv.translate.checkpoint import load_checkpoint
    from qkv.translate.decode import translate

    if args.vocab and (args.text is not None or args.beam != 1):
        given = "TEXT" if args.text is not None else "--beam"
        raise QkvError(f"--vocab lists the words the model knows and translates nothing: it takes "
                       f"no {given} (run the two commands one after the other)")
    _set_threads(args.threads)
    _not_a_load_name(args.model)
    if _is_transformers_seq2seq(args.model):
        return _translate_transformers(args)
    ckpt = load_checkpoint(args.model)
    _check_finite(ckpt, args.model)
    if args.vocab:
        print(" ".join(ckpt.vocab.words("en")))
        return 0
    if args.text is not None:
        check_one_line(args.text)
        print(translate(ckpt.model, ckpt.vocab, [args.text], beam=args.beam)[0])
        _note_outside_grammar(args.text)
        return 0
    return _translate_stream(ckpt, args.beam)


def _is_transformers_seq2seq(model) -> bool:
    """Whether `--model` is a directory whose config.json says a transformers encoder-decoder
    (`"is_encoder_decoder": true`, which transformers writes for Marian, BART, mBART, M2M100
    and T5 alike: what [`qkv.load`][qkv.load] hands to `qkv.hf.seq2seq`), not a model_type list."""
    import os

    from qkv.files import read_json

    config = os.path.join(os.path.expanduser(str(model)), "config.json")
    if not os.path.isfile(config):
        return False
    try:
        raw = read_json(config)
    except QkvError:
        return False  # load_checkpoint names what is wrong with it
    return isinstance(raw, dict) and raw.get("is_encoder_decoder") is True


def _translate_transformers(args: argparse.Namespace) -> int:
    """`qkv translate` on a transformers encoder-decoder: its `generate` on qkv's attention
    (greedy, or beam search with `--beam`), TEXT or standard input line by line."""
    from qkv.explain.finite import check_parameters
    from qkv.models.loading import load
    from qkv.text import check_one_line

    if args.vocab:
        raise QkvError(f"--vocab lists the toy model's words; {args.model} is a transformers model "
                       f"whose vocabulary is its tokenizer's (tokenizer.json)")
    model = load(args.model)
    check_parameters(model.hf, name=model.name)
    if args.text is not None:
        check_one_line(args.text)
        print(model.translate([args.text], beam=args.beam)[0])
        return 0
    return _translate_stream(None, args.beam, lambda line: model.translate([line], beam=args.beam)[0])


def _translate_stream(ckpt, beam: int, translate_line=None) -> int:
    """Translate standard input line by line: one output line per input line, always.

    A line that cannot be translated (an unknown word, bytes that are not UTF-8) does not end
    the stream: its output line is left empty, `qkv: line N: <why>` goes to stderr, and the
    next line is translated. At the end one `qkv: error:` line counts the failures (exit 2),
    so a script sees both every good translation and that some lines failed.
    """
    from qkv.text import check_one_line, read_lines
    from qkv.translate.decode import translate

    failed: list[int] = []
    total = 0
    for number, line in read_lines(_stdin_bytes(), what="line"):
        total = number
        if isinstance(line, QkvError):
            failed.append(number)
            print(f"qkv: {line}; its output line is empty", file=sys.stderr)
            print("", flush=True)
            continue
        if not line.strip():
            print("", flush=True)  # keep output lines in step with input lines
            continue
        try:
            check_one_line(line, what=f"line {number}")
            if translate_line is not None:  # a transformers model: no grammar to note
                translation = translate_line(line)
            else:
                translation = translate(ckpt.model, ckpt.vocab, [line], beam=beam)[0]
                _note_outside_grammar(line, f"line {number}: ")
        except QkvError as e:
            failed.append(number)
            print(f"qkv: line {number}: {e}; its output line is empty", file=sys.stderr)
            translation = ""
        print(translation, flush=True)
    if failed:
        shown = ", ".join(map(str, failed[:5])) + (", …" if len(failed) > 5 else "")
        raise QkvError(f"{len(failed)} of {total} lines not translated (line{'s' * (len(failed) > 1)} "
                       f"{shown}); their output lines are empty")
    return 0


def _note_outside_grammar(text: str, where: str = "") -> None:
    """Known words in an order the grammar never makes ("the" alone, "cat the red") translate
    into whatever the decoder drifts to ("les les les …"): say so on stderr, next to the guess."""
    from qkv.translate.grammar import parse
    from qkv.translate.vocab import normalize_en

    try:
        parse(normalize_en(text))
    except ValueError as e:
        why = str(e).split(": ", 1)[-1]
        print(f"qkv: note: {where}the sentence is outside the grammar the model learned ({why}); "
              f"its translation is a guess", file=sys.stderr)


def _stdin_bytes():
    """Standard input as lines of bytes (a text stream, as tests give, is encoded back)."""
    buffer = getattr(sys.stdin, "buffer", None)
    if buffer is not None:
        return buffer
    return (line.encode("utf-8", "surrogateescape") for line in sys.stdin)


# -- qkv evaluate ----------------------------------------------------------------------------------
def add_evaluate(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Translate the grammar's test split (the splits of the model's data seed) and report "
        "exact-match accuracy and BLEU (sacrebleu), for test sentences whose combinations were "
        "seen in training and for held-out (unseen) ones; then each cross-attention head's "
        "alignment accuracy against the gold word alignment.")
    p.add_argument("--model", type=options.name(), default="translate",
                   help="a translation model directory, or 'translate' for the shipped one (default)")
    p.add_argument("--beam", type=options.integer(1, MAX_BEAM), default=1, metavar="K",
                   help=f"beam width (default 1, greedy; at most {MAX_BEAM})")
    p.add_argument("--json", action="store_true", help="print every number as one JSON object")
    _threads_option(p)
    p.set_defaults(func=run_evaluate)


def run_evaluate(args: argparse.Namespace) -> int:
    from qkv.translate.checkpoint import load_checkpoint
    from qkv.translate.report import test_report

    _set_threads(args.threads)
    _not_a_load_name(args.model)
    ckpt = load_checkpoint(args.model)
    _check_finite(ckpt, args.model)
    with Bars(enabled=not args.json) as bars:  # 2,000 sentences: seconds, on a terminal's stderr
        report = test_report(ckpt, beam=args.beam, progress=bars)
    if args.json:
        print_json(report, ensure_ascii=False)
    else:
        render_report(report)
    return 0


def render_report(report: dict, file=None) -> None:
    """Print `qkv.translate.report.test_report`'s report as a few tables (plain text in a
    pipe)."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    from qkv.explain.rendering.render import console

    out = console(file)
    decoding = "greedy" if report["beam"] == 1 else f"beam {report['beam']}"
    out.print(Text(f"model: {report['model']} (step {report['step']}) · test split · {decoding}"))
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for name, justify in (("test sentences", "left"), ("n", "right"), ("exact match", "right"),
                          ("BLEU", "right")):
        table.add_column(name, justify=justify)
    labels = {"seen": "seen combinations", "unseen": "held-out combinations", "all": "all"}
    for key in ("seen", "unseen", "all"):
        part = report["splits"][key]
        table.add_row(labels[key], str(part["sentences"]), f"{part['exact_match']:.2%}",
                      f"{part['bleu']:.2f}")
    out.print(table)
    al = report["alignment"]
    heads = al["heads"]
    out.print(Text(f"cross-attention alignment accuracy: the fraction of the {al['tokens']} French "
                   f"tokens whose most-attended English token is in the gold alignment"))
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    table.add_column("layer", justify="right")
    for h in range(len(heads[0])):
        table.add_column(f"H{h}", justify="right")
    for layer, row in enumerate(heads):
        table.add_row(f"L{layer}", *[f"{a:.2%}" for a in row])
    out.print(table)
    best = al["best"]
    out.print(Text(f"best head: L{best['layer']} H{best['head']} ({best['accuracy']:.2%})"))
    if report["errors"]:
        out.print(Text(f"{report['wrong']} wrong translations; the first {len(report['errors'])}:"))
        for e in report["errors"]:
            out.print(Text(f"  {e['en']}\n    expected {e['expected']}\n    got      {e['got']}"))
    else:
        out.print(Text("no wrong translations"))
