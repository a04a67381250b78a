"""Mamba-2's SSD as a matrix: M·x is the scan's output, M is the scan run on one-hot values.

Tolerances as tests/explain/mixers/test_delta_rule.py: transformers' scan computes in float32
(``.float()``), so its results are compared with M·x and M in float64 by ``assert_within``
against qkv's closed form run in float32 from the same recorded arguments, factor 4 (the scan
sums chunk by chunk and carries states between chunks), plus 2 float32 ulp.
"""

from __future__ import annotations

import sys

import pytest
import torch
from mixer_layers import bamba_mixer, inputs, mamba2_mixer, one_hot_values
from tolerance import assert_agree, assert_within

from qkv.explain.mixers import mamba2
from qkv.explain.mixers.capture import kernel_call

FACTOR = 4.0
LAYERS = {"mamba2": mamba2_mixer, "bamba": bamba_mixer}


def _read(name: str, t: int):
    layer = LAYERS[name]()
    call = kernel_call(layer, mamba2.KERNEL, inputs(t))
    ssm = mamba2.read(layer, inputs(t))
    assert torch.equal(ssm.matrix(0), mamba2.from_call(call).matrix(0))
    return layer, call, ssm, mamba2.from_call(call, torch.float32)


@pytest.mark.parametrize("name", list(LAYERS))
@pytest.mark.parametrize("t", [1, 7, 33])
def test_matrix_times_values_is_the_scans_output(name, t):
    _, _, ssm, low = _read(name, t)
    for h in range(ssm.heads):
        M = ssm.matrix(h)
        assert torch.equal(M.triu(1), torch.zeros_like(M)), "causal: nothing above the diagonal"
        assert_within(ssm.output[:, h].float(), M @ ssm.values(h), low.matrix(h) @ low.values(h), factor=FACTOR,
                      what=f"{name} head {h}: scan output vs M·x")


@pytest.mark.parametrize("name", list(LAYERS))
@pytest.mark.parametrize("t", [7, 33])
def test_matrix_is_the_one_hot_run(name, t):
    """The layer's scan, fed its own Δ, A, B, C, D and one-hot values (chunks of 5: other chunk
    boundaries than the layer's), gives M — the D skip included, on the diagonal."""
    layer, call, ssm, low = _read(name, t)
    scan = getattr(sys.modules[type(layer).__module__], mamba2.KERNEL)
    a = dict(call.arguments, hidden_states=one_hot_values(t, ssm.heads), chunk_size=5, return_final_states=False)
    out = scan(**a)
    for h in range(ssm.heads):
        assert_within(out[0, :, h].float(), ssm.matrix(h), low.matrix(h), factor=FACTOR,
                      what=f"{name} head {h}: one-hot run vs M")


def test_rows_are_the_matrix_rows():
    t = 33
    _, _, ssm, low = _read("mamba2", t)
    for h in range(ssm.heads):
        M = ssm.matrix(h)
        for i in (0, 16, t - 1):
            assert_agree(ssm.row(h, i), M[i], low.row(h, i), what=f"head {h} row {i}")


def test_the_skip_is_the_diagonal_beyond_the_state():
    """With B = 0 nothing enters the state: M = D·I."""
    _, _, ssm, _ = _read("mamba2", 7)
    import dataclasses

    skip = dataclasses.replace(ssm, B=torch.zeros_like(ssm.B))
    assert torch.equal(skip.matrix(1), torch.eye(7, dtype=torch.float64) * ssm.D[1])
