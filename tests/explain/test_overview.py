"""The overview's numbers are the model's own attention: equal to Hugging Face's eager BERT
attention probabilities on the same weights, kept for one row only, ranked as documented."""

import json

import pytest
import torch
from explain_peers import reference

from qkv.explain import explain, forward
from qkv.explain.overview import entropy_bits
from qkv.explain.select import token_units, word_units

TEXT = "The dog found some pizza next to the baby and ate it"
SPLIT = "The pizzeria's owner found it"  # "pizzeria" is several word pieces


@pytest.mark.parametrize("text", [TEXT, SPLIT])
def test_traced_weights_equal_hugging_face(model, hf, text):
    enc = forward.encode(model, text)
    i = len(enc.ids) - 2  # the last word's token
    traced = forward.trace(model, text, torch.tensor([i]))
    ours = torch.stack([traced.weights(L)[:, 0] for L in range(6)])  # (layers, h, s)
    ref, tol = reference(hf, enc.ids)
    theirs = ref[:, :, i]  # (layers, h, s)
    assert ours.shape == theirs.shape == (6, 12, len(enc.ids))
    torch.testing.assert_close(ours.double(), theirs, atol=tol, rtol=0)


def test_overview_keeps_one_row_per_head(model):
    """O(layers · heads · t): every trace holds only the explained token's row."""
    enc = forward.encode(model, TEXT)
    t = len(enc.ids)
    traced = forward.trace(model, TEXT, torch.tensor([t - 2]))
    for tr in traced.traces:
        att = tr.self_attn.attention
        for name in ("weights", "scores", "scaled", "masked"):
            assert getattr(att, name).shape == (1, 12, 1, t), name
        assert att.query.shape == (1, 12, 1, 32) and att.output.shape == (1, 12, 1, 32)
        assert tr.self_attn.query_input.shape == (1, 1, 384)


def test_overview_ranks_by_largest_weight_and_finds_pizza(model, hf):
    enc = forward.encode(model, TEXT)
    it, pizza = enc.tokens.index("it"), enc.tokens.index("pizza")
    ov = explain(model, TEXT, token="it")
    assert ov.unit == it and ov.units.labels == token_units(enc).labels and ov.notes == ()
    assert (ov.model, ov.text, ov.tokens, ov.num_layers, ov.num_heads) == (
        "all-MiniLM-L6-v2", TEXT, enc.tokens, 6, 12)
    assert len(ov.rows) == 72
    maxes = [r.max_weight for r in ov.rows]
    assert maxes == sorted(maxes, reverse=True)
    ref, tol = reference(hf, enc.ids)
    ref = ref[:, :, it]  # (layers, h, s)
    for r in ov.rows:
        row = ref[r.layer, r.head]
        assert r.max_weight == pytest.approx(float(row.max()), abs=tol)
        # entropy moves by Σ_j |δw_j| · |log2 w_j + 1/ln 2| for weight errors δw_j ≤ tol
        slope = float((row.clamp_min(tol).log2() + 1 / torch.log(torch.tensor(2.0))).abs().sum())
        assert r.entropy == pytest.approx(float(-(row * row.log2()).sum()), abs=tol * slope)
        assert [w for _, w in r.top] == pytest.approx(row.topk(3).values.tolist(), abs=tol)
        assert row[r.argmax] == pytest.approx(r.max_weight, abs=2 * tol)  # both ends within tol
    # the focus is pizza, and the highlighted heads are exactly those whose argmax is pizza
    assert ov.focus == pizza
    lit = {(r.layer, r.head) for r in ov.rows if ov.highlighted(r)}
    expected = {(L, h) for L in range(6) for h in range(12) if int(ref[L, h].argmax()) == pizza}
    assert lit == expected and (3, 1) in lit


def test_words_average_rows_of_a_split_word(model, hf):
    """--words: the row from a split word is the mean of its tokens' rows (HF's numbers)."""
    enc = forward.encode(model, SPLIT)
    units = word_units(enc, SPLIT)
    u = units.labels.index("pizzeria")
    rows = torch.tensor(units.groups[u])
    traced = forward.trace(model, SPLIT, rows, words=True)
    assert traced.weights(0).shape == (12, len(rows), len(enc.ids))
    ov = explain(model, SPLIT, token="pizzeria", words=True, top=2)
    assert ov.unit == u and ov.units == units
    ref, tol = reference(hf, enc.ids)
    ref = ref[:, :, rows].mean(2)  # (layers, h, s)
    for r in ov.rows:
        want = torch.stack([ref[r.layer, r.head, list(g)].sum() for g in units.groups])
        # a word's weight sums at most max|g| token weights, each within tol
        torch.testing.assert_close(r.weights, want, atol=tol * max(map(len, units.groups)), rtol=0)


def test_entropy_bits_reference():
    p = torch.tensor([[0.25, 0.25, 0.25, 0.25], [1.0, 0.0, 0.0, 0.0]])
    assert entropy_bits(p).tolist() == [2.0, 0.0]


def test_layer_filter_and_explicit_focus(model):
    ov = explain(model, TEXT, token="it", layer=5, to="2")
    assert {r.layer for r in ov.rows} == {5} and len(ov.rows) == 12
    assert ov.focus == 2 and "'dog'" in str(ov.focus_reason)
    n = sum(r.argmax == 2 for r in ov.rows)
    assert ov.focus_reason.spelled({"to": "--to"}).endswith("is on 'dog' (--to)")
    assert sum(ov.highlighted(r) for r in ov.rows) == n


def test_to_dict_is_json_with_every_number(model, hf):
    ov = explain(model, SPLIT, token="pizzeria", words=True, top=2)
    d = json.loads(json.dumps(ov.to_dict(), allow_nan=False))
    assert d["units"] == ov.units.labels and d["unit"] == "pizzeria" and d["words"] is True
    assert d["token_indices"] == list(ov.units.groups[ov.unit]) and len(d["heads"]) == 72
    enc = forward.encode(model, SPLIT)
    rows = list(ov.units.groups[ov.unit])
    ref, tol = reference(hf, enc.ids)
    ref = ref[:, :, rows].mean(2)  # (layers, h, s)
    tol *= max(map(len, ov.units.groups))  # a word's weight sums that many token weights
    for h in d["heads"]:
        want = [float(ref[h["layer"], h["head"], list(g)].sum()) for g in ov.units.groups]
        assert h["weights"] == pytest.approx(want, abs=tol)
        assert h["max_weight"] == pytest.approx(max(want), abs=tol)
        assert want[ov.units.labels.index(h["argmax"])] == pytest.approx(max(want), abs=2 * tol)


@pytest.mark.parametrize("kwargs, message", [
    (dict(token="cat"), "token 'cat' is not a token of the text; the tokens are: 0:[CLS] 1:the"),
    (dict(token="it", to="cat"), "to 'cat' is not a token of the text"),
    (dict(layer=6), "layer 6 is out of range: all-MiniLM-L6-v2 has 6 layers (0–5)"),
    (dict(top=0), "top must be at least 1, got 0"),
    (dict(words=True, token="99"), "token 99 is out of range: the text has 14 words (0–13)"),
])
def test_errors_name_the_arguments(model, kwargs, message):
    with pytest.raises(ValueError) as e:
        explain(model, TEXT, **kwargs)
    assert str(e.value).startswith(message), str(e.value)
