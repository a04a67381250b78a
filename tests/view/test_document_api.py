"""The API of ``qkv view --file``: the ``document`` rows of qkv.explain.kinds answer from the served
Document — the same float32 numbers, byte for byte — and refuse bad fields by name."""

from __future__ import annotations

import base64
import json

import pytest
import torch

from qkv.explain.long.document_heads import head_spans
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
    ("doc_spans", {"first": 0}, "first"),
    ("doc_spans", {"first": 99999}, "first"),
    ("doc_spans", {"first": True}, "first"),
])
def test_bad_fields_are_named(api, endpoint, body, field):
    with pytest.raises(ApiError) as e:
        api.handle(endpoint, body)
    assert e.value.field == field and 400 <= e.value.status < 500


def test_a_server_without_a_document_refuses(model):
    with pytest.raises(ApiError) as e:
        Api(Models(["minilm"], loader=lambda name: model)).handle("doc_overview", {})
    assert e.value.status == 404 and "qkv view --file" in e.value.message


def test_sinks_and_spans_are_head_spans(api, long_document):
    got = api.handle("doc_spans", {})
    assert got == head_spans(long_document).to_dict() and got["first"] == 1
    assert api.handle("doc_spans", {"first": 3}) == head_spans(long_document, first=3).to_dict()


def test_sinks_and_spans_against_the_definition():
    """doc_spans on a short text against both definitions in float64 on the dense weights of the
    model's own forward (the lm run in float64): S = mean_i Σ_{j<first} w_ij, D = mean_i Σ_j w_ij (i − j).
    Bound: twice the float32 forward's own error, plus the float32 lse's (|lse|·eps/2 on each
    weight: S moves by at most that, D by that times N − 1), plus rounding of the result."""
    import qkv
    from qkv.explain.long.document import document
    from qkv.explain.maps import attention_maps

    text = "baka bela dima fona gisa baka bela dima fona gisa doma feta"
    lm, lm64 = qkv.load("lm"), qkv.load("lm", dtype=torch.float64)
    doc = document(lm, text)
    n, first = len(doc), 2
    got = Api(Models(["lm"], loader=lambda name: lm), document=doc).handle("doc_spans", {"first": first})
    eps = torch.finfo(torch.float32).eps
    lse = max(float(rec.lse.abs().max()) for rec in doc.layers)

    def definitions(weights):
        w, i = weights.double(), torch.arange(n, dtype=torch.float64)
        return {"sink": w[..., :first].sum(-1).mean(-1),
                "distance": (w * (i[:, None] - i[None, :])).sum(-1).mean(-1)}

    ref, plain = definitions(attention_maps(lm64, text).weights), definitions(attention_maps(lm, text).weights)
    for metric, span in (("sink", 1.0), ("distance", n - 1.0)):
        shown = torch.tensor([[h[metric] for h in got["heads"] if h["layer"] == layer]
                              for layer in range(ref[metric].shape[0])], dtype=torch.float64)
        allowed = (2 * float((plain[metric] - ref[metric]).abs().max()) + lse * eps * span
                   + 2 * eps * float(ref[metric].abs().max()))
        assert float((shown - ref[metric]).abs().max()) <= allowed, metric
    assert all(h["rows"] == n for h in got["heads"])
