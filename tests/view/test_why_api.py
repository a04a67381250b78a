"""``/api/why`` (the "why this weight" panel's endpoint): the library's ScoreAttribution, and bad
input as a 4xx JSON error naming the field in one line — over HTTP, and on a model whose residual
stream qkv cannot split (a parallel residual), refused by name as the model's fault."""

from __future__ import annotations

import httpx
import pytest
import torch
from view_checks import DECODER, TEXT

from qkv.explain import score_attribution
from qkv.view.answers import labelled
from qkv.view.api import Api, ApiError, Models

GOOD = {"text": TEXT, "token": 12, "key": 5, "layer": 3, "head": 1}


def post(served, body: dict) -> httpx.Response:
    return httpx.post(served.url + "api/why", json=body, timeout=120)


def test_the_answer_is_the_librarys(served, model):
    r = post(served, GOOD | {"key": "pizza"})
    assert r.status_code == 200
    want = score_attribution(model, TEXT, layer=3, head=1, token=12, key="pizza").to_dict()
    assert r.json() == labelled(want)  # the to_dict(), its tokens' display labels beside them


@pytest.mark.parametrize("change, status, field, says", [
    ({"key": None}, 422, "key", "key is required"),
    ({"key": "zzz"}, 422, "key", "key 'zzz' is not a token of the text"),
    ({"key": -1}, 422, "key", "key -1 is out of range"),
    ({"key": True}, 422, "key", "key must be a string, got bool"),
    ({"key": "x" * 101}, 413, "key", "key is 101 characters; the limit is 100"),
    ({"layer": 6}, 422, "layer", "layer 6 is out of range"),
    ({"head": "1"}, 422, "head", "head must be an integer"),
    ({"words": True}, 422, "words", "unknown field 'words' for why"),
    ({"model": DECODER, "text": "the dog ate it", "token": 1, "key": 3, "layer": 1, "head": 0},
     422, "key", "key '3' (position 3) is masked for the query at 1"),  # a causal head never scores it
    ({"model": "translate", "text": "the red apple"}, 422, "model", "has no self-attention"),
])
def test_bad_input_is_one_line_naming_the_field(served, change, status, field, says):
    body = {k: v for k, v in (GOOD | change).items() if v is not None}
    r = post(served, body)
    error = r.json()["error"]
    assert (r.status_code, error["field"]) == (status, field), error
    assert says in error["message"] and "\n" not in error["message"], error


@pytest.fixture(scope="module")
def parallel(model):
    """A random 2-layer GPT-NeoX with its parallel residual (x + attn(norm1 x) + ff(norm3 x)),
    reading MiniLM's tokenizer."""
    from qkv.models.gpt_neox import GPTNeoXConfig, GPTNeoXModel

    torch.manual_seed(0)
    config = GPTNeoXConfig(vocab_size=model.tokenizer.vocab_size, hidden_size=32,
                           intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                           max_position_embeddings=64)
    return GPTNeoXModel(config, tokenizer=model.tokenizer, name="tiny-neox").eval()


def test_a_model_that_cannot_be_split_is_refused_by_its_reason(parallel):
    api = Api(Models(["tiny-neox"], loader=lambda name: parallel))
    with pytest.raises(ApiError) as e:
        api.handle("why", {"text": "the dog ate it", "token": 3, "key": 1, "layer": 1, "head": 0})
    assert (e.value.status, e.value.field) == (422, "model")
    assert e.value.message.startswith("tiny-neox: layer 0 (ParallelResidualLayer) does not form "
                                      "x + attn before its feed-forward")
    assert "\n" not in e.value.message


def test_a_byte_level_models_tokens_come_with_their_labels():
    """Issue 41: the page shows ``labels`` (display_token), never a raw "Ġ"/"Ċ" token."""
    import qkv
    from qkv.models.tokenizer import display_token

    api = Api(Models(["reader"], loader=lambda name: qkv.load("reader")))
    text = "The dog ate the pizza.\nIt was good"
    for endpoint, body in (("steps", {"layer": 1, "head": 0}), ("why", {"layer": 1, "head": 0, "key": "pizza"})):
        a = api.handle(endpoint, {"text": text, **body})
        assert any(t.startswith("Ġ") for t in a["tokens"]) and "Ċ" in a["tokens"]
        assert a["labels"] == [display_token(t) for t in a["tokens"]]
        assert not any("Ġ" in t or "Ċ" in t for t in a["labels"]) and "↵" in a["labels"]
