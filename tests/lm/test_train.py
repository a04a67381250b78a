"""qkv train lm's training: it learns, resumes exactly, and saves a directory qkv.load runs."""

from __future__ import annotations

import json

import pytest
import torch

import qkv
from qkv.errors import QkvError
from qkv.lm.train import LMTrainConfig, appeared_at, hf_tensors, new_model, train
from tolerance import assert_within

# copy_prob 1 and the skip-bigram rule: structure a model learns something of in 60 steps.
TINY = dict(d_model=32, num_heads=2, layers=2, ff_dim=64, seq_len=32, min_span=2, max_span=8,
            copy_prob=1.0, rule_prob=0.5, batch_size=8, eval_size=8, probe_size=4, lr=1e-2, warmup=5)


def params(directory) -> dict[str, torch.Tensor]:
    model = qkv.load(directory)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_a_short_run_learns_and_loads_with_qkv_load(tmp_path):
    losses = []
    cfg = LMTrainConfig(**TINY, steps=60, eval_every=30, save_every=0)
    train(cfg, tmp_path / "run", progress=False, callback=lambda s: losses.append(s.loss))
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    # Measured: first 5.56 (ln 258 = 5.55: uniform over the vocabulary), last 5.38: the model
    # learns the rule and that the words of a sequence recur. A loop that does not step stays at 5.55 ± 0.02
    # (batch to batch), so 0.08 is four times that noise and half the measured gain.
    assert last < first - 0.08, (first, last)
    meta = json.loads((tmp_path / "run" / "config.json").read_text())
    assert meta["model_type"] == "llama" and meta["qkv_training"]["step"] == 60
    assert [h["step"] for h in meta["qkv_training"]["history"]] == [30, 60]
    loaded = qkv.load(tmp_path / "run")
    ids = torch.tensor([[0, 5, 9, 5, 9, 12]])
    # The in-memory model and the loaded one are the same numbers: the logits must be equal.
    ref = new_model(cfg)
    ref.load_state_dict(loaded.state_dict())
    assert torch.equal(loaded(ids).logits, ref(ids).logits)
    assert set(hf_tensors(ref)) == {k for k in json.loads(
        (tmp_path / "run" / "model.safetensors.index.json").read_text())["weight_map"]}
    assert loaded.tokenizer.encode("baka bela").tokens == ["<bos>", "baka", "bela"]


class Kill(Exception):
    pass


def test_killed_run_resumes_exactly(tmp_path):
    cfg = LMTrainConfig(**TINY, steps=8, eval_every=0, save_every=3)
    train(cfg, tmp_path / "straight", progress=False)
    train(cfg, tmp_path / "again", progress=False)

    def kill_at_5(state):
        if state.step == 5:
            raise Kill

    with pytest.raises(Kill):
        train(cfg, tmp_path / "killed", progress=False, callback=kill_at_5)
    assert json.loads((tmp_path / "killed" / "config.json").read_text())["qkv_training"]["step"] == 3
    train(cfg, tmp_path / "killed", resume=True, progress=False)
    straight, resumed, again = (params(tmp_path / d) for d in ("straight", "killed", "again"))
    for name in straight:
        assert_within(resumed[name], straight[name], again[name], what=name)


def test_resume_and_option_errors(tmp_path):
    cfg = LMTrainConfig(**TINY, steps=2, eval_every=0, save_every=0)
    train(cfg, tmp_path / "run", progress=False, slim=True)
    with pytest.raises(QkvError, match="already holds a checkpoint; pass --resume"):
        train(cfg, tmp_path / "run", progress=False)
    with pytest.raises(QkvError, match="no optimizer state to resume from"):
        train(LMTrainConfig(**TINY, steps=4), tmp_path / "run", resume=True, progress=False)
    with pytest.raises(QkvError, match=r"different configuration: d_model=32 \(now 48\)"):
        train(LMTrainConfig(**{**TINY, "d_model": 48}, steps=4), tmp_path / "run", resume=True,
              progress=False)
    with pytest.raises(QkvError, match="--lr must be a finite number"):
        LMTrainConfig(lr=float("inf"))
    with pytest.raises(QkvError, match="--max-span"):
        LMTrainConfig(seq_len=16, max_span=9)
    with pytest.raises(QkvError, match="'steps' must be int, got 'abc'"):
        LMTrainConfig.from_dict({"steps": "abc"})


def test_appeared_at():
    h = [{"step": 100, "induction": [[0.1, 0.2]]}, {"step": 200, "induction": [[0.6, 0.1]]}]
    assert appeared_at(h) == 200 and appeared_at(h[:1]) is None
