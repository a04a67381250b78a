"""Retrieval heads (qkv.explain.retrieval) against a float64 reference of Wu et al.'s definition,
computed from whole attention maps, on the shipped lm and on a transformers Mistral (a sliding
window) run through qkv's attention; the probe registry, head_effects and the ablation."""

from __future__ import annotations

import pytest
import torch

import qkv
from qkv.explain import probe
from qkv.explain.probes.registry import PROBES
from qkv.explain.causal.head_effects import head_effects
from qkv.explain.probes.retrieval import (RetrievalScores, needle_input, needle_inputs, retrieval_ablation,
                                   retrieval_probe)
from qkv.explain.wording import ArgumentError

EPS32 = torch.finfo(torch.float32).eps


#: keys whose float64 weight is this close to a row's largest are ties the float32 path may order
#: either way (its weights are within a few eps32 of these)
TIE = 64 * EPS32


def reference(model64, inputs):
    """(scores (L, H) as (lowest, highest) over the ties' orders, needle weight (L, H), chance
    (L,), accuracy, smallest top-2 gap) by the definition, from every layer's whole float64 map: a
    head copies at step k when the model's argmax is n_{k+1} and the head's argmax key is a needle
    position holding n_{k+1}."""
    scores, weights, chances, correct, gap = 0, 0, 0, [], float("inf")
    low = 0
    for x in inputs:
        ids = x.ids[None]
        with torch.no_grad():
            out = model64(ids, torch.ones_like(ids), trace_rows=slice(None))
        maps = torch.stack([tr.self_attn.attention.weights[0] for tr in out.traces])  # (L, H, t, t)
        L, H, t, _ = maps.shape
        m = x.needle
        steps = range(m - 1)
        right = [int(out.logits[0, x.query + k].argmax()) == int(x.ids[x.start + k + 1]) for k in steps]
        correct += right
        copied = torch.zeros(L, H, dtype=torch.float64)
        sure = torch.zeros(L, H, dtype=torch.float64)
        for k in steps:
            row = maps[:, :, x.query + k]  # (L, H, t)
            two = row.topk(2, dim=-1).values
            gap = min(gap, float((two[..., 0] - two[..., 1]).min()))
            want = int(x.ids[x.start + k + 1])
            holds = torch.zeros(t, dtype=torch.bool)
            holds[x.start:x.start + m] = x.ids[x.start:x.start + m] == want
            near = row >= row.max(-1, keepdim=True).values - TIE  # (L, H, t): the top and its ties
            copied += (near & holds).any(-1).double() * right[k]  # some order makes it a copy
            sure += (near <= holds).all(-1).double() * right[k]  # every order does
        scores = scores + copied / (m - 1)
        low = low + sure / (m - 1)
        weights = weights + maps[:, :, x.query:x.query + m - 1, x.start:x.start + m].sum(-1).mean(-1)
        visible = maps[:, 0, x.query:x.query + m - 1] > 0  # (L, m − 1, t): a causal or windowed row
        holds = torch.stack([(x.ids == x.ids[x.start + k + 1]) for k in steps])  # (m − 1, t)
        holds[:, :x.start] = False
        holds[:, x.start + m:] = False
        chances = chances + ((visible & holds).sum(-1).double() / visible.sum(-1)).mean(-1)
    n = len(inputs)
    return (low / n, scores / n), weights / n, chances / n, sum(correct) / len(correct), gap


def check(model, model64, *, ties: bool = False, **kw):
    """``ties``: the model has rows whose top keys tie within float32's rounding (a head spread
    evenly): its scores must lie between the lowest and highest orders of the ties."""
    got = retrieval_probe(model, **kw)
    inputs = needle_inputs(model, **{k: v for k, v in kw.items() if k != "progress"})
    (low, high), weights, chance, accuracy, gap = reference(model64, inputs)
    slack = 1e-12
    assert bool((got.scores >= low - slack).all() and (got.scores <= high + slack).all())
    if not ties:
        assert gap > TIE  # no near-tie: one order, one score
        assert torch.allclose(got.scores, high, rtol=1e-12, atol=1e-15)  # exact but for the sums' order
    assert got.accuracy == pytest.approx(accuracy, rel=1e-12)
    # the needle weight: m float32 weights summed, each within a few ulp of the float64 one
    assert float((got.needle_weight - weights).abs().max()) <= 16 * got.needle * EPS32
    assert torch.allclose(got.chance_per_layer, chance, rtol=1e-12, atol=0)
    assert got.chance == float(chance.max())
    return got


def test_the_lm_against_the_definition():
    got = check(qkv.load("lm"), qkv.load("lm", dtype=torch.float64), samples=3, length=40, needle=6)
    assert isinstance(got, RetrievalScores) and got.scores.shape == (2, 2)
    # the lm copies: its best head copy-pastes far above chance
    assert got.ranked()[0][2] > 10 * got.chance


def test_a_transformers_mistral_with_a_window(tmp_path):
    pytest.importorskip("transformers")
    from hf_decoders import make_checkpoint

    path, _ = make_checkpoint(tmp_path, "MistralConfig", "MistralForCausalLM", hidden_size=32,
                              intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                              num_key_value_heads=2, sliding_window=12, max_position_embeddings=256)
    model, model64 = qkv.load(path, via="hf"), qkv.load(path, via="hf", dtype=torch.float64)
    got = check(model, model64, samples=2, length=37, needle=5)
    # the window (12) cannot reach a needle 20+ tokens back: chance 0 at every layer
    far = needle_input(model, length=37, depth=0.0, needle=5)
    assert far.query - far.start > 12
    assert got.chance_per_layer.shape == (2,)


def test_the_one_registry_runs_it():
    assert "retrieval" in PROBES
    r = probe(qkv.load("lm"), "retrieval")
    assert r.kind == "retrieval-scores" and r.to_dict()["heads"][0]["score"] == r.ranked()[0][2]
    with pytest.raises(ArgumentError, match="retrieval needs a decoder"):
        probe(qkv.load("minilm"), "retrieval")


def test_the_needle_input():
    lm = qkv.load("lm")
    x = needle_input(lm, length=30, depth=1.0, needle=4, seed=3)
    assert x.ids.shape == (30,) and x.query == 26 and x.start == 22
    assert torch.equal(x.ids[x.start:x.start + 4], x.ids[-4:])
    # the needle's tokens occur only in the needle and its copy (a random haystack avoids them)
    assert int(torch.isin(x.ids, x.ids[-4:]).sum()) == 8
    for kw, match in ((dict(length=66), "length 66 is more tokens than qkv-lm takes"),
                      (dict(length=8), "length must be a whole number of tokens in 9–"),
                      (dict(needle=1), "needle must be a whole number of tokens in 2–256"),
                      (dict(depth=1.5), "depth must be a fraction of the haystack in 0–1")):
        with pytest.raises(ArgumentError, match=match):
            needle_input(lm, **(dict(length=30, depth=0.5, needle=4) | kw))


def test_effects_and_ablation():
    lm = qkv.load("lm")
    e = head_effects(lm, "retrieval", sequences=3)
    assert e.effects.shape == (2, 2) and e.clean > 0
    a = retrieval_ablation(lm, k=1, trials=2, samples=3)
    assert a.heads == (tuple(retrieval_probe(lm, samples=3).top(1)[0]),)
    assert a.clean == pytest.approx(retrieval_probe(lm, samples=3).accuracy, rel=1e-12)
    assert all(a.heads[0] not in r for r in a.random)
    with pytest.raises(ArgumentError, match="k must be a whole number of heads in 1–3"):
        retrieval_ablation(lm, k=4)


@pytest.mark.skipif(not __import__("os").path.isfile(__import__("os").path.join(
    __import__("qkv.models.registry", fromlist=["data_dir"]).data_dir("reader"), "config.json")),
    reason="no reader")
def test_the_reader_past_its_window():
    reader = qkv.load("reader")
    window = reader.config.sliding_window
    got = check(reader, qkv.load("reader", dtype=torch.float64), samples=2, length=2 * window + 40,
                needle=6, ties=True)
    # a needle at depth 0 lies further back than the window from every query row: chance 0
    far = needle_input(reader, length=2 * window + 40, depth=0.0, needle=6)
    assert far.query - (far.start + 6) > window
    assert got.chance_per_layer.shape == (reader.config.num_hidden_layers,)
