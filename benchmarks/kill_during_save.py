"""Kill a training run (SIGKILL) at random moments, many times; check that nothing is lost.

    .venv/bin/python benchmarks/kill_during_save.py [--runs 40] [--seed 0]

A tiny translation model trains with a checkpoint every step (so most of a step is spent saving:
~90 % here, fsync included), and each run is killed U(0, 0.3 s) after its first step. After each
kill the newest checkpoint must load with its optimizer state and be no older than the one
before (tests/training/killing.py does the checking); the next run resumes it, or — when the
kill came before the first checkpoint was complete — starts again with --force. At the end the
run is finished without a kill and compared with an uninterrupted run of the same options.
Results go to docs/reliability.md by hand.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "training"))
from killing import kill_runs  # noqa: E402

from qkv.translate.checkpoint import load_checkpoint  # noqa: E402
from qkv.translate.train import TrainConfig, train  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    cfg = TrainConfig(d_model=16, num_heads=2, encoder_layers=1, decoder_layers=1, ff_dim=32,
                      batch_size=8, eval_size=0, eval_every=0, save_every=1, steps=10**4, warmup=2,
                      lr=3e-3)
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        report = kill_runs(cfg, Path(d) / "killed", args.runs, seed=args.seed, max_delay=0.3)
        seconds = time.perf_counter() - t0
        done = load_checkpoint(Path(d) / "killed").step
        # three more steps without a kill, then the same steps in a run never killed (both stop
        # by an exception after step done + 3, which is saved: the schedule stays cfg's)
        def stop(state):
            if state.step == done + 3:
                raise KeyboardInterrupt

        for name, resume in (("killed", True), ("straight", False)):
            try:
                train(cfg, Path(d) / name, resume=resume, progress=False, callback=stop)
            except KeyboardInterrupt:
                pass
        a = load_checkpoint(Path(d) / "killed").model.state_dict()
        b = load_checkpoint(Path(d) / "straight").model.state_dict()
        equal = all(torch.equal(a[k], b[k]) for k in a)
    print(f"kills: {report.kills} (+{report.finished} runs that ended first), "
          f"{report.mid_write} of them left a half-written temporary file (killed inside a file "
          f"write); checkpoints after each run: steps {report.steps[0]} … {report.steps[-1]}, never "
          f"lost or older; resumed to step {done + 3}: bit-identical to an uninterrupted run: "
          f"{equal}; {seconds:.0f} s")


if __name__ == "__main__":
    main()
