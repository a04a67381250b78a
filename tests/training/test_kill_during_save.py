"""SIGKILL at random moments of a training run that saves every step: nothing is lost.

A few kills here (``benchmarks/kill_during_save.py`` runs many and records them in
docs/reliability.md). After each kill the newest checkpoint loads with its optimizer state and is
never older than before; the run then resumes to the end. (That a resumed run equals an
uninterrupted one is tested in tests/translate/test_train.py.)
"""

from __future__ import annotations

from killing import kill_runs

from qkv.translate.checkpoint import load_checkpoint
from qkv.translate.train import TrainConfig, train

CFG = TrainConfig(d_model=16, num_heads=2, encoder_layers=1, decoder_layers=1, ff_dim=32,
                  batch_size=8, eval_size=0, eval_every=0, save_every=1, steps=12, warmup=2, lr=3e-3)


def test_kills_during_saves_lose_nothing_and_the_run_resumes_exactly(tmp_path):
    # Kills 0–0.15 s after the child's first step: a save (fsync) is ~90% of a step here, so
    # most kills land inside one (measured: 12 of 20 left a half-written temporary file).
    report = kill_runs(CFG, tmp_path / "killed", 3, seed=0, max_delay=0.15)
    assert report.kills + report.finished == 3 and report.kills >= 1
    train(CFG, tmp_path / "killed", resume=(tmp_path / "killed" / "config.json").is_file(),
          force=True, progress=False)
    assert not [p for p in (tmp_path / "killed").iterdir() if p.name.endswith(".tmp")]
    final = load_checkpoint(tmp_path / "killed", with_optimizer=True)
    assert final.step == 12 and report.steps == sorted(report.steps)
