"""docs/architecture.md's family recipe, followed once: the toy family (toy_family.py, beside this
file) registered for these tests loads through ``qkv.load``, meets the protocol (the conformance
checks of test_protocol.py, run on it), and ``attention_map`` / ``explain_head`` work on it with
the full step-by-step (x·W_Q → RoPE → q) equal to the forward's."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

import qkv
import qkv.explain as E
from qkv.models import FAMILIES, register_family

TEXT = "a dog saw the red apple and the dog ate the apple"
WORDS = sorted(set(TEXT.split()) | {"cat", "sat", "on", "mat"})  # and test_protocol.TEXT's


def beside(name: str):
    """The module `name`.py beside this file (tests/models is not on the path)."""
    spec = importlib.util.spec_from_file_location(f"recipe_{name}", Path(__file__).with_name(f"{name}.py"))
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # dataclasses look it up
    spec.loader.exec_module(module)
    return module


toy = beside("toy_family")
protocol = beside("test_protocol")  # its conformance checks, not a copy of them


@pytest.fixture(scope="module")
def toy_dir(tmp_path_factory):
    """A toy checkpoint directory, its family registered for this module's tests only."""
    register_family(toy.MODEL_TYPE, toy.FAMILY)
    path = tmp_path_factory.mktemp("toy")
    toy.save(str(path), toy.ToyConfig(), WORDS)
    yield str(path)
    del FAMILIES[toy.MODEL_TYPE]


def test_the_family_loads_natively_and_runs(toy_dir):
    model = qkv.load(toy_dir)
    assert isinstance(model, toy.ToyModel)
    ids = torch.tensor([model.tokenizer.encode(TEXT).ids])
    out = model(ids)
    assert out.logits.shape == (1, ids.shape[1], toy.ToyConfig.vocab_size)
    assert model.generate(ids, max_new_tokens=3).shape == (1, ids.shape[1] + 3)
    with pytest.raises(ValueError, match="model family 'qkv-toy' is already registered"):
        register_family(toy.MODEL_TYPE, toy.FAMILY)


def test_the_family_meets_the_protocol(toy_dir):
    model = qkv.load(toy_dir)
    assert model.capabilities.self_attention and model.capabilities.next_token
    protocol.check_self_attention(model)  # on test_protocol's own text
    protocol.check_parts(model, torch.tensor([model.tokenizer.encode(TEXT).ids]))


def test_explanations_run_on_it_step_by_step(toy_dir):
    model = qkv.load(toy_dir, dtype=torch.float64)
    m = E.attention_map(model, TEXT, layer=1, head=3)
    t = len(m.units.labels)
    assert m.weights.shape == (t, t) and torch.allclose(m.weights.sum(-1).double(), torch.ones(t, dtype=torch.float64))
    st = E.explain_head(model, TEXT, token="apple", layer=1, head=3)
    assert st.projection == "" and "RoPE" in st.qk_transform
    for stage, diff in st.diffs.items():  # float64 recomputation against the float64 forward
        assert diff <= 64 * torch.finfo(torch.float64).eps * max(1.0, float(getattr(st, stage).abs().max())), stage
