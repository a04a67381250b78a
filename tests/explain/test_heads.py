"""Head finding and the coreference probe: the shipped probe set is well-formed, and the probe's
hits are what the traced weights (equal to Hugging Face's) say."""

from importlib import resources

import pytest
import torch

from qkv.errors import QkvError
from qkv.explain import forward
from qkv.explain.heads import load_probe, rank_pair, run_probe
from qkv.explain.select import word_units

TEXT = "The dog found some pizza next to the baby and ate it"


@pytest.fixture(scope="module")
def model():
    return forward.load_model("minilm")


@pytest.fixture(scope="module")
def probe(model):
    return run_probe(model, "coref")


def test_probe_set_is_well_formed(model):
    raw = resources.files("qkv").joinpath("data", "coref.jsonl").read_text(encoding="utf-8")
    assert len([l for l in raw.splitlines() if l.strip()]) == len(load_probe("coref"))
    items = load_probe("coref")
    assert 30 <= len(items) <= 80
    for item in items:
        units = word_units(forward.encode(model, item.text), item.text)
        low = [label.lower() for label in units.labels]
        assert low.count(item.pronoun.lower()) == 1, item.text
        assert low.count(item.referent.lower()) == 1, item.text
        p, r = low.index(item.pronoun.lower()), low.index(item.referent.lower())
        assert r < p, item.text
        assert item.decoys, item.text
        for decoy in item.decoys:  # decoys lie between the referent and the pronoun
            assert decoy.lower() in low[r + 1:p], (item.text, decoy)
    assert len({item.text + item.pronoun for item in items}) == len(items)


def test_unknown_probe():
    with pytest.raises(QkvError, match="unknown probe 'winograd'; known probes: coref"):
        load_probe("winograd")


def test_probe_hits_follow_the_weights(model, probe):
    n = len(probe.items)
    assert probe.hits.shape == (n, 6, 12)
    # recount two sentences by hand from the traced rows
    for k in (0, n - 1):
        item = probe.items[k]
        enc = forward.encode(model, item.text)
        units = word_units(enc, item.text)
        low = [label.lower() for label in units.labels]
        p, r = low.index(item.pronoun.lower()), low.index(item.referent.lower())
        rows = list(units.groups[p])
        traced = forward.trace(model, item.text, torch.arange(len(enc.ids)))  # all rows
        for L in range(6):
            w = traced.weights(L)[:, rows].mean(1)  # (h, s): from the word, averaged
            per_word = torch.stack([w[:, list(g)].sum(-1) for g in units.groups], -1)  # (h, U)
            for u, special in enumerate(units.special):
                if special or u == p:
                    per_word[:, u] = -1
            assert (per_word.argmax(-1) == r).tolist() == probe.hits[k, L].tolist()
    assert probe.candidates.min() >= 5
    assert probe.chance == pytest.approx(float((1 / probe.candidates.double()).mean()))


def test_best_heads_beat_chance(probe):
    ranked = probe.ranked()
    layer, head, acc, correct = ranked[0]
    assert correct == int(probe.hits[:, layer, head].sum())
    assert [c for *_, c in ranked] == sorted((c for *_, c in ranked), reverse=True)
    assert acc > 4 * probe.chance  # far above a random word
    (hl, hh), even, odd = probe.held_out()
    assert odd == pytest.approx(float(probe.hits[1::2, hl, hh].double().mean()))
    assert even >= float(probe.hits[0::2].double().mean(0).max()) - 1e-12


def test_rank_pair_orders_every_head(model):
    enc = forward.encode(model, TEXT)
    units = word_units(enc, TEXT)
    it, pizza = units.labels.index("it"), units.labels.index("pizza")
    traced = forward.trace(model, TEXT, torch.tensor(units.groups[it]), words=True)
    ranked = rank_pair([traced.weights(L) for L in range(6)], units, it, pizza)
    assert len(ranked) == 72 and len({(h.layer, h.head) for h in ranked}) == 72
    assert [h.weight for h in ranked] == sorted((h.weight for h in ranked), reverse=True)
    top = ranked[0]
    assert top.weight == pytest.approx(float(traced.weights(top.layer)[top.head, 0, pizza]), abs=1e-12)
