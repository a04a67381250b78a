"""The feed-forward blocks: each activation against its formula in fp64, the plain block and the
gated one (SwiGLU) against hand-written compositions of their own linear maps, position-wise
application, and their checks.

Tolerances (``tests/tolerance.py``): fp64 results against fp64 formulas may differ by 4× the
float32 run's error rescaled to float64 (:func:`assert_agree`).
"""

from __future__ import annotations

import math

import pytest
import torch

from qkv.modules import FeedForward, GatedFeedForward
from tolerance import assert_agree, twin

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
    assert_agree(act(xs), want, act(xs.float()))


def _plain_by_hand(ff, x, activation, bias):
    h = x @ ff.fc1.weight.T + (ff.fc1.bias if bias else 0)
    h = h.detach().double().apply_(FORMULAS[activation]).to(x.dtype)
    return h @ ff.fc2.weight.T + (ff.fc2.bias if bias else 0)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("activation", sorted(FORMULAS))
def test_block_is_fc2_of_act_of_fc1(activation, bias):
    torch.manual_seed(0)
    ff = FeedForward(6, 24, activation=activation, bias=bias).double()
    assert (ff.fc1.bias is None) == (not bias)
    x = torch.randn(2, 5, 6, dtype=torch.float64)
    want = _plain_by_hand(ff, x, activation, bias)
    low = _plain_by_hand(twin(ff, torch.float32), x.float(), activation, bias)
    assert_agree(ff(x), want, low)


def test_block_acts_on_every_position_alone():
    torch.manual_seed(1)
    ff = FeedForward(8, 16).double()
    x = torch.randn(3, 7, 8, dtype=torch.float64)
    # one position alone is another matrix shape: equal up to rounding
    assert_agree(ff(x[:, 4:5])[:, 0], ff(x)[:, 4], twin(ff, torch.float32)(x.float())[:, 4])


def test_unknown_activation_is_named():
    with pytest.raises(ValueError, match=r"unknown activation 'swish'.*gelu"):
        FeedForward(4, 8, activation="swish")
    with pytest.raises(ValueError, match=r"unknown activation 'swish'.*silu"):
        GatedFeedForward(4, 8, activation="swish")


def test_dropout_in_training_lets_finite_gradients_flow():
    torch.manual_seed(2)
    ff = FeedForward(8, 32, dropout=0.5).train()
    x = torch.randn(4, 6, 8, requires_grad=True)
    out = ff(x)
    # eval mode runs the same ops in the same order but for dropout: any difference is dropout's
    assert not torch.equal(out, ff.eval()(x))
    out.square().sum().backward()
    assert x.grad.isfinite().all() and x.grad.abs().sum() > 0
    assert ff.fc1.weight.grad.isfinite().all() and ff.fc1.weight.grad.abs().sum() > 0


# -- gated (GLU family) ----------------------------------------------------------------------------

def _swiglu_by_hand(ff, x):
    """Shazeer (2020), eq. 6 without biases: (Swish₁(x W) ⊗ x V) W₂, Swish₁(z) = z·σ(z)."""
    gate = x @ ff.gate.weight.T  # (b, t, F)
    up = x @ ff.up.weight.T  # (b, t, F)
    return (gate * torch.sigmoid(gate) * up) @ ff.down.weight.T  # (b, t, E)


def test_gated_block_is_swiglu_by_hand():
    torch.manual_seed(3)
    ff = GatedFeedForward(6, 20).double()  # SwiGLU by default, no biases (Llama's)
    assert ff.gate.bias is None and ff.up.bias is None and ff.down.bias is None
    x = torch.randn(2, 7, 6, dtype=torch.float64)
    want = _swiglu_by_hand(ff, x)
    low = _swiglu_by_hand(twin(ff, torch.float32), x.float())
    assert_agree(ff(x), want, low)


@pytest.mark.parametrize("activation", sorted(FORMULAS))
def test_gated_block_with_biases_follows_its_formula(activation):
    """down(act(gate(x)) ⊙ up(x)) with any activation (GeGLU, ReGLU…) and biases."""
    torch.manual_seed(4)
    ff = GatedFeedForward(6, 12, activation=activation, bias=True).double()
    assert ff.gate.bias is not None

    def by_hand(ff, x):
        gate = x @ ff.gate.weight.T + ff.gate.bias
        act = gate.detach().double().apply_(FORMULAS[activation]).to(x.dtype)
        return (act * (x @ ff.up.weight.T + ff.up.bias)) @ ff.down.weight.T + ff.down.bias

    x = torch.randn(3, 4, 6, dtype=torch.float64)
    assert_agree(ff(x), by_hand(ff, x), by_hand(twin(ff, torch.float32), x.float()))


def test_gated_dropout_in_training_lets_gradients_reach_all_three_maps():
    torch.manual_seed(5)
    ff = GatedFeedForward(8, 16, dropout=0.5).train()
    x = torch.randn(2, 5, 8, requires_grad=True)
    out = ff(x)
    assert not torch.equal(out, ff.eval()(x))  # as above: any difference is dropout's
    out.square().sum().backward()
    assert x.grad.isfinite().all() and x.grad.abs().sum() > 0
    for proj in (ff.gate, ff.up, ff.down):
        assert proj.weight.grad.isfinite().all() and proj.weight.grad.abs().sum() > 0
