"""The model shipped in qkv/data/lm: it loads by name, and its heads are what the tutorial says.

Nothing here is hard-coded from the training log: the scores are computed now, on fresh random
sequences (another seed than the training-time probe), and compared with chance computed by the
same code.
"""

from __future__ import annotations

import json
import os

import pytest

import qkv
from qkv.explain.probes.induction import induction_probe
from qkv.lm.train import read_training
from qkv.models.loading import lm_dir

pytestmark = pytest.mark.skipif(not os.path.isfile(os.path.join(lm_dir(), "config.json")),
                                reason="no shipped LM yet")


@pytest.fixture(scope="module")
def lm():
    return qkv.load("lm")


def test_some_head_is_an_induction_head_well_above_chance(lm):
    r = induction_probe(lm, "induction", sequences=16, length=20, seed=12345)
    layer, head, best = r.ranked()[0]
    # "Well above chance": ten times uniform attention, and a large share of the head's weight
    # (measured 0.54 for L1 H1, chance 0.033: 16×).
    assert best > 10 * r.chance and best > 0.4, (layer, head, best, r.chance)
    assert layer > 0  # induction needs an earlier layer's previous-token head to compose with


def test_some_earlier_head_is_a_previous_token_head(lm):
    ind = induction_probe(lm, "induction", sequences=16, length=20, seed=12345)
    prev = induction_probe(lm, "previous-token", sequences=16, length=20, seed=12345)
    first_induction_layer = ind.ranked()[0][0]
    earlier = [s for (layer, head, s) in prev.ranked() if layer < first_induction_layer]
    # measured 0.73 for L0 H1, chance 0.083
    assert max(earlier) > 0.5 and max(earlier) > 5 * prev.chance, (earlier, prev.chance)


def test_the_shipped_run_records_when_induction_appeared():
    record = read_training(lm_dir())
    assert record["optimizer"] is None  # --slim: a model to explain, not to resume
    appeared = record["induction_appeared_at"]
    assert appeared is not None and 0 < appeared < record["step"]
    meta = json.loads(open(os.path.join(lm_dir(), "config.json")).read())
    assert meta["model_type"] == "llama" and meta["architectures"] == ["LlamaForCausalLM"]


def test_transformers_reads_the_shipped_directory_as_a_llama(lm):
    # The checkpoint is a Hugging Face Llama directory: transformers loads it (through the
    # safetensors index) and computes the same logits. Reference: qkv in float64; qkv's float32
    # error may be at most twice transformers' float32 error (+2 ulp).
    import torch
    from tolerance import assert_within
    from transformers import LlamaForCausalLM

    hf = LlamaForCausalLM.from_pretrained(lm_dir(), attn_implementation="eager").eval()
    ref = qkv.load("lm", dtype=torch.float64)
    ids = torch.tensor([lm.tokenizer.encode("baka bela dima fona gisa baka bela dima fona gisa").ids])
    with torch.no_grad():
        assert_within(lm(ids).logits.double(), ref(ids).logits, hf(ids).logits.double(), what="logits")
