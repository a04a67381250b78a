"""The registry and the library entry points: ``contributions()``, and ``explain``, ``heads``,
``probe`` and ``compare`` ranking by a method."""

from __future__ import annotations

import pytest
import torch

from qkv.explain import explain, heads
from qkv.explain.probes import coref, find_heads
from qkv.explain import contributions as registry
from qkv.explain.contributions import METHODS, check_method, contributions, get_method, shares
from qkv.explain.wording import ArgumentError

TEXT = "The dog found some pizza next to the baby and ate it"


def test_registry_names_and_kinds(capsys):
    from qkv.cli import main

    assert main(["explain", "--help"]) == 0
    help_text = "".join(capsys.readouterr().out.split())  # argparse wraps lines, at hyphens too
    assert f"{','.join(METHODS)}(default{registry.DEFAULT};" in help_text  # read from the registry
    assert METHODS[registry.DEFAULT].raw
    assert {n for n, m in METHODS.items() if m.per == "head"} == {"weight", "norm", "attnlrp"}
    assert all(m.formula and m.cost and m.name == n for n, m in METHODS.items())


def test_unknown_method_lists_the_known_ones():
    with pytest.raises(ArgumentError, match=r"unknown method 'attention'; known methods: weight, "
                                            r"norm, rollout, flow, alti, value-zeroing, grad"):
        get_method("attention")


def test_a_target_text_is_only_for_grad(model):
    with pytest.raises(ArgumentError, match=r"target_text is only read by method grad"):
        check_method(model, "alti", "a text")
    assert check_method(model, "grad", "a text").name == "grad"


def test_shares():
    s = shares(torch.tensor([[2.0, -1.0, 2.0], [0.0, 0.0, 0.0]]))
    assert s.tolist() == [[0.5, 0.0, 0.5], [0.0, 0.0, 0.0]]


@pytest.mark.parametrize("method", ["weight", "norm", "rollout", "alti"])
def test_contributions_json_shape(model, method):
    c = contributions(model, TEXT, token="it", method=method)
    d = c.to_dict()
    assert d["tokens"][d["token_index"]] == "it" and d["method"] == method
    scores = d["scores"]
    assert len(scores) == 6
    if METHODS[method].per == "head":
        assert len(scores[0]) == 12 and len(scores[0][0]) == 14  # [layer][head][key]
    else:
        assert len(scores[0]) == 14 and isinstance(scores[0][0], float)  # [layer][key]
    assert ("layer_scores" in d) == (method == "norm")


def test_weight_method_is_the_overview(model):
    ov = explain(model, TEXT, token="it")
    c = contributions(model, TEXT, token="it", method="weight")
    by_head = {(r.layer, r.head): r.weights for r in ov.rows}
    for (layer, head), row in by_head.items():
        torch.testing.assert_close(row, c.scores[layer, head], atol=0, rtol=0)
    assert ov.to_dict()["scores"] == c.to_dict()["scores"]


def test_explain_by_a_per_layer_method_ranks_layers(model):
    ov = explain(model, TEXT, token="it", method="alti", top=2)
    assert ov.per == "layer" and len(ov.rows) == 6 and all(r.head is None for r in ov.rows)
    last = next(r for r in ov.rows if r.layer == 5)
    assert ov.units.labels[last.argmax] == "pizza"
    d = ov.to_dict()
    assert d["method"] == "alti" and len(d["scores"]) == 6 and len(d["scores"][0]) == 14


def test_heads_by_norm_puts_the_coreference_head_first(model):
    r = heads(model, TEXT, source="it", target="pizza", method="norm")
    assert (r.heads[0].layer, r.heads[0].head) == (3, 1)
    assert r.heads[0].weight > 0.75  # the weight is 0.75; L3 H1's values make it stronger
    assert r.to_dict()["method"] == "norm"


def test_probe_parks_what_compare_parks(model, monkeypatch):
    """The probe's share on [CLS]/[SEP]/punctuation is the comparison's, sentence by sentence."""
    from qkv.explain.contributions.compare import compare

    item = find_heads.ProbeItem(TEXT, "it", "pizza", ())
    monkeypatch.setattr(coref, "load_probe", lambda name: [item])
    result = find_heads.probe(model, method="norm")
    c = compare(model, TEXT, token="it", words=True, top=1)
    # the two trace different rows of an fp32 model (a rows-only trace rounds like its own matmul
    # shapes): shares of a row of ~14 keys, so a few fp32 ulps each
    tol = 16 * torch.finfo(torch.float32).eps
    assert abs(float(result.parked[0]) - c.parked["norm"]) < tol
    assert abs(float(result.parked_weight[0]) - c.parked["weight"]) < tol


def test_probe_by_a_method(model, monkeypatch):
    items = find_heads.load_probe("coref")[:4]
    monkeypatch.setattr(coref, "load_probe", lambda name: items)
    result = find_heads.probe(model, method="rollout")
    assert result.hits.shape == (4, 6, 1) and result.per == "layer"
    d = result.to_dict()
    assert d["method"] == "rollout" and d["heads"][0]["head"] is None
    assert 0 < d["parked"] < 1 and 0 < d["parked_weight"] < 1
    with pytest.raises(ArgumentError, match=r"'grad' does not apply"):
        find_heads.probe(model, method="grad")
