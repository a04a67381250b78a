"""`qkv train reader`: train the small Mistral-style decoder that reads English at any length.

    qkv train reader [--out DIR] [--corpus HTML_DIR] [--resume] [--slim] [--force] [--steps N] …

Registered under `qkv train` next to `translate` and `lm` (`qkv.cli.translate` owns the
`train` group). The options are `qkv.reader.train.ReaderTrainConfig`'s fields, each
with the help and bounds its `option()` declares.
"""

from __future__ import annotations

import argparse
import time

from qkv.cli.progress import drawn
from qkv.cli.train_run import add_config_options, add_run_options, given_options, run_command

DEFAULT_OUT = "runs/reader"


def add_train_reader(t: argparse.ArgumentParser) -> None:
    """`qkv train reader`'s arguments (`qkv.cli.translate.TRAIN` lists it under `qkv train`)."""
    t.description = (
        "Train a 4-layer Mistral (Llama with a sliding window: RMSNorm, SwiGLU, RoPE) on the English "
        "prose of the Python documentation (Debian's python3.11-doc, PSF License Version 2), with a "
        "byte-level BPE tokenizer learned from the same pages; the tutorial's pages are held out. "
        "Training starts on short copying sequences (random tokens in which earlier spans are written"
        " again), so induction heads form, and keeps some among the English windows. The final "
        "checkpoint records the held-out loss against a unigram model of the text.")
    t.epilog = "example: qkv train reader --out runs/reader --steps 1000"
    add_run_options(t, default_out=DEFAULT_OUT,
                    threads_help="CPU threads for torch (default 1)")
    add_config_options(t, "qkv.reader.train:ReaderTrainConfig")
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
    state = train(cfg, out, resume=args.resume, progress=drawn(not args.quiet),
                  command=run_command("reader", str(out), args, given), slim=args.slim,
                  force=args.force)
    print_summary(state, out, time.perf_counter() - start)
    return 0
