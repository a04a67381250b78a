"""Mamba-1's selective scan as a matrix per channel: M·x is the scan's output, M is the scan run
on one-hot values.

Tolerances as tests/explain/mixers/test_mamba2.py: transformers' scan rounds B, C's product and
x to float32 (``.float()``) and A is ``-exp(A_log.float())``, so its results are compared with
M·x and M in float64 by ``assert_within`` against qkv's closed form run in float32 from the same
recorded arguments, factor 4 (the scan carries its state token by token; the closed form sums
decayed products: the same roundings in another order), plus 2 float32 ulp.
"""

from __future__ import annotations

import sys

import pytest
import torch
import torch.nn.functional as F
from mixer_layers import HIDDEN, NO_TOKENS, inputs
from tolerance import assert_agree, assert_within

from qkv.explain.mixers import mamba1, mamba2
from qkv.explain.mixers.capture import kernel_call

FACTOR = 4.0


def jamba_mixer(seed: int = 0) -> torch.nn.Module:
    """A Jamba Mamba-1 mixer: 64 inner channels, state 8, conv of 4, float64, eval."""
    from transformers import JambaConfig
    from transformers.models.jamba.modeling_jamba import JambaMambaMixer

    torch.manual_seed(seed)
    cfg = JambaConfig(vocab_size=64, hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, intermediate_size=64, mamba_d_state=8, mamba_d_conv=4,
                      mamba_expand=2, use_mamba_kernels=False, **NO_TOKENS)
    layer = JambaMambaMixer(cfg, 0)
    with torch.no_grad():  # Δ of 0.01-0.5 (nn.Linear's bias gives ~0.7; with A to −8 little would outlast a token)
        layer.dt_proj.bias.copy_(torch.log(torch.expm1(torch.empty(layer.intermediate_size).uniform_(0.01, 0.5))))
    return layer.double().eval()


def _read(t: int):
    layer = jamba_mixer()
    call = kernel_call(layer, mamba1.KERNEL, inputs(t))
    ssm = mamba2.read(layer, inputs(t))  # the mamba2 kind's reader hands a Mamba-1 layer over
    assert isinstance(ssm, mamba1.SelectiveScan)
    scan = getattr(sys.modules[type(layer).__module__], mamba1.KERNEL)
    ungated = scan(**{**call.arguments, "z": None})
    low = mamba1.from_call(call, torch.float32, ungated=ungated)
    return layer, call, ssm, low


@pytest.mark.parametrize("t", [1, 7, 33])
def test_matrix_times_values_is_the_scans_output(t):
    layer, call, ssm, low = _read(t)
    assert ssm.heads == layer.intermediate_size and ssm.output.shape == (t, ssm.heads, 1)
    ungated = ssm.output[:, :, 0].T[None]  # (1, d, t): the record's output, gated as the layer does
    assert torch.equal(ungated * F.silu(call.arguments["z"]), call.result)
    for c in range(ssm.heads):
        M = ssm.matrix(c)
        assert torch.equal(M.triu(1), torch.zeros_like(M)), "causal: nothing above the diagonal"
        assert_within(ssm.output[:, c].float(), M @ ssm.values(c), low.matrix(c) @ low.values(c), factor=FACTOR,
                      what=f"channel {c}: scan output vs M·x")


@pytest.mark.parametrize("t", [1, 7, 33])
def test_matrix_is_the_one_hot_run(t):
    """The layer's scan, fed its own Δ, A, B, C, D and, for every channel at once, the j-th
    one-hot vector as the values (the batch holds one text per j), gives column j of M."""
    layer, call, ssm, low = _read(t)
    scan = getattr(sys.modules[type(layer).__module__], mamba1.KERNEL)
    a = call.arguments
    d = ssm.heads
    eye = torch.eye(t, dtype=torch.float64)[:, None, :].expand(t, d, t).contiguous()  # (t texts, d, t)
    batch = lambda v: v.expand(t, *v.shape[1:]).contiguous()  # noqa: E731
    out = scan(eye, batch(a["dt"]), a["A"], batch(a["B"]), batch(a["C"]), D=a["D"], z=None,
               delta_bias=a["delta_bias"], delta_softplus=a["delta_softplus"])  # (t columns j, d, t rows)
    for c in range(d):
        assert_within(out[:, c].T.float(), ssm.matrix(c), low.matrix(c), factor=FACTOR,
                      what=f"channel {c}: one-hot run vs M")


def test_rows_are_the_matrix_rows():
    t = 33
    _, _, ssm, low = _read(t)
    for c in (0, 17, ssm.heads - 1):
        M = ssm.matrix(c)
        for i in (0, 16, t - 1):
            assert_agree(ssm.row(c, i), M[i], low.row(c, i), what=f"channel {c} row {i}")


def test_the_skip_is_the_diagonal_beyond_the_state():
    """With B = 0 nothing enters the state: M = D·I."""
    import dataclasses

    _, _, ssm, _ = _read(7)
    skip = dataclasses.replace(ssm, B=torch.zeros_like(ssm.B))
    assert torch.equal(skip.matrix(3), torch.eye(7, dtype=torch.float64) * ssm.D[3])


def test_a_mamba2_layer_is_not_taken_for_mamba1():
    from mixer_layers import mamba2_mixer

    assert not mamba1.is_mamba1(mamba2_mixer()) and mamba1.is_mamba1(jamba_mixer())
