"""The training loop: it learns, it is reproducible, and a killed run resumes exactly."""

from __future__ import annotations

import json

import pytest
import torch

from qkv.errors import QkvError
from qkv.translate.checkpoint import load_checkpoint
from qkv.translate.train import TrainConfig, lr_at, train
from tolerance import assert_within

# lr_at is ≤ 8 float64 operations (one cos, correctly rounded to within 1 ulp): each adds at most
# 2⁻⁵³ ≈ 1.1e-16 relative error, ≤ 1e-15 in all; the expected values carry ≤ 2 roundings more.
LR_REL = 1e-14

TINY = dict(d_model=32, num_heads=2, encoder_layers=1, decoder_layers=1, ff_dim=64, batch_size=32,
            eval_size=20, lr=3e-3, warmup=5)


def params(directory) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in load_checkpoint(directory).model.state_dict().items()}


def test_a_short_run_learns(tmp_path):
    losses = []
    cfg = TrainConfig(**TINY, steps=60, eval_every=0, save_every=0)
    state = train(cfg, tmp_path / "run", progress=False, callback=lambda s: losses.append(s.loss))
    assert len(losses) == 60 and state.step == 60
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    # Measured: first 4.91, last 3.20 (ratio 0.65), the same to 7 digits at 1 and 2 threads; a
    # loop that does not learn stays at a ratio near 1. The 0.05 margin is ~10⁵ times the change a
    # thread count makes, yet small enough that a half-working loop (wrong lr, no step) fails.
    assert last < 0.7 * first, (first, last)
    assert state.last_eval is not None and state.last_eval.loss < first  # ran; measured 3.05 < 4.91
    meta = json.loads((tmp_path / "run" / "config.json").read_text())
    assert meta["step"] == 60 and meta["history"][-1]["step"] == 60


class Kill(Exception):
    pass


def test_killed_run_keeps_its_last_checkpoint_and_resumes_exactly(tmp_path):
    # Dropout on, so that resuming must also replay the dropout masks.
    cfg = TrainConfig(**TINY, dropout=0.1, steps=12, eval_every=0, save_every=4)
    train(cfg, tmp_path / "straight", progress=False)
    train(cfg, tmp_path / "again", progress=False)  # how far two uninterrupted runs can differ

    def kill_at_6(state):
        if state.step == 6:
            raise Kill  # mid-way between the checkpoints of steps 4 and 8

    with pytest.raises(Kill):
        train(cfg, tmp_path / "killed", progress=False, callback=kill_at_6)
    survivor = load_checkpoint(tmp_path / "killed", with_optimizer=True)
    assert survivor.step == 4  # the last good checkpoint loads
    assert sorted(p.name for p in (tmp_path / "killed").iterdir()) == [
        "config.json", "model-000004.safetensors", "optimizer-000004.safetensors",
        "tokenizer_en.json", "tokenizer_fr.json"]  # nothing half-written left behind

    train(cfg, tmp_path / "killed", resume=True, progress=False)
    straight, resumed, again = params(tmp_path / "straight"), params(tmp_path / "killed"), params(tmp_path / "again")
    assert straight.keys() == resumed.keys()
    # A resumed run may differ from the uninterrupted one by no more than a second uninterrupted
    # run does (times 2, plus 2 ulp): on this machine both are usually bit-identical, but a CPU
    # whose kernels round differently with memory alignment would show it in `again` too.
    for name in straight:
        assert_within(resumed[name], straight[name], again[name], what=name)
    assert load_checkpoint(tmp_path / "killed").step == 12


def test_keyboard_interrupt_also_leaves_the_checkpoint(tmp_path, capsys):
    cfg = TrainConfig(**TINY, steps=6, eval_every=0, save_every=2)

    def interrupt(state):
        if state.step == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(cfg, tmp_path / "run", progress=True, callback=interrupt)
    assert load_checkpoint(tmp_path / "run").step == 2
    assert "continue with --resume" in capsys.readouterr().err


def test_resume_refuses_a_different_configuration(tmp_path):
    cfg = TrainConfig(**TINY, steps=2, eval_every=0, save_every=0)
    train(cfg, tmp_path / "run", progress=False)
    with pytest.raises(QkvError, match=r"different configuration: d_model=32 \(now 48\)"):
        train(TrainConfig(**{**TINY, "d_model": 48}, steps=4), tmp_path / "run", resume=True, progress=False)
    with pytest.raises(QkvError, match="already holds a checkpoint; pass --resume"):
        train(cfg, tmp_path / "run", progress=False)
    with pytest.raises(QkvError, match="already at step 2 of --steps 2"):
        train(cfg, tmp_path / "run", resume=True, progress=False)
    with pytest.raises(QkvError, match="holds no checkpoint to continue"):
        train(cfg, tmp_path / "empty", resume=True, progress=False)


def test_slim_checkpoint_has_no_optimizer_and_cannot_resume(tmp_path):
    cfg = TrainConfig(**TINY, steps=2, eval_every=0, save_every=0)
    train(cfg, tmp_path / "run", progress=False, slim=True)
    assert not list((tmp_path / "run").glob("optimizer-*"))
    with pytest.raises(QkvError, match="no optimizer state to resume from"):
        train(TrainConfig(**TINY, steps=4), tmp_path / "run", resume=True, progress=False)


def test_learning_rate_schedule():
    cfg = TrainConfig(steps=1000, warmup=100, lr=1e-3, min_lr_ratio=0.05)
    lrs = [lr_at(s, cfg) for s in range(1000)]
    assert lrs[0] == pytest.approx(1e-5, rel=LR_REL) and lrs[99] == pytest.approx(1e-3, rel=LR_REL)
    assert all(a < b for a, b in zip(lrs[:99], lrs[1:100]))  # warm-up rises
    assert all(a >= b for a, b in zip(lrs[99:], lrs[100:]))  # then it only decays
    assert lrs[-1] == pytest.approx(5e-5, rel=LR_REL)
    odd = TrainConfig(steps=1001, warmup=100, lr=1e-3, min_lr_ratio=0.05)  # decay spans 900 steps
    assert lr_at(550, odd) == pytest.approx((1e-3 + 5e-5) / 2, rel=LR_REL)  # cosine: half-way at mid-decay


def test_config_rejects_unknown_and_bad_options():
    with pytest.raises(QkvError, match="unknown training option 'stpes'"):
        TrainConfig.from_dict({"stpes": 10})
    with pytest.raises(QkvError, match="--steps must be between 1 and 10000000, got 0"):
        TrainConfig(steps=0)
    with pytest.raises(QkvError, match=r"--d-model \(30\) must be divisible by --num-heads \(4\)"):
        TrainConfig(d_model=30)


@pytest.mark.parametrize("option, value, message", [
    # Reproduces issue 9: each of these was accepted (a NaN model, or a traceback minutes later).
    ("lr", float("inf"), r"--lr must be a finite number in \(0.0, 10.0\], got inf"),
    ("lr", float("nan"), r"--lr must be a finite number .*got nan"),
    ("clip", float("nan"), r"--clip must be a finite number .*got nan"),
    ("weight_decay", -1.0, r"--weight-decay must be a finite number in \[0.0, 10.0\], got -1.0"),
    ("min_lr_ratio", -5.0, r"--min-lr-ratio must be a finite number in \[0.0, 1.0\], got -5.0"),
    ("batch_size", 10**8, r"--batch-size must be between 1 and 4096, got 100000000"),
    ("d_model", 10**6, r"--d-model must be between 1 and 2048, got 1000000"),
    ("steps", True, r"--steps must be a whole number, got True"),
])
def test_config_refuses_values_that_cannot_train(option, value, message):
    with pytest.raises(QkvError, match=message):
        TrainConfig(**{option: value})


def test_config_from_json_with_wrong_types():
    with pytest.raises(QkvError, match=r"'steps' must be int, got 'abc'"):
        TrainConfig.from_dict({"steps": "abc"})
    with pytest.raises(QkvError, match=r"'norm_first' must be bool, got 1"):
        TrainConfig.from_dict({"norm_first": 1})
    assert TrainConfig.from_dict({"lr": 1}).lr == 1.0  # JSON has no float/int distinction for 1


def test_a_diverging_run_stops_and_saves_no_nan_model(tmp_path, monkeypatch):
    # Reproduces issue 9 item 4: --lr inf trained a NaN model and exited 0. --lr inf is refused
    # now; a loss that still becomes NaN (here: made so from step 4 on) stops the run.
    import sys

    from qkv.training.loop import NonFiniteLoss

    module = sys.modules[train.__module__]  # qkv.translate.train, the module (not the function)

    calls, real = [], module.loss_fn

    def diverging(*args):
        calls.append(1)
        return real(*args) * (float("nan") if len(calls) >= 4 else 1.0)

    monkeypatch.setattr(module, "loss_fn", diverging)
    cfg = TrainConfig(**TINY, steps=10, eval_every=0, save_every=2)
    with pytest.raises(NonFiniteLoss, match=r"loss became nan at step 4 .*this model is not saved "
                                            r"\(.* keeps the checkpoint of step 2\)"):
        train(cfg, tmp_path / "run", progress=False)
    ckpt = load_checkpoint(tmp_path / "run")  # the last checkpoint saved is a finite model
    assert all(torch.isfinite(p).all() for p in ckpt.model.parameters())


def test_a_new_run_refuses_a_stale_directory_unless_forced(tmp_path):
    # Reproduces issue 9 item 1: a run killed in its first save left tokenizers (and no
    # config.json); a new run into the same directory kept them and trained a garbage model.
    out = tmp_path / "run"
    out.mkdir()
    (out / "tokenizer_en.json").write_text("{}")
    cfg = TrainConfig(**TINY, steps=2, eval_every=0, save_every=0)
    with pytest.raises(QkvError, match=r"run is not empty; pass --resume .* --force"):
        train(cfg, out, progress=False)
    train(cfg, out, progress=False, force=True)
    assert load_checkpoint(out).step == 2  # with --force the stale tokenizer was replaced


@pytest.mark.parametrize("out, message", [("", "--out must name a directory, got an empty string"),
                                          ("file", "--out '.*file' is a file, not a directory")])
def test_bad_out_is_refused_up_front(tmp_path, out, message):
    (tmp_path / "file").write_text("x")
    target = "" if out == "" else str(tmp_path / out)
    with pytest.raises(QkvError, match=message):
        train(TrainConfig(**TINY, steps=2), target, progress=False)


def test_resume_with_another_thread_count_is_refused_or_recorded(tmp_path):
    # Reproduces issue 9: changing --threads on --resume silently broke exactness.
    cfg = TrainConfig(**TINY, steps=2, eval_every=0, save_every=0)
    train(cfg, tmp_path / "run", progress=False)
    before = torch.get_num_threads()
    torch.set_num_threads(before + 1)
    try:
        more = TrainConfig(**TINY, steps=3, eval_every=0, save_every=0)
        with pytest.raises(QkvError, match=rf"trained with --threads {before}, this run has {before + 1}"):
            train(more, tmp_path / "run", resume=True, progress=False)
        train(more, tmp_path / "run", resume=True, progress=False, force=True)
    finally:
        torch.set_num_threads(before)
    meta = json.loads((tmp_path / "run" / "config.json").read_text())
    assert meta["exact"] is False and meta["step"] == 3
