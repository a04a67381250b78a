"""`qkv explain --layer L --head H` on a layer whose mixer adds steps of its own (issue 39):
an indexed (sparse) layer prints its indexer's scores, the kept keys, the weights and each
left-out key's miss margin after the head's steps; `qkv show indexed` gives the same alone and
its JSON is the library's `to_dict()`."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")  # the qkv[hf] extra
import qkv  # noqa: E402
from hybrids import save_hybrid  # noqa: E402
from qkv.cli import main  # noqa: E402
from qkv.explain.mixers.sparse import indexed  # noqa: E402

TEXT = "the cat sat on the mat . a red dog"


@pytest.fixture(scope="module")
def sparse_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("deepseek_v32")
    save_hybrid("deepseek_v32", path)
    return path


def test_explain_on_an_indexed_layer_prints_the_indexer(sparse_dir, capsys):
    assert main(["explain", TEXT, "--model", str(sparse_dir), "--layer", "1", "--head", "2"]) == 0
    out = capsys.readouterr().out
    want = indexed(qkv.load(sparse_dir), TEXT, layer=1, head=2, token=9)
    assert "4) output = Σ_j w_j v_j" in out  # the head's steps first
    assert f"keeps the top {want.topk}" in out and f"the cut: the lowest kept score, {want.row.cutoff:.6g}" in out
    rows = [line.split() for line in out.splitlines()[out.splitlines().index(next(
        line for line in out.splitlines() if line.startswith("j   token   index score"))) + 2:][:10]]
    for j, (cells, missed) in enumerate(zip(rows, want.missed())):
        assert cells[0] == str(j) and float(cells[2]) == pytest.approx(float(want.row.scores[j]), abs=1e-6)
        assert (cells[3] == "✓") == (missed is None)
        if missed:
            assert float(cells[-1]) == pytest.approx(missed, rel=1e-3)


def test_show_indexed_json_is_the_librarys(sparse_dir, capsys):
    assert main(["show", "indexed", TEXT, "--model", str(sparse_dir), "--layer", "2", "--head", "0",
                 "--token", "6", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got == json.loads(json.dumps(indexed(qkv.load(sparse_dir), TEXT, layer=2, head=0, token=6).to_dict()))


def test_a_layer_without_an_indexer_is_one_line(capsys):
    assert main(["show", "indexed", TEXT, "--layer", "1", "--head", "0"]) != 0
    err = capsys.readouterr().err
    assert err.startswith("qkv: error: ") and "layer 1 of all-MiniLM-L6-v2 has no indexer" in err and err.count("\n") == 1


@pytest.fixture(scope="module")
def gated_dir(tmp_path_factory):
    from closed_gate import save_gated

    path = tmp_path_factory.mktemp("qwen3_5_closed")
    save_gated(path, close=True)
    return path


def test_explain_on_a_gated_layer_prints_the_gate_as_a_step(gated_dir, capsys):
    from closed_gate import HEAD, LAYER

    from qkv.explain.mixers.gate import gated_head

    assert main(["explain", TEXT, "--model", str(gated_dir), "--layer", str(LAYER), "--head", str(HEAD)]) == 0
    out = capsys.readouterr().out
    want = gated_head(qkv.load(gated_dir), TEXT, layer=LAYER, head=HEAD)
    assert out.index("4) output = Σ_j w_j v_j") < out.index(f"output gate · layer {LAYER}, head {HEAD}")
    assert want.verdict() in out and "closed: this head contributes little here" in out
    assert main(["show", "gate", TEXT, "--model", str(gated_dir), "--layer", str(LAYER), "--head", str(HEAD),
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(want.to_dict()))
    # a layer without a gate (MiniLM's) is refused in one line; explain on it prints no gate
    assert main(["show", "gate", TEXT, "--layer", "1", "--head", "0"]) != 0
    assert "has no output gate" in capsys.readouterr().err
