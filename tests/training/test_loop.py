"""qkv.training.loop: the shared loop learns, evaluates and saves on schedule, and stops on NaN."""

from __future__ import annotations

import math

import pytest
import torch

from qkv.training.loop import LoopPlan, NonFiniteLoss, lr_at, run_loop


def quadratic(target: float = 3.0):
    w = torch.nn.Parameter(torch.zeros(2))
    return w, (lambda step: (((w - target) ** 2).sum(), 2))


def test_the_loop_minimises_and_keeps_its_schedule():
    w, loss = quadratic()
    saves, evals = [], []
    opt = torch.optim.SGD([w], lr=0.1)
    state = run_loop(LoopPlan(start=0, steps=60, clip=100.0, eval_every=20, save_every=25),
                     params=[w], optimizer=opt, lr=lambda s: 0.1, step_loss=loss,
                     evaluate=lambda st: (evals.append(st.step) or st.loss, "ok"),
                     save=lambda step, ev, final: saves.append((step, final)), progress=False)
    assert state.step == 60 and state.tokens == 120
    assert evals == [20, 40, 60] and saves == [(25, False), (50, False), (60, True)]
    # SGD on (w − 3)²: w_k = 3 − 3·0.8^k, so w_60 = 3 − 3·0.8⁶⁰ (≈ 4e-6 from 3). In float32 each
    # step rounds w − 0.1·g (|w| < 4: ≤ half an ulp, 2⁻²³), 0.1·g and 0.1 itself (|0.1·g| ≤ 0.6:
    # ≤ 2⁻²⁵ each): ≤ 1.5·2⁻²³ per step; errors shrink by 0.8 a step, so they add up to at most
    # 1.5·2⁻²³ / (1 − 0.8) = 7.5·2⁻²³, and the float32 expected value rounds once more (2⁻²³).
    atol = 8.5 * 2**-23
    assert torch.allclose(w, torch.full((2,), 3 - 3 * 0.8**60, dtype=w.dtype), rtol=0, atol=atol)


def test_a_nan_loss_stops_before_anything_is_saved():
    w, good = quadratic()
    saves = []

    def loss(step):
        value, n = good(step)
        return (value * float("nan"), n) if step == 7 else (value, n)

    with pytest.raises(NonFiniteLoss, match=r"loss became nan at step 8 .*keeps the checkpoint of step 5"):
        run_loop(LoopPlan(start=0, steps=20, clip=1.0, eval_every=0, save_every=5), params=[w],
                 optimizer=torch.optim.SGD([w], lr=0.1), lr=lambda s: 0.1, step_loss=loss,
                 save=lambda step, ev, final: saves.append(step), progress=False, where="run")
    assert saves == [5]


def test_a_parameter_that_becomes_inf_is_not_saved():
    w, loss = quadratic()
    opt = torch.optim.SGD([w], lr=1e38)  # a finite loss, then an update past float32's range
    with pytest.raises(NonFiniteLoss, match="a parameter became NaN or infinite at step 1 .*no checkpoint"):
        run_loop(LoopPlan(start=0, steps=3, clip=1e30, eval_every=0, save_every=1), params=[w],
                 optimizer=opt, lr=lambda s: 1e38, step_loss=loss,
                 save=lambda *a: pytest.fail("saved a non-finite model"), progress=False)


def test_lr_schedule_ends():
    kw = dict(lr=1.0, warmup=10, steps=110, min_lr_ratio=0.1)
    assert lr_at(0, **kw) == 0.1 and lr_at(9, **kw) == 1.0
    assert math.isclose(lr_at(109, **kw), 0.1, rel_tol=1e-15)


# A run that SIGTERMs itself after step 3 (saving every 2 steps), in its own interpreter: on a
# qkv without the handler SIGTERM's default ends it at once, without a word.
SIGTERMED = """
import os, signal, sys, torch
from qkv.training.loop import LoopPlan, run_loop
w = torch.nn.Parameter(torch.tensor([4.0]))
def stop(state):
    if state.step == 3:
        os.kill(os.getpid(), signal.SIGTERM)
try:
    run_loop(LoopPlan(start=0, steps=50, clip=10.0, eval_every=0, save_every=2), params=[w],
             optimizer=torch.optim.SGD([w], lr=0.1), lr=lambda step: 0.1,
             step_loss=lambda step: ((w ** 2).sum(), 1), progress=False, where="runs/x",
             save=lambda step, result, final: print('saved', step), callback=stop)
except KeyboardInterrupt as e:
    print(type(e).__name__)
    sys.exit(130)
"""


def test_sigterm_stops_like_ctrl_c_and_says_where_to_resume():
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-c", SIGTERMED], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 130, (proc.returncode, proc.stderr)  # −15: killed without a word
    assert proc.stdout.split("\n") == ["saved 2", "Terminated", ""]
    assert proc.stderr.strip() == ("stopped by SIGTERM after step 3; runs/x holds the checkpoint "
                                   "of step 2 — continue with --resume")


def test_the_sigterm_handler_is_the_loops_only_while_it_runs():
    import signal
    before = signal.getsignal(signal.SIGTERM)
    w = torch.nn.Parameter(torch.tensor([4.0]))
    seen = []
    run_loop(LoopPlan(start=0, steps=2, clip=10.0, eval_every=0, save_every=0), params=[w],
             optimizer=torch.optim.SGD([w], lr=0.1), lr=lambda step: 0.1,
             step_loss=lambda step: ((w ** 2).sum(), 1), progress=False,
             callback=lambda state: seen.append(signal.getsignal(signal.SIGTERM)))
    assert seen[0] is not before and signal.getsignal(signal.SIGTERM) is before
