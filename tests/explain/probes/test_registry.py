"""The probe registry (qkv.explain.probes.registry): a probe added in one file runs through
``probe``, ``head_effects`` and ``faithfulness`` like the shipped ones, and no code in src/
compares a probe's name."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest
import torch

import qkv
from qkv.explain import PROBES, faithfulness, head_effects, probe, register_probe
from qkv.explain.causal.head_effects import probes_for
from qkv.explain.probes.induction import attention_on, repeated_random_tokens
from qkv.explain.probes.registry import default_probe
from qkv.explain.wording import ArgumentError

SRC = Path(__file__).resolve().parents[3] / "src"


@pytest.fixture(scope="module")
def lm():
    return qkv.load("lm")  # the shipped 2-layer, 2-head decoder


@pytest.fixture
def duplicate_token():
    """The example probe (duplicate_token.py, beside this file), registered for one test."""
    spec = importlib.util.spec_from_file_location("duplicate_token", Path(__file__).with_name("duplicate_token.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield register_probe(module.PROBE)
    del PROBES[module.PROBE.name]


def test_the_shipped_probes_and_their_defaults(lm):
    assert list(PROBES) == ["coref", "induction", "previous-token", "retrieval"]
    assert default_probe(lm) == "induction" and default_probe(qkv.load("minilm")) == "coref"
    with pytest.raises(ValueError, match="probe 'coref' is already registered"):
        register_probe(PROBES["coref"])
    with pytest.raises(ValueError, match="must be a qkv.explain.probes.base.Probe"):
        register_probe("coref")
    with pytest.raises(ArgumentError, match="unknown probe 'copying'; known probes: coref, induction"):
        probe(lm, "copying")


def test_a_probe_in_one_file_runs_everywhere(lm, duplicate_token):
    # probe(): its pattern read off the forward's weights, by hand
    got = probe(lm, "duplicate-token")
    n = got.length
    ids = repeated_random_tokens(lm, sequences=got.sequences, length=n, seed=0)
    q = torch.arange(ids.shape[1] - n, ids.shape[1])
    by_hand = torch.stack([w[:, :, q, q - n].double().mean((0, 2)) for w in attention_on(lm, ids)])
    assert got.probe == "duplicate-token" and torch.equal(got.scores, by_hand)
    with pytest.raises(ArgumentError, match="method norm does not apply to the duplicate-token probe"):
        probe(lm, "duplicate-token", method="norm")
    # head_effects: the same sequences and loss as induction's, so the same effects to the bit
    mine = head_effects(lm, "duplicate-token", sequences=2)
    assert torch.equal(mine.effects, head_effects(lm, "induction", sequences=2).effects)
    assert mine.probe == "duplicate-token" and mine.metric == duplicate_token.effects.metric
    # faithfulness: the weights' scores on the ablated sequences, against those effects
    f = faithfulness(lm, "duplicate-token", methods=["weight"], sequences=2)
    assert f.scores["weight"].shape == (2, 2) and -1.0 <= f.spearman["weight"] <= 1.0
    # the viewer's list, and an encoder told what applies instead
    assert "duplicate-token" in probes_for(lm)
    with pytest.raises(ArgumentError, match="probe duplicate-token measures next-token loss; "
                                            "all-MiniLM-L6-v2 is an encoder .*: use coref$"):
        head_effects(qkv.load("minilm"), "duplicate-token")


def test_retrieval_has_effects_but_no_method_scores(lm):
    with pytest.raises(ArgumentError, match="probe retrieval: no contribution method scores its heads"):
        faithfulness(lm, "retrieval", sequences=1)


def test_no_code_compares_probe_names():
    """A probe's name is looked up in the registry, never compared: ``name == "induction"`` or
    ``name in ("coref", …)`` anywhere in src/ is the branch the registry replaced."""
    names = set(PROBES)
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Compare):
                continue
            for side in (node.left, *node.comparators):
                items = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
                if any(isinstance(x, ast.Constant) and x.value in names for x in items):
                    found.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert found == []
