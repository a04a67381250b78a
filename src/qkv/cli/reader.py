"""``qkv train reader``: train the small Mistral-style decoder that reads English at any length.

    qkv train reader [--out DIR] [--corpus HTML_DIR] [--resume] [--slim] [--force] [--steps N] …

Registered under ``qkv train`` next to ``translate`` and ``lm`` (``qkv.cli.translate`` owns the
``train`` group). The options are :class:`qkv.reader.train.ReaderTrainConfig`'s fields, each
parsed by a checked type from :mod:`qkv.cli.options`.
"""

from __future__ import annotations

import argparse
import time

from qkv.cli import options
from qkv.cli.train_run import add_config_options, add_run_options, given_options, run_command

DEFAULT_OUT = "runs/reader"

HELPS = {
    "seed": "model initialisation and the training batches",
    "corpus": "directory of the Python documentation's HTML (apt-get install python3.11-doc); "
              "its tutorial/ pages are held out",
    "vocab_size": "byte-level BPE tokens learned from the training pages",
    "d_model": "width E of every token vector", "num_heads": "attention heads per layer",
    "layers": "decoder layers", "ff_dim": "SwiGLU width",
    "window": "sliding window: a token sees itself and the window − 1 tokens before it",
    "max_positions": "the most tokens a text may have",
    "seq_len": "tokens per training window (after <bos>)",
    "repeat_prob": "share of training windows that are one English segment repeated (induction heads)",
    "random_prob": "share of training windows that are one segment of random tokens repeated",
    "min_span": "shortest repeated segment", "max_span": "longest repeated segment",
    "batch_size": "windows per step", "eval_every": "steps between evaluations",
    "eval_size": "held-out windows per evaluation",
    "probe_size": "repeated random sequences for the induction / previous-token scores",
}  # Schedule's options bring their own help (training/config.py)


def _option_type(name: str, kind: type):
    """The checked argparse type of one ReaderTrainConfig option."""
    if kind is str:
        return options.path()
    if kind is int:
        low = 0 if name in ("seed", "warmup", "eval_every", "save_every") else 1
        return options.seed() if name == "seed" else options.integer(low, 10**7)
    return options.real(0.0, 10.0)


def register_train(models: argparse._SubParsersAction) -> None:
    """Add ``reader`` to the ``qkv train`` sub-commands."""
    t = models.add_parser(
        "reader", help="a small Mistral-style decoder on the Python documentation (reads any length)",
        description="Train a 4-layer Mistral (Llama with a sliding window: RMSNorm, SwiGLU, RoPE) "
                    "on the English prose of the Python documentation (Debian's python3.11-doc, "
                    "PSF License Version 2), with a byte-level BPE tokenizer learned from the same "
                    "pages; the tutorial's pages are held out. Some training windows are one "
                    "segment (English, or random tokens) repeated, so induction heads form. The final checkpoint records the "
                    "held-out loss against a unigram model of the text.",
        epilog="example: qkv train reader --out runs/reader --steps 1000")
    add_run_options(t, default_out=DEFAULT_OUT,
                    threads_help="CPU threads for torch (default 1)")
    from qkv.reader.train import ReaderTrainConfig

    add_config_options(t, ReaderTrainConfig, helps=HELPS, type_of=_option_type)
    t.set_defaults(func=run_train_reader)


def run_train_reader(args: argparse.Namespace) -> int:
    import torch

    from qkv.reader.train import ReaderTrainConfig, print_summary, read_training, train
    from qkv.training.checkpoint import check_out_dir

    given = given_options(args, ReaderTrainConfig)
    out = check_out_dir(DEFAULT_OUT if args.out is None else args.out)
    torch.set_num_threads(args.threads)
    base = dict(read_training(out)["train"]) if args.resume else {}
    cfg = ReaderTrainConfig.from_dict({**base, **given})
    start = time.perf_counter()
    state = train(cfg, out, resume=args.resume, progress=not args.quiet,
                  command=run_command("reader", str(out), args, given), slim=args.slim,
                  force=args.force)
    print_summary(state, out, time.perf_counter() - start)
    return 0
