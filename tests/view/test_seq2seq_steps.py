"""The viewer's cross step panel (``/api/cross_steps``) on a transformers encoder-decoder: the
server answers with the step-by-step numbers of one cross-attention head (q = x·W_Q + b from the
decoder's x, k_i from the encoder's memory), as it does for the shipped translation model.
Through the app's routes (Starlette's test client); no browser."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("transformers")  # the qkv[hf] extra
import torch  # noqa: E402

SOURCE = "the cat sat on the mat"


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    from starlette.testclient import TestClient

    from qkv.view.api import Api, Models
    from qkv.view.server import create_app
    from seq2seq_dirs import save

    path, _ = save(tmp_path_factory.mktemp("view_seq2seq"), "t5")
    with TestClient(create_app(Api(Models([path])), hosts=None)) as c:
        yield c, path


def test_cross_steps_answers_for_a_transformers_encoder_decoder(client):
    c, path = client
    r = c.post("/api/cross_steps", json={"model": path, "text": SOURCE, "layer": 1, "head": 0})
    assert r.status_code == 200, r.text
    d = r.json()
    assert d["kind"] == "cross_steps" and d["layer"] == 1 and d["head"] == 0
    s, dh = len(d["source"]), d["head_dim"]
    assert len(d["keys"]) == s and len(d["keys"][0]) == dh and len(d["query"]) == dh
    assert len(d["memory"]) == s and len(d["x"]) == len(d["memory"][0])  # E: the model's width
    assert d["scale"] == 1.0  # T5: no 1/√d
    assert math.isclose(d["weights_sum"], 1.0, abs_tol=1e-12)
    # the recomputation is the forward's to float32's rounding: a few stages (the projections,
    # q·k over d terms, the softmax, Σ w·v over s terms), each off by at most (s + d)·eps of the
    # largest value it handles (tests/hf/test_seq2seq_steps.py derives every stage's bound)
    eps, n = torch.finfo(torch.float32).eps, s + dh
    top = max(1.0, max(abs(v) for row in d["values"] for v in row))
    assert d["max_abs_diff"] <= 4 * n * eps * top
    assert max(abs(a - b) for a, b in zip(d["model_weights"], d["weights"])) <= 4 * n * eps


def test_cross_steps_out_of_range_is_4xx(client):
    c, path = client
    r = c.post("/api/cross_steps", json={"model": path, "text": SOURCE, "layer": 9, "head": 0})
    assert r.status_code == 422 and r.json()["error"]["field"] == "layer"
    assert "Traceback" not in r.text


def test_info_says_the_model_has_head_weights(client):
    c, path = client
    info = c.get("/api/info").json()
    caps = next(m["capabilities"] for m in info["models"] if m["name"] == path)
    assert caps["cross_attention"] and caps["head_weights"] and not caps["self_attention"]
