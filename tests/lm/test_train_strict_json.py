"""`qkv train lm --copy-prob 0` wrote a NaN literal into config.json (issue 23): a loss with
nothing to average is null, and every manifest is strict JSON that qkv's own reader accepts."""

import json

from qkv.files import read_json
from qkv.lm.train import LMTrainConfig, train

TINY = dict(d_model=32, num_heads=2, layers=2, ff_dim=64, seq_len=32, min_span=2, max_span=8,
            rule_prob=0.5, batch_size=8, eval_size=8, probe_size=4, lr=1e-2, warmup=5)


def test_no_copied_words_is_null_not_nan(tmp_path):
    cfg = LMTrainConfig(**{**TINY, "copy_prob": 0.0}, steps=2, eval_every=2, save_every=0)
    train(cfg, tmp_path / "run", progress=False)
    text = (tmp_path / "run" / "config.json").read_text()
    assert "NaN" not in text
    record = read_json(tmp_path / "run" / "config.json")["qkv_training"]
    assert record["history"][-1]["copy_loss"] is None
    assert isinstance(record["history"][-1]["random_loss"], float)
    json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(AssertionError(c)))
