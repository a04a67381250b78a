"""SIGKILL at random moments of a training run that saves every step: nothing is lost.

A few kills here (``benchmarks/kill_during_save.py`` runs many and records them in
docs/reliability.md). After each kill the newest checkpoint loads with its optimizer state and is
never older than before; the run then resumes. (That a resumed run equals an uninterrupted one
is tested in tests/translate/test_train.py.)
"""

from __future__ import annotations

import pytest
from killing import kill_runs

from qkv.translate.checkpoint import load_checkpoint
from qkv.translate.train import TrainConfig, train

# Far more steps than the kills leave time for: every run is killed, none ends by itself.
CFG = TrainConfig(d_model=16, num_heads=2, encoder_layers=1, decoder_layers=1, ff_dim=32,
                  batch_size=8, eval_size=0, eval_every=0, save_every=1, steps=10**4, warmup=2, lr=3e-3)


class Stop(Exception):
    pass


def test_kills_during_saves_lose_nothing_and_the_run_resumes(tmp_path):
    # Kills 0–0.15 s after the child's first step: a save (fsync) is most of a step here, so
    # many kills land inside one (benchmark: 46 of 180 left a half-written temporary file).
    out = tmp_path / "killed"
    report = kill_runs(CFG, out, 3, seed=0, max_delay=0.15)
    assert report.kills == 3 and report.steps == sorted(report.steps)
    last = report.steps[-1]

    def stop_two_later(state):
        if state.step == last + 2:
            raise Stop

    with pytest.raises(Stop):
        train(CFG, out, resume=(out / "config.json").is_file(), force=True, progress=False,
              callback=stop_two_later)
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]  # the kills' leftovers are gone
    assert load_checkpoint(out, with_optimizer=True).step == last + 2
