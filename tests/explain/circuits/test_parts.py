"""`parts_of`: a model's parts read once, read again when its layers change."""

from __future__ import annotations

import doctest

import torch

import qkv
import qkv.explain.circuits.parts
from qkv.explain.circuits.parts import parts_of
from qkv.models.llama import LlamaConfig, LlamaModel


def _tiny() -> LlamaModel:
    torch.manual_seed(0)
    return LlamaModel(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=24,
                                  num_hidden_layers=2, num_attention_heads=2)).eval()


def test_parts_are_the_models_and_kept():
    model = _tiny()
    kept = parts_of(model)
    assert kept is parts_of(model)
    assert [p.mixers[0].module for p in kept.layers] == [p.mixers[0].module for p in model.parts.layers]


def test_a_swapped_layer_is_read_again():
    model, other = _tiny(), _tiny()
    before = parts_of(model)
    model.decoder.layers[1] = other.decoder.layers[1]
    after = parts_of(model)
    assert after is not before and after.layers[1].mixers[0].module is other.decoder.layers[1].self_attn


def test_doctests():
    assert doctest.testmod(qkv.explain.circuits.parts).failed == 0
