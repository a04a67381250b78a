"""A model that computes NaN is refused by every endpoint — probes included — as ``explain``
refuses it: a 422 naming the model field and the first layer and head, never a 500."""

from __future__ import annotations

import copy

import pytest
import torch
from view_checks import TEXT, tiny_decoder

import qkv
from qkv.view.api import Api, ApiError, Models

# one head's answers ask for the NaN head's layer: an explanation of an earlier layer never runs
# the layers after it (issue 42), so it is finite and exact there
CALLS = [("bad", "overview", {}), ("bad", "steps", {"layer": 2, "head": 1}),
         ("bad", "map", {"layer": 2, "head": 1}), ("bad", "maps", {}),
         ("bad", "received", {"layer": 2, "head": 1}), ("bad", "probe", {}),
         ("decoder", "probe", {}), ("decoder", "overview", {}),
         ("translation", "cross", {"text": "the red apple"}),
         ("translation", "cross_steps", {"text": "the red apple", "layer": 0, "head": 0})]
WHERE = {"bad": "layer 2, head 1", "decoder": "layer 1, head 0", "translation": "decoder layer 1, head 0"}


@pytest.fixture(scope="module")
def api(model):
    bad, decoder, translation = copy.deepcopy(model), tiny_decoder(model), qkv.load("translate")
    d = bad.layers[2].self_attn.head_dim
    with torch.no_grad():  # one head's queries NaN: the first non-finite weights are that head's
        bad.layers[2].self_attn.q_proj.weight[d:2 * d] = float("nan")
        decoder.layers[1].self_attn.q_proj.weight[:] = float("nan")
        translation.decoder.layers[1].cross_attn.q_proj.weight[:] = float("nan")
    models = {"bad": bad, "decoder": decoder, "translation": translation}
    return Api(Models(list(models), loader=models.__getitem__))


@pytest.mark.parametrize("name, endpoint, fields", CALLS, ids=[f"{c[0]}-{c[1]}" for c in CALLS])
def test_every_endpoint_refuses_a_nan_model_naming_layer_and_head(api, name, endpoint, fields):
    body = {"model": name, **({} if endpoint == "probe" else {"text": TEXT}), **fields}
    with pytest.raises(ApiError) as e:
        api.answer(endpoint, body)
    assert e.value.status == 422 and e.value.field == "model"
    assert f"computes NaN at {WHERE[name]}" in e.value.message, e.value.message


@pytest.mark.parametrize("name", ["induction", "previous-token", "coref"])
def test_every_probe_refuses_it_in_the_library(api, name):
    from qkv.explain import probe
    from qkv.explain.finite import NonFiniteError

    model = api.models.get("decoder" if name != "coref" else "bad")
    with pytest.raises(NonFiniteError, match=f"computes NaN at {WHERE['decoder' if name != 'coref' else 'bad']}"):
        probe(model, name)
