"""The needle map (qkv.explain.needle) against its definition: each cell the mean over its inputs
of read_needle's accuracy and the chosen heads' needle weight, which test_retrieval checks against
float64 whole maps; and the grid's checks before any forward."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

import qkv
from qkv.explain.probes.needle import NeedleMap, needle_map
from qkv.explain.rendering.figures import needle_figure
from qkv.explain.probes.retrieval import needle_input, read_needle
from qkv.explain.wording import ArgumentError


def test_cells_are_the_readings_of_their_inputs():
    lm = qkv.load("lm")
    m = needle_map(lm, lengths=[30, 50], depths=[0.0, 0.5, 1.0], samples=2, heads=[(1, 1), (0, 0)])
    assert m.accuracy.shape == m.attention.shape == (3, 2)
    for j, n in enumerate(m.lengths):
        for i, d in enumerate(m.depths):
            rs = [read_needle(lm, needle_input(lm, length=n, depth=d, seed=s)) for s in range(2)]
            acc = sum(float(r.correct.double().mean()) for r in rs) / 2
            att = sum(float((r.needle_weight[1, 1] + r.needle_weight[0, 0]) / 2) for r in rs) / 2
            assert float(m.accuracy[i, j]) == pytest.approx(acc, rel=1e-12)
            assert float(m.attention[i, j]) == pytest.approx(att, rel=1e-12)
    assert len(needle_figure(m).axes) == 4  # two maps and their colour bars
    assert m.to_dict()["accuracy"] == m.accuracy.tolist()
    # read back from its JSON (qkv needle --json → qkv view's /needle): the same map
    back = NeedleMap.from_dict(json.loads(json.dumps(m.to_dict())))
    assert back == replace(m, accuracy=back.accuracy, attention=back.attention)
    assert torch.equal(back.accuracy, m.accuracy) and torch.equal(back.attention, m.attention)


def test_the_heads_default_to_the_probes_top():
    lm = qkv.load("lm")
    m = needle_map(lm, lengths=[40], depths=[0.5], top=2)
    assert m.heads == tuple(qkv.explain.probes.retrieval.retrieval_probe(lm).top(2))


@pytest.mark.parametrize("kw, match", [
    (dict(lengths=[30, 66]), "length 66 is more tokens than qkv-lm takes"),
    (dict(lengths=[]), "lengths must be a non-empty list"),
    (dict(depths=[0.5, 2.0]), "depth must be a fraction of the haystack in 0–1, got 2.0"),
    (dict(heads=[(2, 0)]), "layer"),
    (dict(top=5), "top must be a whole number of heads in 1–4"),
])
def test_bad_grids_fail_before_a_forward(kw, match):
    with pytest.raises(ArgumentError, match=match):
        needle_map(qkv.load("lm"), **(dict(lengths=[30], depths=[0.0]) | kw))


def test_an_encoder_is_refused():
    with pytest.raises(ArgumentError, match="retrieval needs a decoder"):
        needle_map(qkv.load("minilm"), lengths=[30])
    assert torch.is_tensor(needle_map(qkv.load("lm"), lengths=[30], depths=[0.0], top=1).accuracy)
