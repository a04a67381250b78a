"""The one training loop: `qkv train translate` and `qkv train lm` both run `run_loop`.

A step is:

```text
lr ← schedule(step)            (warm-up, then cosine: lr_at)
loss, tokens ← step_loss(step)  (the model's batch for that step: a pure function of it)
loss not finite?  → stop: NonFiniteLoss, nothing of this step is saved
backward, clip the gradient norm, optimizer step
every eval_every steps: evaluate(state) → a result and a line for the log
every save_every steps and at the end: save(step, last result, final)
```

The caller's `save` writes an atomic checkpoint (`qkv.training.checkpoint`); the loop never
saves a model whose parameters are not all finite. `callback(state)` runs after every step; an
exception it raises stops the run like a kill would, leaving the newest checkpoint intact.
Ctrl-C (SIGINT) and SIGTERM (`kill`, a scheduler's stop) end the run alike: one line on stderr
says after which step it stopped and which checkpoint `--resume` continues from, then
`KeyboardInterrupt` (`Terminated` for SIGTERM) goes on to the caller.

Examples:
    >>> import torch
    >>> w = torch.nn.Parameter(torch.tensor([4.0]))
    >>> opt = torch.optim.SGD([w], lr=0.1)
    >>> s = run_loop(LoopPlan(start=0, steps=50, clip=10.0, eval_every=0, save_every=0),
    ...              params=[w], optimizer=opt, lr=lambda step: 0.1,
    ...              step_loss=lambda step: ((w ** 2).sum(), 1), progress=False)
    >>> s.step, round(w.item(), 3)
    (50, 0.0)
"""

from __future__ import annotations

import math
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterable

import torch

from qkv.errors import QkvError


class NonFiniteLoss(QkvError):
    """The training loss (or a parameter) stopped being a finite number."""


def lr_at(step: int, *, lr: float, warmup: int, steps: int, min_lr_ratio: float) -> float:
    """Learning rate for (0-based) `step`: linear warm-up to `lr`, cosine down to `lr·min_lr_ratio`.

    Examples:
        >>> lr_at(49, lr=1e-3, warmup=100, steps=1000, min_lr_ratio=0.05)
        0.0005
    """
    if step < warmup:
        return lr * (step + 1) / warmup
    span = max(steps - 1 - warmup, 1)
    progress = min((step - warmup) / span, 1.0)
    floor = lr * min_lr_ratio
    return floor + (lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


@dataclass(frozen=True)
class LoopPlan:
    """Which steps to run and when to evaluate and save."""

    start: int  # steps already done (a resumed run starts there)
    steps: int  # the last step to reach
    clip: float  # max global gradient norm
    eval_every: int  # 0: evaluate only at the end
    save_every: int  # 0: save only at the end


@dataclass
class TrainState:
    """What `run_loop` hands to its `callback` after every step (and returns at the end)."""

    step: int  # steps done
    loss: float  # this step's training loss
    tokens: int  # tokens processed in this session
    elapsed: float  # seconds of this session
    last_eval: object | None = None
    last_saved: int | None = None  # step of the newest checkpoint on disk


def run_loop(plan: LoopPlan, *, params: Iterable[torch.nn.Parameter], optimizer: torch.optim.Optimizer,
             lr: Callable[[int], float], step_loss: Callable[[int], tuple[torch.Tensor, int]],
             evaluate: Callable[[TrainState], tuple[object, str]] | None = None,
             save: Callable[[int, object, bool], None] | None = None,
             progress: bool = True, where: str = "the run directory",
             callback: Callable[[TrainState], None] | None = None) -> TrainState:
    """Run steps `plan.start … plan.steps - 1`; see the module docstring for one step.

    Args:
        params: the parameters to clip and to check for finiteness before each save.
        lr: step → learning rate, set on every parameter group.
        step_loss: step → (scalar loss with a graph, tokens in the batch).
        evaluate: the state after a step → (result kept as `state.last_eval`, a line for the log).
        save: (step done, last result, final) → writes a checkpoint.
        where: the run directory, for messages.

    Raises:
        NonFiniteLoss: the loss or a parameter became NaN/inf (the last good checkpoint stays).
    """
    from tqdm.auto import tqdm

    params = list(params)
    state = TrainState(step=plan.start, loss=float("nan"), tokens=0, elapsed=0.0,
                       last_saved=plan.start or None)
    t0 = time.perf_counter()
    bar = tqdm(total=plan.steps, initial=plan.start, disable=not progress, unit="step",
               dynamic_ncols=True)
    restore_sigterm = _stop_on_sigterm()
    try:
        for step in range(plan.start, plan.steps):
            rate = lr(step)
            for group in optimizer.param_groups:
                group["lr"] = rate
            loss, tokens = step_loss(step)
            value = loss.item()
            if not math.isfinite(value):
                raise NonFiniteLoss(_diverged(f"the training loss became {value}", step + 1, rate,
                                              state, where))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, plan.clip)
            optimizer.step()

            done = step + 1
            state.step, state.loss = done, value
            state.tokens += tokens
            state.elapsed = time.perf_counter() - t0
            bar.update(1)
            bar.set_postfix(loss=f"{value:.3f}", tok_s=f"{state.tokens / max(state.elapsed, 1e-9):,.0f}",
                            refresh=False)
            last = done == plan.steps
            if evaluate is not None and (last or (plan.eval_every and done % plan.eval_every == 0)):
                state.last_eval, line = evaluate(state)
                bar.write(file=sys.stderr, s=f"step {done}: {line}")
            if save is not None and (last or (plan.save_every and done % plan.save_every == 0)):
                if not all(bool(torch.isfinite(p).all()) for p in params):
                    raise NonFiniteLoss(_diverged("a parameter became NaN or infinite", done, rate,
                                                  state, where))
                save(done, state.last_eval, last)
                state.last_saved = done
            if callback is not None:
                callback(state)
    except KeyboardInterrupt as e:
        how = "stopped by SIGTERM" if isinstance(e, Terminated) else "interrupted"
        kept = (f"{where} holds the checkpoint of step {state.last_saved} — continue with --resume"
                if state.last_saved else "no checkpoint was saved yet — start it again")
        bar.write(file=sys.stderr, s=f"{how} after step {state.step}; {kept}")
        raise
    finally:
        restore_sigterm()
        bar.close()
    return state


class Terminated(KeyboardInterrupt):
    """SIGTERM reached a training run: it stops as Ctrl-C stops it (the newest checkpoint kept)."""


def _stop_on_sigterm() -> Callable[[], None]:
    """Make SIGTERM raise `Terminated` (its default ends the process without a word);
    returns what puts the handler before back. Off the main thread, where no handler can be set
    (and no signal arrives), nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def stop(signum, frame):
        raise Terminated()

    before = signal.signal(signal.SIGTERM, stop)  # None: set outside Python (taken as the default)
    return lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL if before is None else before)


def _diverged(what: str, step: int, rate: float, state: TrainState, where: str) -> str:
    kept = (f"{where} keeps the checkpoint of step {state.last_saved}" if state.last_saved
            else "no checkpoint was saved")
    return (f"{what} at step {step} (learning rate {rate:.3g}); training stopped and this model "
            f"is not saved ({kept}); try a smaller --lr or --clip")
