"""One head's whole map is the forward's: equal to Hugging Face's attention map, regrouped into
words by the documented rule."""

import json

import pytest
import torch
from explain_peers import reference as peer_reference

import qkv
from qkv.explain import attention_map

TEXT = "The pizzeria's owner found it"


@pytest.fixture(scope="module")
def model():
    return qkv.load("minilm")


@pytest.fixture(scope="module")
def reference(model, hf):
    """(float64 peer weights (layers, h, t, s), the derived bound on qkv's against them)."""
    return peer_reference(hf, model.tokenizer.encode(TEXT).ids)


@pytest.mark.parametrize("layer, head", [(0, 0), (4, 7), (5, 11)])
def test_token_map_equals_hugging_face(model, reference, layer, head):
    m = attention_map(model, TEXT, layer=layer, head=head)
    assert m.units.labels == model.tokenizer.encode(TEXT).tokens and not m.units.words
    ref, tol = reference
    assert m.weights.dtype == torch.float32  # the dtype the attention computed in
    torch.testing.assert_close(m.weights.double(), ref[layer, head], atol=tol, rtol=0)


def test_word_map_sums_into_and_averages_from_a_word(model, reference):
    m = attention_map(model, TEXT, layer=2, head=3, words=True)
    (reference, tol), groups = reference, m.units.groups
    assert "pizzeria" in m.units.labels and m.weights.shape == (len(groups), len(groups))
    want = torch.tensor([[float(reference[2, 3][list(a)][:, list(b)].sum(-1).mean()) for b in groups]
                         for a in groups], dtype=torch.float64)
    # into a word: the sum of up to max|g| token weights, each within tol (averaging rows keeps it)
    torch.testing.assert_close(m.weights.double(), want, atol=tol * max(map(len, groups)), rtol=0)
    d = json.loads(json.dumps(m.to_dict(), allow_nan=False))
    assert d["units"] == m.units.labels and d["weights"] == m.weights.tolist()


def test_one_layer_is_that_layer_of_every_layer(model, reference):
    """attention_maps(layer=L): the heads of layer L, equal (bit for bit) to the whole forward's
    and to each head's attention_map."""
    from qkv.explain import attention_maps

    every, one = attention_maps(model, TEXT), attention_maps(model, TEXT, layer=4)
    assert one.layer == 4 and one.weights.shape == (1, 12, *every.weights.shape[-2:])
    assert torch.equal(one.weights[0], every.weights[4])
    assert torch.equal(one.head(4, 7).weights, attention_map(model, TEXT, layer=4, head=7).weights)
    ref, tol = reference
    torch.testing.assert_close(one.weights[0].double(), ref[4], atol=tol, rtol=0)
    assert json.loads(json.dumps(one.to_dict()))["layer"] == 4
    with pytest.raises(ValueError, match="^layer 3 is not among these maps' layers"):
        one.head(3, 0)
    with pytest.raises(ValueError, match="^layer 6 is out of range"):
        attention_maps(model, TEXT, layer=6)


def test_the_forward_stops_after_the_layer_asked_for():
    """Layers after the one asked for never run: NaN weights there leave the map finite (and
    equal to the intact model's), while a layer at or before it is named."""
    m = qkv.load("minilm")
    want = attention_map(m, TEXT, layer=2, head=5).weights
    with torch.no_grad():
        m.layers[3].self_attn.q_proj.weight.fill_(float("nan"))
    assert torch.equal(attention_map(m, TEXT, layer=2, head=5).weights, want)
    with pytest.raises(ValueError, match="not finite"):
        attention_map(m, TEXT, layer=3, head=0)


def test_errors_name_the_arguments(model):
    with pytest.raises(ValueError, match="^head 12 is out of range"):
        attention_map(model, TEXT, layer=0, head=12)
    with pytest.raises(ValueError, match="^layer 6 is out of range"):
        attention_map(model, TEXT, layer=6, head=0)


def test_every_result_kind_says_its_kind_in_to_dict(model):
    """The table of result kinds is keyed by what to_dict() says, for every result with a panel."""
    from qkv.explain import attention_maps, explain, explain_head
    from qkv.explain.kinds import KINDS, kind_of
    from qkv.explain.received import attention_received

    for result in (explain(model, TEXT), explain_head(model, TEXT, layer=0, head=0),
                   attention_map(model, TEXT, layer=0, head=0), attention_maps(model, TEXT),
                   attention_received(model, TEXT, layer=0, head=0)):
        d = result.to_dict()
        assert d["kind"] == result.kind and kind_of(result) is KINDS[d["kind"]]
        assert json.loads(json.dumps(d, allow_nan=False)) == d
    with pytest.raises(ValueError, match="^result must be a qkv.explain result"):
        kind_of(object())
