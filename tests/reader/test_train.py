"""qkv train reader: a short run on a tiny corpus writes a checkpoint qkv.load runs, and a killed
run resumes exactly."""

from __future__ import annotations

import json

import pytest
import torch

import qkv
from qkv.cli import main
from qkv.errors import QkvError
from qkv.reader.data import train_tokenizer
from qkv.reader.train import ReaderTrainConfig, new_model, prepare, read_training, train
from reader_corpus import write_docs
from tolerance import assert_within

TINY = dict(vocab_size=300, d_model=32, num_heads=2, layers=2, ff_dim=64, window=16, seq_len=32,
            min_span=4, max_span=8, copy_len=16, copy_steps=2, copy_prob=0.5, batch_size=4,
            eval_size=4, probe_size=2, max_positions=4096, warmup=2, lr=1e-2)


def flags(options: dict) -> list[str]:
    return [x for k, v in options.items() for x in ("--" + k.replace("_", "-"), str(v))]


@pytest.fixture(scope="module")
def docs(tmp_path_factory):
    return write_docs(tmp_path_factory.mktemp("docs"))


def test_the_command_writes_a_mistral_directory_that_loads(docs, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "reader", "--out", str(out), "--corpus", str(docs), "--quiet", "--slim",
                 "--steps", "4", "--eval-every", "2", *flags(TINY)]) == 0
    assert "held-out pages read whole" in capsys.readouterr().out
    meta = json.loads((out / "config.json").read_text())
    assert meta["model_type"] == "mistral" and meta["architectures"] == ["MistralForCausalLM"]
    assert meta["sliding_window"] == 16 and meta["tie_word_embeddings"] is False
    record = read_training(out)
    assert record["command"].startswith(f"qkv train reader --out {out} --slim --threads 1 --steps 4")
    assert record["train"]["seed"] == 0 and record["train"]["corpus"] == str(docs)
    assert record["corpus"]["pages"] == 3 and record["corpus"]["heldout_pages"] == 1
    assert [h["step"] for h in record["history"]] == [2, 4] and record["optimizer"] is None
    held = record["heldout"]
    assert held["tokens"] == record["corpus"]["heldout_tokens"] > 0
    assert 0 < held["loss"] < 20 and 0 < held["unigram_loss"] < 20

    model = qkv.load(out)
    assert model.config.sliding_window == 16 and model.tokenizer.max_length == 4096
    enc = model.tokenizer.encode("the module returns a value")
    assert enc.tokens[0] == "<bos>"
    # The in-memory model and the loaded one hold the same numbers: equal logits.
    cfg = ReaderTrainConfig.from_dict(record["train"])
    ref = new_model(cfg, model.tokenizer._tok)
    ref.load_state_dict(model.state_dict())
    ids = torch.tensor([enc.ids * 3])  # 3 × 6 tokens > the window of 16
    assert torch.equal(model(ids).logits, ref(ids).logits)


class Kill(Exception):
    pass


def test_killed_run_resumes_exactly(docs, tmp_path):
    cfg = ReaderTrainConfig(**TINY, corpus=str(docs), steps=6, eval_every=0, save_every=2)
    prepared = prepare(cfg)
    train(cfg, tmp_path / "straight", progress=False, prepared=prepared)
    train(cfg, tmp_path / "again", progress=False, prepared=prepared)

    def kill_at_3(state):
        if state.step == 3:
            raise Kill

    with pytest.raises(Kill):
        train(cfg, tmp_path / "killed", progress=False, callback=kill_at_3, prepared=prepared)
    assert read_training(tmp_path / "killed")["step"] == 2
    train(cfg, tmp_path / "killed", resume=True, progress=False, prepared=prepared)
    straight, resumed, again = ({k: v.clone() for k, v in qkv.load(tmp_path / d).state_dict().items()}
                                for d in ("straight", "killed", "again"))
    for name in straight:
        assert_within(resumed[name], straight[name], again[name], what=name)


def test_option_errors(docs, tmp_path):
    with pytest.raises(QkvError, match=r"need --min-span \(4\) <= --max-span \(16\) <= --copy-len / 2 \(8\)"):
        ReaderTrainConfig(copy_len=16)
    with pytest.raises(QkvError, match=r"--copy-len \(64\) must be at most --seq-len \(32\) and --window \(128\)"):
        ReaderTrainConfig(seq_len=32)
    with pytest.raises(QkvError, match=r"--copy-vocab must be 0 \(the whole vocabulary\) or at least 2"):
        ReaderTrainConfig(copy_vocab=1)
    with pytest.raises(QkvError, match=r"--max-positions \(32\) must exceed --seq-len \(32\)"):
        ReaderTrainConfig(**{**TINY, "max_positions": 32})
    with pytest.raises(QkvError, match="--vocab-size must be between 258 and 65536, got 200"):
        ReaderTrainConfig(**{**TINY, "vocab_size": 200}, corpus=str(docs))
    with pytest.raises(QkvError, match="--vocab-size must be at least 258"):
        train_tokenizer(["a text"], vocab_size=200)
    with pytest.raises(QkvError, match="is not a directory"):
        prepare(ReaderTrainConfig(**TINY, corpus=str(tmp_path / "none")))
    with pytest.raises(QkvError, match="is not a run of qkv train reader"):
        read_training(qkv.models.loading.lm_dir())
