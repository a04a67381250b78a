"""Head finding and the coreference probe, checked against an independent oracle: Hugging Face's
eager BERT on the same weights gives every attention map, and the word-level weights, rankings
and probe hits are recomputed from those maps with plain loops."""

import json
from importlib import resources

import pytest
import torch
from explain_peers import reference

from qkv.errors import QkvError
from qkv.explain import heads, probe
from qkv.explain.probes.find_heads import load_probe, rank_pair
from qkv.explain.select import word_units

TEXT = "The dog found some pizza next to the baby and ate it"


@pytest.fixture(scope="module")
def result(model):
    return probe(model, "coref")


def word_weight(att: torch.Tensor, units, source: int, target: int) -> torch.Tensor:
    """(layers, h): from word ``source`` (its tokens' rows averaged) into word ``target`` (its
    tokens' columns summed), by hand."""
    rows, cols = list(units.groups[source]), list(units.groups[target])
    return att[:, :, rows][:, :, :, cols].sum(-1).mean(-1)


def test_probe_set_is_well_formed(model):
    raw = resources.files("qkv").joinpath("data", "coref.jsonl").read_text(encoding="utf-8")
    assert len([l for l in raw.splitlines() if l.strip()]) == len(load_probe("coref"))
    items = load_probe("coref")
    assert 30 <= len(items) <= 80
    for item in items:
        units = word_units(model.tokenizer.encode(item.text), item.text)
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


def test_pair_ranking_equals_hugging_face_by_hand(model, hf):
    r = heads(model, TEXT, source="it", target="pizza")
    units = word_units(model.tokenizer.encode(TEXT), TEXT)
    assert (r.source, r.target) == (units.labels.index("it"), units.labels.index("pizza"))
    ref, tol = reference(hf, model.tokenizer.encode(TEXT).ids)
    want = word_weight(ref, units, r.source, r.target)
    tol *= max(len(units.groups[r.target]), 1)  # the target word's columns summed
    assert len(r.heads) == 72 and {(h.layer, h.head) for h in r.heads} == {
        (l, h) for l in range(6) for h in range(12)}
    for h in r.heads:
        assert h.weight == pytest.approx(float(want[h.layer, h.head]), abs=tol)
    # Ranked by the oracle's weights: any pair out of the oracle's order is within round-off
    # (each of the two weights within tol of the oracle's).
    ours = [(h.layer, h.head) for h in r.heads]
    for a, b in zip(ours, ours[1:]):
        assert want[a] >= want[b] - 2 * tol, (a, b)
    assert ours[0] == (3, 1)  # the coreference head qkv's docs point at


def test_pair_over_split_words_sums_and_averages(model, hf):
    """A source and a target of several word pieces: the oracle sums the target's columns and
    averages the source's rows."""
    text = "The pizzeria's owner found the pizzeria empty"
    r = heads(model, text, source="pizzeria", target="pizzeria@0")
    units = r.units
    assert len(units.groups[r.source]) == 3 and r.source != r.target
    ref, tol = reference(hf, model.tokenizer.encode(text).ids)
    want = word_weight(ref, units, r.source, r.target)
    got = torch.zeros(6, 12, dtype=torch.float64)
    for h in r.heads:
        got[h.layer, h.head] = h.weight
    # the target's columns summed (each within tol), the source's rows averaged (no growth)
    torch.testing.assert_close(got, want, atol=tol * len(units.groups[r.target]), rtol=0)
    assert [str(n) for n in r.notes] == [
        "'pizzeria' occurs 2 times (words 2, 8); using the last (word 8). Pick another with "
        "source pizzeria@0 (occurrences count from 0) or source 2."]


def test_rank_pair_sorts_and_breaks_ties_by_layer_then_head():
    from types import SimpleNamespace as E

    from qkv.explain.select import token_units

    u = token_units(E(tokens=["a", "b"], special=[0, 0]))
    w = [torch.tensor([[[0.5, 0.5]], [[0.75, 0.25]]]), torch.tensor([[[0.5, 0.5]], [[0.0, 1.0]]])]
    assert [(h.layer, h.head, h.weight) for h in rank_pair(w, u, 0, 1)] == [
        (1, 1, 1.0), (0, 0, 0.5), (1, 0, 0.5), (0, 1, 0.25)]


def oracle_hits(hf, model, items) -> tuple[torch.Tensor, torch.Tensor]:
    """(n, layers, h) hits from Hugging Face's maps, and (n, layers, h) whether the decision was
    clear (the best candidate ahead of the next by more than round-off)."""
    hits, clear = [], []
    for item in items:
        enc = model.tokenizer.encode(item.text)
        units = word_units(enc, item.text)
        low = [label.lower() for label in units.labels]
        p, r = low.index(item.pronoun.lower()), low.index(item.referent.lower())
        att, tol = reference(hf, enc.ids)
        tol *= max(map(len, units.groups))  # a word's columns summed
        per_word = torch.stack([word_weight(att, units, p, u) for u in range(len(units))], -1)
        for u, special in enumerate(units.special):  # candidates: the words other than the pronoun
            if special or u == p:
                per_word[..., u] = -1.0
        top2 = per_word.topk(2, dim=-1).values
        hits.append(per_word.argmax(-1) == r)
        clear.append(top2[..., 0] - top2[..., 1] > 2 * tol)  # qkv's two may each be tol off
    return torch.stack(hits), torch.stack(clear)


def test_probe_hits_equal_hugging_face_by_hand(model, hf, result):
    hits, clear = oracle_hits(hf, model, result.items)
    assert result.hits.shape == hits.shape == (49, 6, 12)
    assert clear.double().mean() > 0.99
    assert torch.equal(result.hits[clear], hits[clear])
    assert result.candidates.min() >= 5
    assert result.chance == pytest.approx(float((1 / result.candidates.double()).mean()))


def test_probe_ranking_and_held_out_follow_the_oracle(model, hf, result):
    """The best head and its held-out score, chosen from the oracle's hits with plain Python."""
    hits, clear = oracle_hits(hf, model, result.items)
    assert clear.all(), "the held-out choice below needs every decision clear of round-off"
    n = len(result.items)
    correct = {(l, h): int(hits[:, l, h].sum()) for l in range(6) for h in range(12)}
    want = sorted(correct, key=lambda lh: (-correct[lh], lh))
    assert [(l, h) for l, h, *_ in result.ranked()] == want
    assert [(c, a) for *_, a, c in result.ranked()] == [(correct[lh], correct[lh] / n) for lh in want]
    even = {lh: float(hits[0::2, lh[0], lh[1]].double().mean()) for lh in correct}
    best = max(sorted(correct), key=lambda lh: even[lh])  # first of the best, in layer/head order
    odd = float(hits[1::2, best[0], best[1]].double().mean())
    assert result.held_out() == (best, pytest.approx(even[best]), pytest.approx(odd))
    layer, head, acc, _ = result.ranked()[0]
    assert acc > 4 * result.chance  # far above a random word


def test_held_out_chooses_on_even_sentences_and_scores_on_odd_ones():
    """Head 0 is best on the even sentences, head 1 on the odd ones: the choice must not peek."""
    from qkv.explain.probes.find_heads import ProbeItem, ProbeResult

    hits = torch.tensor([[1, 1], [0, 1], [1, 0], [0, 1]], dtype=torch.bool)[:, None]  # (4, 1, 2)
    r = ProbeResult(model="m", name="toy", items=[ProbeItem("t", "it", "x", ())] * 4, hits=hits,
                    candidates=torch.tensor([4, 4, 2, 2]), chosen=[])
    assert r.held_out() == ((0, 0), 1.0, 0.0)
    assert r.ranked() == [(0, 1, 0.75, 3), (0, 0, 0.5, 2)]
    assert r.chance == pytest.approx((0.25 + 0.25 + 0.5 + 0.5) / 4)


def test_to_dicts_are_json_and_what_the_cli_prints(model, result):
    r = heads(model, TEXT, source="it", target="pizza")
    d = json.loads(json.dumps(r.to_dict(), allow_nan=False))
    assert d["units"][d["source"]] == "it" and d["units"][d["target"]] == "pizza"
    assert d["heads"][0] == {"layer": 3, "head": 1, "weight": r.heads[0].weight}
    p = json.loads(json.dumps(result.to_dict(), allow_nan=False))
    assert p["sentences"] == 49 and p["probe"] == "coref" and len(p["heads"]) == 72
    assert (p["held_out"]["layer"], p["held_out"]["head"]) == result.held_out()[0]


def test_a_probe_longer_than_the_model_names_the_sentence_and_the_positions(model):
    """The user gave no text: "shorten it" would be wrong; the probe sentence and the model's
    positions are what does not fit."""
    import copy

    from qkv.explain.probes.find_heads import coref_item
    from qkv.explain.wording import ArgumentError

    short = copy.deepcopy(model)
    short.tokenizer.max_length = 8
    item = load_probe("coref")[0]
    with pytest.raises(ArgumentError, match=rf"coref cannot run on all-MiniLM-L6-v2: its probe "
                                            rf"sentence '{item.text[:10]}.*' is \d+ tokens, more than "
                                            rf"the 8 positions all-MiniLM-L6-v2 has$"):
        coref_item(short, item)
