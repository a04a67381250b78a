"""The registry of mixer kinds: looked up by name, refusing a taken name and naming the known kinds."""

from __future__ import annotations

import pytest

from qkv.errors import QkvError
from qkv.explain.mixers import MIXERS, Mixer, mixer, register_mixer

# The protocol's MixerKind names (models/protocol.py) that have an explanation here: all but
# "softmax", qkv's own attention path.
EXPLAINED = {"gated_deltanet", "kda", "lightning", "mamba2", "mamba1", "short_conv", "mla", "sparse", "differential"}


def test_every_explained_kind_is_registered_and_only_the_linear_ones_are_effective():
    assert set(MIXERS) == EXPLAINED
    assert {k for k, m in MIXERS.items() if m.effective} == {"gated_deltanet", "kda", "lightning", "mamba2", "mamba1", "short_conv"}
    assert all(callable(m.read) and m.summary for m in MIXERS.values())


def test_an_unknown_kind_is_named_with_the_known_ones():
    with pytest.raises(QkvError, match="no explanation for mixer kind 'rwkv'; known: differential, gated_deltanet"):
        mixer("rwkv")


def test_a_taken_name_is_refused():
    with pytest.raises(ValueError, match="'mamba2' is already registered"):
        register_mixer(Mixer("mamba2", MIXERS["mamba2"].read, True, "again"))
