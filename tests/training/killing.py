"""Kill a training run at random moments (SIGKILL, no clean-up) and check that nothing is lost.

Used by ``tests/training/test_kill_during_save.py`` (a few kills) and
``benchmarks/kill_during_save.py`` (many). Each kill: fork a child that continues the run in
``out`` (``--resume`` when a checkpoint exists, else a new run with ``--force``, which is what a
user does after a run killed in its first save), let it run for a random time, SIGKILL it, then
check that the newest checkpoint still loads with its optimizer state and is not older than the
one before. Fork, not a new interpreter: the child starts in milliseconds, so a kill lands in
the training and saving, not in ``import torch``.
"""

from __future__ import annotations

import os
import random
import select
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from qkv.translate.checkpoint import load_checkpoint
from qkv.translate.data import load_splits
from qkv.translate.train import TrainConfig, train


@dataclass
class KillReport:
    kills: int = 0  # runs killed by SIGKILL
    finished: int = 0  # runs that ended before their kill
    mid_write: int = 0  # kills that left a temporary file: the child was writing a file
    steps: list[int] = field(default_factory=list)  # the checkpoint's step after each run


def _child(cfg: TrainConfig, out: Path, ready: int) -> None:
    code = 3
    try:
        sys.stderr = open(os.devnull, "w")
        resume = (out / "config.json").is_file()
        told = []

        def started(state) -> None:  # after the first step: the parent's clock starts now
            if not told:
                os.write(ready, b"x")
                told.append(True)

        train(cfg, out, resume=resume, force=not resume, progress=False, callback=started)
        code = 0
    except BaseException:
        code = 4
    finally:
        os._exit(code)


def kill_runs(cfg: TrainConfig, out: Path, runs: int, *, seed: int = 0,
              max_delay: float = 0.5, first_step_timeout: float = 120.0) -> KillReport:
    """Kill ``runs`` children of the run in ``out``, each ``U(0, max_delay)`` seconds after its
    first step; AssertionError when a checkpoint is lost, or when a child does no step within
    ``first_step_timeout`` seconds. Every child is killed and reaped before this returns or
    raises."""
    # Warm what every child would otherwise redo: the grammar's splits (cached) and AdamW's
    # first construction (it imports torch._dynamo, seconds on a busy machine).
    load_splits(cfg.data_seed)
    torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))])
    rng = random.Random(seed)
    report = KillReport()
    last = 0
    for _ in range(runs):
        if (out / "config.json").is_file() and load_checkpoint(out).step >= cfg.steps:
            break
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            _child(cfg, out, write)
        os.close(write)
        try:
            # the child has done one step (or ended: then the pipe reads b"")
            if not select.select([read], [], [], first_step_timeout)[0]:
                raise AssertionError(f"the child did no step in {first_step_timeout} s")
            os.read(read, 1)
            time.sleep(rng.uniform(0.0, max_delay))
        finally:  # always killed and reaped, whatever went wrong above
            os.close(read)
            os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(status):
            report.kills += 1
        else:
            assert os.WEXITSTATUS(status) == 0, f"the child failed (exit {os.WEXITSTATUS(status)})"
            report.finished += 1
        if any(p.name.endswith(".tmp") for p in out.glob(".*")):
            report.mid_write += 1
        if (out / "config.json").is_file():
            ckpt = load_checkpoint(out, with_optimizer=True)  # raises if anything is damaged
            assert ckpt.step >= last, f"checkpoint went back from step {last} to {ckpt.step}"
            last = ckpt.step
        else:
            assert last == 0, f"the checkpoint of step {last} disappeared"
        report.steps.append(last)
    return report
