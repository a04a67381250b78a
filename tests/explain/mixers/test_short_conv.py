"""The gated short convolution as a banded matrix per channel: M·x + offset is the layer's y, and
M is the layer's convolution run on one-hot values.

The layer runs in float64 throughout (no float32 cast), so these are one answer computed two
ways in float64: ``assert_agree`` with the float32 computation of the same formula as the
rounding one precision down.
"""

from __future__ import annotations

import sys

import pytest
import torch
from mixer_layers import in_dtype, inputs, lfm2_short_conv, one_hot_values
from tolerance import assert_agree

from qkv.explain.mixers import short_conv
from qkv.explain.mixers.capture import kernel_call


@pytest.mark.parametrize("t", [1, 2, 7, 33])
@pytest.mark.parametrize("bias", [False, True])
def test_matrix_times_values_plus_offset_is_the_layers_output(t, bias):
    layer = lfm2_short_conv(bias=bias)
    conv = short_conv.read(layer, inputs(t))
    low = in_dtype(conv, torch.float32)
    call = kernel_call(layer, short_conv.KERNEL, inputs(t))
    assert torch.equal((conv.B * conv.x).T, call.arguments["hidden_states"][0])  # in_proj rebuilds the conv's input
    for c in (0, 5, 31):
        M = conv.matrix(c)
        K = conv.weight.shape[1]
        assert torch.equal(M.triu(1), torch.zeros_like(M)) and torch.equal(M.tril(-K), torch.zeros_like(M))
        assert_agree(M @ conv.values(c) + conv.offset[:, c: c + 1], conv.output[:, c],
                     low.matrix(c) @ low.values(c) + low.offset[:, c: c + 1], what=f"channel {c}")
        for i in {0, t // 2, t - 1}:
            assert torch.equal(conv.row(c, i), M[i])


def test_matrix_is_the_convolution_of_one_hot_values():
    """The layer's causal_conv1d_fn on B ⊙ e_j for every j (channel by channel), times C, gives M."""
    t = 9
    layer = lfm2_short_conv()
    conv = short_conv.read(layer, inputs(t))
    fn = getattr(sys.modules[type(layer).__module__], short_conv.KERNEL)
    for c in (0, 17):
        basis = one_hot_values(t, 1)[0, :, 0, :] * conv.B[:, c: c + 1]  # (t tokens, t columns): B_j·e_j
        out = fn(basis.T[None].contiguous(), conv.weight[c: c + 1].expand(t, -1).contiguous())  # channel c's kernel per column
        M = conv.C[:, c: c + 1] * out[0].T  # (t, t)
        assert_agree(M, conv.matrix(c), in_dtype(conv, torch.float32).matrix(c), what=f"channel {c}")
