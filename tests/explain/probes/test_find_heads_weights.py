"""`heads` ranks by weights from a forward that keeps each layer's rows' weights only
(`forward.row_weights`, `trace_rows=Weights`): the ranking is the one the whole traced forward
gives (`unit_shares`), number for number.

Tolerances: none — the rows run the very same reference path in the very same forward.
"""

from __future__ import annotations

import pytest
import torch

import qkv
from qkv.explain import forward
from qkv.explain.probes.base import unit_shares
from qkv.explain.probes.find_heads import heads, rank_pair
from qkv.explain.select import choose, word_units
from qkv.modules import LayerRows, Weights, WeightsTrace

CASES = {"minilm": ("The dog found some pizza next to the baby and ate it", "it", "pizza"),
         "lm": ("baka bela dima fona baka bela dima fona", None, "dima")}


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_ranking_is_the_whole_traces(name):
    model = qkv.load(name)
    text, source, target = CASES[name]
    got = heads(model, text, source=source, target=target)
    encoding = forward.encode(model, text)
    units = word_units(encoding, text)
    src, tgt = choose(source, units, role="source"), choose(target, units, role="target")
    per_layer, _ = unit_shares(model, encoding, units, src.unit, "weight", None)  # the whole trace
    assert got.heads == rank_pair(per_layer, units, src.unit, tgt.unit)


def test_the_forward_keeps_the_weights_alone():
    model = qkv.load("lm")
    ids = torch.tensor([model.tokenizer.encode(CASES["lm"][0]).ids])
    rows = torch.tensor([ids.shape[1] - 1])
    with torch.no_grad():
        out = model(ids, torch.ones_like(ids), trace_rows=LayerRows(len(model.layers) - 1, Weights(rows),
                                                                    earlier=True))
    assert all(isinstance(tr.self_attn, WeightsTrace) and tr.residual is None for tr in out.traces)
    assert out.logits.shape[1] == 0  # the model's head read nothing
    assert [tuple(w.shape) for w in forward.row_weights(model, ids, rows)] == \
        [(model.layers[0].self_attn.num_heads, 1, ids.shape[1])] * len(model.layers)
