"""The reader shipped in qkv/data/reader: it loads by name, computes what transformers' Mistral
computes on the same weights, reads a long text at O(N), and its heads and held-out loss are what
the tutorial says.

The head scores are computed now, on fresh random sequences (another seed than the training-time
probe), against chance computed by the same code.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

import qkv
from qkv.explain.probes.induction import induction_probe
from qkv.models.registry import data_dir
from qkv.reader.train import read_training

pytestmark = pytest.mark.skipif(not os.path.isfile(os.path.join(data_dir("reader"), "config.json")),
                                reason="no shipped reader yet")

# English the reader never trained on (the tutorial is held out; this is not from the docs).
PROSE = ("The library keeps a list of the files it has opened, and when a file is closed it is "
         "removed from that list. If the same file is opened twice, the second call returns the "
         "object made by the first one, so that both names refer to a single file. ")


@pytest.fixture(scope="module")
def reader():
    return qkv.load("reader")


def test_it_loads_by_name_with_a_sliding_window(reader):
    assert reader.name == "qkv-reader" and reader.capabilities.causal
    assert reader.config.sliding_window == 128 and reader.max_length == 131072
    assert reader.tokenizer.encode("Python").tokens[0] == "<bos>"
    size = sum(os.path.getsize(os.path.join(data_dir("reader"), f)) for f in os.listdir(data_dir("reader")))
    assert size < 8 * 2**20  # the repository carries it


def test_transformers_computes_the_same_logits_past_the_window(reader):
    # The directory is a Hugging Face Mistral: transformers loads it and computes the same
    # logits on a text longer than the window (the band mask matters). Reference: qkv in float64;
    # qkv's float32 error may be at most twice transformers' float32 error (+2 ulp).
    from tolerance import assert_within
    from transformers import MistralForCausalLM

    hf = MistralForCausalLM.from_pretrained(data_dir("reader"), attn_implementation="eager").eval()
    ref = qkv.load("reader", dtype=torch.float64)
    ids = torch.tensor([reader.tokenizer.encode(PROSE * 6).ids])
    assert ids.shape[1] > 2 * reader.config.sliding_window
    with torch.no_grad():
        assert_within(reader(ids).logits.double(), ref(ids).logits, hf(ids).logits.double(),
                      what="logits")


def test_some_head_is_an_induction_head_ten_times_chance(reader):
    r = induction_probe(reader, "induction", sequences=16, length=25, seed=12345)
    layer, head, best = r.ranked()[0]
    assert best > 10 * r.chance, (layer, head, best, r.chance)
    assert layer > 0  # induction composes with an earlier layer's head


def test_some_earlier_head_is_a_previous_token_head(reader):
    ind = induction_probe(reader, "induction", sequences=16, length=25, seed=12345)
    prev = induction_probe(reader, "previous-token", sequences=16, length=25, seed=12345)
    first_induction_layer = ind.ranked()[0][0]
    earlier = [s for (layer, head, s) in prev.ranked() if layer < first_induction_layer]
    assert max(earlier) > 0.4 and max(earlier) > 5 * prev.chance, (earlier, prev.chance)


def test_the_record_names_the_run_the_corpus_and_beats_unigram():
    record = read_training(data_dir("reader"))
    assert record["command"] == "qkv train reader --out src/qkv/data/reader --slim --threads 2"
    assert record["optimizer"] is None and record["train"]["seed"] == 0
    corpus = record["corpus"]
    assert corpus["package"] == "python3.11-doc" and corpus["version"]
    assert corpus["licence"].startswith("Python Software Foundation License Version 2")
    assert corpus["heldout"] == ["tutorial/"]
    held = record["heldout"]
    # nats per token on pages never seen: measured 4.97 against the unigram's 6.71
    assert held["loss"] < held["unigram_loss"] - 0.5, held
    meta = json.loads(open(os.path.join(data_dir("reader"), "config.json")).read())
    assert meta["model_type"] == "mistral" and meta["architectures"] == ["MistralForCausalLM"]


def test_a_ten_thousand_token_text_is_one_document(reader):
    from qkv.explain.long.document import document

    text = PROSE * 230
    doc = document(reader, text)
    assert len(doc) > 10_000
    rows = doc.row_weights(0, [len(doc) - 1])  # (h, 1, N): the last token sees its window only
    assert rows.shape == (4, 1, len(doc))
    assert float(rows[..., :len(doc) - 128].abs().max()) == 0.0
    assert torch.allclose(rows[..., len(doc) - 128:].sum(-1), torch.ones(4, 1), atol=1e-5)


def test_view_file_defaults_to_the_reader(capsys, tmp_path):
    from qkv.cli import main

    book = tmp_path / "book.txt"
    book.write_text("the cat sat on the mat " * 24000)  # more tokens than the reader's 131,072
    assert main(["view", "--no-browser", "--port", "0", "--file", str(book)]) == 2
    err = capsys.readouterr().err
    assert "qkv-reader takes at most 131,072; shorten it" in err, err  # no other model to name
