"""The API of ``qkv view --file``: the ``document`` rows of qkv.explain.kinds answer from the served
Document — the same float32 numbers, byte for byte — and refuse bad fields by name."""

from __future__ import annotations

import base64
import json

import pytest
import torch

from qkv.view.api import Api, ApiError, Models


def floats(b64: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(b64)), dtype=torch.float32)


@pytest.fixture(scope="module")
def api(long_document):
    return Api(Models(["long"], loader=lambda name: long_document.model), document=long_document)


def test_answers_are_the_documents_numbers(api, long_document):
    doc, n = long_document, len(long_document)
    info = json.loads(json.dumps(api.info()))["document"]
    assert info["num_tokens"] == n and info["units"] == doc.explain().units.labels
    ov = api.handle("doc_overview", {"token": 40})
    want = doc.explain(token="40")
    assert ov["kind"] == "document-overview" and ov["token_index"] == 40 and "text" not in ov
    assert [(r["layer"], r["head"]) for r in ov["heads"]] == [(r.layer, r.head) for r in want.rows]
    assert torch.equal(floats(ov["weights"]).view(ov["shape"]), torch.stack([r.weights for r in want.rows]).float())
    tiles = api.handle("doc_block_map", {"layer": 1, "head": 3, "block": 256})
    assert torch.equal(floats(tiles["tiles"]).view(tiles["shape"]), doc.block_map(1, 3, block=256))
    rows = api.handle("doc_rows", {"layer": 0, "head": 1, "start": 100, "stop": 228, "key_start": 50,
                                   "key_stop": 300})
    assert torch.equal(floats(rows["weights"]).view(rows["shape"]),
                       doc.weights(0, 1, torch.arange(100, 228))[:, 50:300])
    got = api.handle("doc_received", {"layer": 1, "head": 0})
    assert torch.equal(floats(got["received"]), doc.received(1, 0))
    assert [(t["index"], t["received"]) for t in got["top"]] == doc.top_received(1, 0, k=10)


@pytest.mark.parametrize("endpoint, body, field", [
    ("doc_rows", {"layer": 0, "head": 0, "start": 9, "stop": 3}, "rows"),
    ("doc_rows", {"layer": 0, "head": 0, "start": 0, "stop": 2000}, "rows"),  # over MAX_ROWS
    ("doc_rows", {"layer": 0, "head": 0}, "start"),
    ("doc_block_map", {"layer": 5, "head": 0}, "layer"),
    ("doc_block_map", {"layer": 0, "head": 0, "block": 2}, "block"),  # 1,500 tiles a side
    ("doc_block_map", {"layer": 0, "head": 0, "block": 2147483647}, "block"),  # issue 31: 17 GB
    ("doc_block_map", {"layer": 0, "head": 0, "block": 0}, "block"),
    ("doc_rows", {"layer": 0, "head": 0, "start": 0, "stop": 4, "key_start": 0, "key_stop": 2**31 - 1}, "keys"),
    ("doc_overview", {"text": "the cat"}, "text"),
    ("doc_overview", {"method": "alti"}, "method"),
    ("doc_overview", {"token": 99999}, "token"),
])
def test_bad_fields_are_named(api, endpoint, body, field):
    with pytest.raises(ApiError) as e:
        api.handle(endpoint, body)
    assert e.value.field == field and 400 <= e.value.status < 500


def test_a_server_without_a_document_refuses(model):
    with pytest.raises(ApiError) as e:
        Api(Models(["minilm"], loader=lambda name: model)).handle("doc_overview", {})
    assert e.value.status == 404 and "qkv view --file" in e.value.message
