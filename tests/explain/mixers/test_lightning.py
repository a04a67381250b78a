"""Lightning attention as a matrix: M·v is the layer's output before its norm, and M is the
layer's own run on one-hot values.

The layer computes in the module's dtype (float64 here), but its decay tables (query_decay,
key_decay, diagonal_decay: exp(−s·i)) are buffers computed in float32 when it is built, which
``.double()`` only widens: its output carries float32 rounding of those factors. So it is compared
with M·v in float64 by ``assert_within``: no further than 4× qkv's closed form run in float32 (the
layer's float32 twin, tests/tolerance.py: twin) plus 2 float32 ulp — as the float32 kernels of
test_delta_rule.py. qkv's row and matrix are one answer two ways in float64: ``assert_agree``.
"""

from __future__ import annotations

import pytest
import torch
from mixer_layers import inputs, minimax_lightning
from tolerance import assert_agree, assert_within, twin

from qkv.explain.mixers import lightning


@pytest.mark.parametrize("t", [1, 7, 33])
def test_matrix_times_values_is_the_layers_output(t):
    layer = minimax_lightning()
    light = lightning.read(layer, inputs(t))
    low = lightning.read(twin(layer, torch.float32), inputs(t).float(), torch.float32)
    for h in range(light.heads):
        M = light.matrix(h)
        assert torch.equal(M.triu(1), torch.zeros_like(M))
        assert_within(light.output[:, h].float(), M @ light.values(h), low.matrix(h) @ low.values(h),
                      factor=4.0, what=f"head {h}: output vs M·v")
        for i in {0, t // 2, t - 1}:
            assert_agree(light.row(h, i), M[i], low.row(h, i), what=f"head {h} row {i}")


def test_matrix_is_the_layers_one_hot_run():
    """With an identity activation, hidden ≥ t and W_v = pinv(x)·[I 0], the layer's own values are
    one-hot (v_j = e_j up to rounding), so its output before the norm is M itself — blocks of 8,
    so the run crosses block boundaries."""
    t, hidden = 33, 48
    layer = minimax_lightning(hidden_act="linear", head_dim=40, hidden=hidden)
    x = inputs(t, hidden=hidden)
    d, heads = layer.head_dim, layer.num_attention_heads
    W = (torch.linalg.pinv(x[0]) @ torch.eye(t, d, dtype=torch.float64)).T  # (d, hidden): x·Wᵀ = [I 0]
    with torch.no_grad():
        for h in range(heads):
            layer.qkv_proj.weight[h * 3 * d + 2 * d: (h + 1) * 3 * d] = W
    light = lightning.read(layer, x)
    low = lightning.read(twin(layer, torch.float32), x.float(), torch.float32)
    assert torch.allclose(light.values(0)[:, :t], torch.eye(t, dtype=torch.float64), atol=1e-12)
    for h in range(heads):
        assert_within(light.output[:, h, :t].float(), light.matrix(h) @ light.values(h)[:, :t],
                      low.matrix(h) @ low.values(h)[:, :t], factor=4.0, what=f"head {h}: one-hot run vs M·v")
        assert_within(light.output[:, h, :t].float(), light.matrix(h), low.matrix(h), factor=4.0,
                      what=f"head {h}: one-hot run vs M")
