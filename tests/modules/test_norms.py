"""`qkv.modules.norms`: a norm's kind read from what it does, not from its class's name."""

from __future__ import annotations

import doctest

import pytest
import torch
from torch import nn

import qkv.modules.norms
from qkv.modules.norms import NormKind, fit, norm_kind


class Scaled(nn.Module):
    """An RMSNorm under a name with no "rms" in it, scaling by 1 + γ (Gemma's storage)."""

    def __init__(self, width: int):
        super().__init__()
        self.weight = nn.Parameter(0.1 * torch.randn(width))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * (1 + self.weight)


class Centring(nn.Module):
    """A LayerNorm that torch does not know as one: centred, γ, β."""

    def __init__(self, width: int):
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(width))
        self.bias = nn.Parameter(0.1 * torch.randn(width))

    def forward(self, x):
        c = x - x.mean(-1, keepdim=True)
        return c * torch.rsqrt(c.pow(2).mean(-1, keepdim=True) + 1e-5) * self.weight + self.bias


def _layer_norm(width: int, **kwargs) -> nn.LayerNorm:
    norm = nn.LayerNorm(width, **kwargs)
    with torch.no_grad():
        for p in norm.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return norm


@pytest.mark.parametrize("make, want", [
    (lambda: _layer_norm(7), NormKind(centres=True, offset=False, bias=True)),
    (lambda: _layer_norm(7, bias=False), NormKind(centres=True, offset=False, bias=False)),
    (lambda: nn.LayerNorm(7, elementwise_affine=False), NormKind(centres=True, offset=False, bias=False)),
    (lambda: nn.RMSNorm(7), NormKind(centres=False, offset=False, bias=False)),
    (lambda: Scaled(7), NormKind(centres=False, offset=True, bias=False)),
    (lambda: Centring(7), NormKind(centres=True, offset=False, bias=True)),
])
def test_kind_is_read_from_behaviour(make, want):
    torch.manual_seed(0)
    norm = make()
    kind = norm_kind(norm)
    assert kind == want
    # the kind, with the norm's own parameters, rebuilds it: (x − [mean]) / √(mean(·²) + ε) · γ + β, ε ≤ 1e-5
    x = torch.randn(5, 7, dtype=torch.float64) + torch.arange(5.0, dtype=torch.float64)[:, None]
    with torch.no_grad():
        want_y = norm.double()(x)
        own = dict(norm.named_parameters())
        gamma = None if "weight" not in own else own["weight"] + 1 if kind.offset else own["weight"]
        beta = own.get("bias") if kind.bias else None
    c = x - x.mean(-1, keepdim=True) if kind.centres else x
    got = c / (c.pow(2).mean(-1, keepdim=True)).sqrt() * (1 if gamma is None else gamma.detach())
    got = got + (0 if beta is None else beta.detach())
    assert float((got - want_y).abs().max()) < 1e-4  # the ε left out: ≤ ε/mean(·²) relative


def test_a_bfloat16_norm_is_probed_in_float64():
    """Its parameters taken to float64 for the probe: bfloat16's rounding does not blur centred
    and uncentred, γ and 1 + γ."""
    torch.manual_seed(0)
    assert norm_kind(_layer_norm(7).to(torch.bfloat16)) == NormKind(centres=True, offset=False, bias=True)
    assert norm_kind(Scaled(7).to(torch.bfloat16)) == NormKind(centres=False, offset=True, bias=False)


def test_a_non_norm_is_refused_by_name():
    with pytest.raises(ValueError, match="Linear does not normalise"):
        norm_kind(nn.Linear(4, 4), width=4)
    x = torch.randn(6, 5) * torch.arange(1.0, 7.0)[:, None]  # rows' spreads 1 … 6: no ε shrinks so far
    assert fit(x, 2 * x + 1) is None and fit(x, x) is None


def test_docstring_examples():
    assert doctest.testmod(qkv.modules.norms, extraglobs={"torch": torch}).failed == 0


def test_a_per_row_rescaling_is_not_a_norm():
    """x ↦ x + 1 is unit-RMS rows times each row's rms plus one: with a free factor per row it
    "fits" a norm (it did in 36% of 5 × 6 draws). A norm's factors are one ε's, 1/r² linear in
    1/ms with a positive intercept: a rescaling's line goes through the origin — refused, over
    many draws and shapes, while torch's own norms on the same rows are still read as norms."""
    g = torch.Generator().manual_seed(0)
    for n, width in ((5, 6), (16, 16), (12, 48)):
        for _ in range(100):
            x = torch.randn(n, width, generator=g)
            assert fit(x, x + 1) is None and fit(x, 2 * x - 0.5) is None
            assert fit(x, torch.nn.LayerNorm(width)(x)).centres
            assert not fit(x, torch.nn.RMSNorm(width, eps=1e-6)(x)).centres
