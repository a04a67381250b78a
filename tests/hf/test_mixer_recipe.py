"""docs/architecture.md's mixer recipe, followed once: the EMA mixer of toy_mixer.py (beside this
file) — its kind, its recogniser and its explanation registered here for these tests only — in
layer 0 of a tiny transformers Llama is recognised by the adapter, meets the conformance checks,
and ``attention_map`` draws its exact M, which the layer's own kernel run on one-hot float64
values gives column by column."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")  # the qkv[hf] extra
import torch  # noqa: E402

import qkv.explain as E  # noqa: E402
import qkv.hf  # noqa: E402, F401  — registers "qkv"
import toy_mixer  # noqa: E402
from qkv.explain.mixer_maps import EffectiveMap  # noqa: E402
from qkv.explain.mixers import MIXERS, register_mixer  # noqa: E402
from qkv.hf.adapter import wrap  # noqa: E402
from qkv.hf.mixers import RECOGNISERS, register_recogniser  # noqa: E402
from qkv.models.protocol import MIXER_KINDS, MixerKind, register_mixer_kind  # noqa: E402
from qkv.models.tokenizer import Tokenizer  # noqa: E402
from test_adapter import TEXT, save_tokenizer  # noqa: E402


def _protocol():
    """tests/models/test_protocol.py, for its conformance checks (tests/models is not on the path)."""
    path = Path(__file__).parents[1] / "models" / "test_protocol.py"
    spec = importlib.util.spec_from_file_location("recipe_test_protocol", path)
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def kind():
    """The recipe's steps 1–3, undone after this module's tests."""
    kind = register_mixer_kind(toy_mixer.KIND)  # (1) the kind
    register_recogniser(kind, toy_mixer.recognises)  # (2) how a module is recognised as it
    register_mixer(toy_mixer.MIXER)  # (3) its explanation
    yield kind
    del MIXERS[toy_mixer.KIND], RECOGNISERS[toy_mixer.KIND], MIXER_KINDS[toy_mixer.KIND]


@pytest.fixture(scope="module")
def model(kind, tmp_path_factory):
    """A 2-layer Llama whose layer 0 mixes its tokens by the EMA, wrapped as qkv.load would."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    hf = LlamaForCausalLM._from_config(config, attn_implementation="qkv").eval()
    hf.model.layers[0].self_attn = toy_mixer.EMAMixer(32, 4)
    path = tmp_path_factory.mktemp("ema")
    save_tokenizer(path, encoder=False)
    return wrap(hf, Tokenizer.from_dir(path), name="llama-ema")


def test_a_taken_kind_or_recogniser_is_refused(kind):
    assert MixerKind(toy_mixer.KIND) is kind and not kind.softmax
    with pytest.raises(ValueError, match="mixer kind 'ema' is already registered"):
        register_mixer_kind(toy_mixer.KIND)
    with pytest.raises(ValueError, match="'ema' already has a recogniser"):
        register_recogniser(kind, toy_mixer.recognises)
    with pytest.raises(ValueError, match="'rwkv' is not a mixer kind"):
        register_mixer(toy_mixer.Mixer("rwkv", toy_mixer.read, True, "no such kind"))


def test_the_adapter_recognises_it_and_the_parts_check_numerically(model, kind):
    (mixer,) = model.parts.layers[0].mixers
    assert mixer.kind is kind and isinstance(mixer.module, toy_mixer.EMAMixer)
    assert model.parts.layers[1].mixers[0].kind is MixerKind.SOFTMAX
    _protocol().check_parts(model, torch.tensor([model.tokenizer.encode(TEXT).ids]))


def test_attention_map_is_the_exact_M_of_the_layers_kernel(model):
    """attention_map hands layer 0 to its registered reader: M·v is the kernel's output, and M is
    the kernel itself run on one-hot values in float64 (column j: e_j for token j)."""
    got = E.attention_map(model, TEXT, layer=0, head=2)
    assert isinstance(got, EffectiveMap) and got.mixer == toy_mixer.KIND
    t = len(got.units.labels)
    a = torch.sigmoid(model.parts.layers[0].mixers[0].module.ema_logit.detach()).double()  # (h,) as the kernel got them
    basis = torch.eye(t, dtype=torch.float64)[None, :, None, :].expand(1, t, 4, t)  # (1, t, h, t) e_j
    want = toy_mixer.ema_scan(basis, a)[0, :, 2, :]  # (t, t) column j = the average of e_j
    # the same sums in another order: each entry is ≤ t products and sums of numbers ≤ 1
    assert float((got.weights - want).abs().max()) <= 4 * t * torch.finfo(torch.float64).eps
    assert torch.equal(got.weights.triu(1), torch.zeros(t, t, dtype=torch.float64))
    # M·v against the float32 forward's own kernel output: its rounding, checked by mixer_map
    assert got.error <= 64 * t * torch.finfo(torch.float32).eps
