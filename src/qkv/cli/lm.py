"""`qkv train lm`: train the small Llama-architecture decoder whose heads learn induction.

    qkv train lm [--out DIR] [--resume] [--slim] [--force] [--plot FILE] [--steps N] …

Registered under `qkv train` next to `translate` (`qkv.cli.translate` owns the `train`
group and calls `register_train`). The options are `qkv.lm.train.LMTrainConfig`'s
fields: help and bounds from each field's `option` (`qkv.training.config`), parsed by a
checked type from `qkv.cli.options`.
"""

from __future__ import annotations

import argparse
import time

from qkv.cli import options
from qkv.cli.progress import drawn
from qkv.cli.train_run import add_config_options, add_run_options, given_options, run_command

DEFAULT_OUT = "runs/lm"


def add_train_lm(t: argparse.ArgumentParser) -> None:
    """`qkv train lm`'s arguments (`qkv.cli.translate.TRAIN` lists it under `qkv train`)."""
    t.description = (
        "Train a 2-layer Llama (RMSNorm, SwiGLU, RoPE) on random words with repeated spans: the later"
        " words of a copy are predictable only by induction, so induction heads form. Every "
        "evaluation logs the loss on copied and random words and every head's induction and "
        "previous-token score. Checkpoints are Hugging Face Llama directories (qkv.load and qkv "
        "explain read them); a run is a pure function of its options and --resume continues it "
        "exactly.")
    t.epilog = "example: qkv train lm --out runs/lm --steps 3000 --plot runs/lm/curves.png"
    add_run_options(t, default_out=DEFAULT_OUT,
                    threads_help="CPU threads for torch (default 1: the model is tiny)")
    t.add_argument("--plot", type=options.path(), default=None, metavar="FILE",
                   help="draw the loss curves and the best induction score per evaluation (PNG/SVG)")
    add_config_options(t, "qkv.lm.train:LMTrainConfig")  # each field's help and bounds
    t.set_defaults(func=run_train_lm)


def run_train_lm(args: argparse.Namespace) -> int:
    import torch

    from qkv.lm.train import LMTrainConfig, print_summary, read_training, train
    from qkv.training.checkpoint import check_out_dir

    given = given_options(args, LMTrainConfig)
    out = check_out_dir(DEFAULT_OUT if args.out is None else args.out)
    if args.plot is not None:
        _check_plot(args.plot)
    torch.set_num_threads(args.threads)
    base = dict(read_training(out)["train"]) if args.resume else {}
    cfg = LMTrainConfig.from_dict({**base, **given})
    start = time.perf_counter()
    state = train(cfg, out, resume=args.resume, progress=drawn(not args.quiet),
                  command=run_command("lm", str(out), args, given), slim=args.slim, force=args.force)
    if args.plot is not None:
        from qkv.files import atomic_write
        from qkv.lm.curves import training_curves

        record = read_training(out)
        fig = training_curves(record["history"], appeared=record.get("induction_appeared_at"))
        atomic_write(args.plot, lambda tmp: fig.savefig(tmp, format=_format(args.plot), dpi=120))
    print_summary(state, out, time.perf_counter() - start)
    return 0


def _check_plot(path: str) -> None:
    from qkv.errors import QkvError

    from qkv.files import check_writable

    if _format(path) is None:
        raise QkvError(f"--plot {path!r}: give a .png or .svg file name")
    check_writable(path, "--plot")  # before training, so a bad path costs nothing


def _format(path: str) -> str | None:
    ext = str(path).rsplit(".", 1)[-1].lower()
    return ext if ext in ("png", "svg") else None
