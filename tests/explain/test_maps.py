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
    torch.testing.assert_close(m.weights, ref[layer, head], atol=tol, rtol=0)


def test_word_map_sums_into_and_averages_from_a_word(model, reference):
    m = attention_map(model, TEXT, layer=2, head=3, words=True)
    (reference, tol), groups = reference, m.units.groups
    assert "pizzeria" in m.units.labels and m.weights.shape == (len(groups), len(groups))
    want = torch.tensor([[float(reference[2, 3][list(a)][:, list(b)].sum(-1).mean()) for b in groups]
                         for a in groups], dtype=torch.float64)
    # into a word: the sum of up to max|g| token weights, each within tol (averaging rows keeps it)
    torch.testing.assert_close(m.weights, want, atol=tol * max(map(len, groups)), rtol=0)
    d = json.loads(json.dumps(m.to_dict(), allow_nan=False))
    assert d["units"] == m.units.labels and d["weights"] == m.weights.tolist()


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
