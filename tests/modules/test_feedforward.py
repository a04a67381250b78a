"""The feed-forward block: each activation against its formula in fp64, the block against a
hand-written composition of its own linear maps, position-wise application, and its checks."""

from __future__ import annotations

import math

import pytest
import torch

from qkv.modules import FeedForward

FORMULAS = {
    "relu": lambda x: max(x, 0.0),
    "gelu": lambda x: 0.5 * x * (1 + math.erf(x / math.sqrt(2))),
    "gelu_tanh": lambda x: 0.5 * x * (1 + math.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
    "silu": lambda x: x / (1 + math.exp(-x)),
}


@pytest.mark.parametrize("activation", sorted(FORMULAS))
def test_activation_equals_its_formula(activation):
    act = FeedForward(2, 3, activation=activation).act
    xs = torch.linspace(-6, 6, 97, dtype=torch.float64)
    want = torch.tensor([FORMULAS[activation](x) for x in xs.tolist()], dtype=torch.float64)
    torch.testing.assert_close(act(xs), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("activation", sorted(FORMULAS))
def test_block_is_fc2_of_act_of_fc1(activation, bias):
    torch.manual_seed(0)
    ff = FeedForward(6, 24, activation=activation, bias=bias).double()
    assert (ff.fc1.bias is None) == (not bias)
    x = torch.randn(2, 5, 6, dtype=torch.float64)
    h = x @ ff.fc1.weight.T + (ff.fc1.bias if bias else 0)
    h = h.detach().apply_(FORMULAS[activation])
    want = h @ ff.fc2.weight.T + (ff.fc2.bias if bias else 0)
    torch.testing.assert_close(ff(x), want)


def test_block_acts_on_every_position_alone():
    torch.manual_seed(1)
    ff = FeedForward(8, 16).double()
    x = torch.randn(3, 7, 8, dtype=torch.float64)
    torch.testing.assert_close(ff(x)[:, 4], ff(x[:, 4:5])[:, 0])


def test_unknown_activation_is_named():
    with pytest.raises(ValueError, match=r"unknown activation 'swish'.*gelu"):
        FeedForward(4, 8, activation="swish")


def test_dropout_in_training_lets_finite_gradients_flow():
    torch.manual_seed(2)
    ff = FeedForward(8, 32, dropout=0.5).train()
    x = torch.randn(4, 6, 8, requires_grad=True)
    out = ff(x)
    assert not torch.allclose(out, ff.eval()(x))  # dropout was active in training
    out.square().sum().backward()
    assert x.grad.isfinite().all() and x.grad.abs().sum() > 0
    assert ff.fc1.weight.grad.isfinite().all() and ff.fc1.weight.grad.abs().sum() > 0
