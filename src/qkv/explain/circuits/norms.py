"""A norm as the affine map it is for one forward: the scale read from the vector it normalised.

LayerNorm and RMSNorm are not linear, but for a given input x their output is

    LayerNorm:  y = (x − mean(x)) · γ / σ(x) + β,    σ(x) = √(var(x) + ε)
    RMSNorm:    y = x · γ / rms(x),                  rms(x) = √(mean(x²) + ε)

so with σ (or rms) frozen at the value the forward computed, y is affine in x: any split of x
into parts x = Σ_c x_c carries through as y = Σ_c (x_c − mean(x_c)) · γ/σ + β (the standard,
exact reading of that forward: Elhage et al. 2021, "folding" the norm; Ferrando et al. 2022).

`linearise` reads γ (or Gemma's 1 + γ), β and ε off the module and keeps the form only
where it rebuilds the module's own output on x (else the norm is named).

Examples:
    >>> import torch
    >>> norm = torch.nn.LayerNorm(4)
    >>> x = torch.tensor([[1.0, 2.0, 3.0, 6.0]])
    >>> lin = linearise(norm, x)
    >>> torch.allclose(lin.apply(x) + lin.shift, norm(x).double())
    True
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from torch import nn

from qkv.errors import QkvError
from qkv.rounding import rebuilds  # the one tolerance; circuits/ import it from here


@dataclass(frozen=True)
class Linearised:
    """One norm frozen at one forward's inputs: `y = apply(x) + shift`.

    Fields: scale (n, E) γ/σ per row; shift (E,) β; centres: whether the mean is subtracted.
    """

    scale: torch.Tensor
    shift: torch.Tensor
    centres: bool

    def apply(self, parts: torch.Tensor) -> torch.Tensor:
        """Parts (..., n, E) of the n normalised vectors → their parts after the norm, (..., n, E),
        without β (the shift belongs to the "bias" component once)."""
        if self.centres:
            parts = parts - parts.mean(-1, keepdim=True)
        return parts * self.scale


def _eps(norm: nn.Module, dtype: torch.dtype) -> float:
    """The norm's ε as it stores it (torch's `eps`, transformers' `variance_epsilon` …); only
    a candidate — `linearise` fits 1/σ per row from the norm's own output first."""
    found = (vars(norm).get(name) for name in ("eps", "variance_epsilon", "epsilon"))
    value = next((v for v in found if isinstance(v, (int, float))), None)
    return float(value) if value is not None else torch.finfo(dtype).eps  # nn.RMSNorm, eps=None


def affine(norm: nn.Module) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The norm's own γ and β (its parameters `weight` and `bias`), None where it has none
    (OLMo's LayerNorm has neither)."""
    own = dict(norm.named_parameters(recurse=False))
    return own.get("weight"), own.get("bias")


# γ, 1 + γ and β in float64 per norm while its parameters stay the same (their version counters
# move on any in-place change): they do not depend on the text.
_CONSTANTS: "weakref.WeakKeyDictionary[nn.Module, tuple]" = weakref.WeakKeyDictionary()


def _constants(norm: nn.Module, x64: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """(the candidate γs (E,): as the module stores it, or 1 + γ — Gemma's RMSNorm keeps the
    offset from 1 —; β (E,)), float64, on x64's device."""
    weight, bias = affine(norm)
    version = tuple(None if p is None else (p._version, p.data_ptr(), p.dtype, p.device)
                    for p in (weight, bias)) + (x64.shape[-1], x64.device)
    kept = _CONSTANTS.get(norm)
    if kept is None or kept[0] != version:
        E = x64.shape[-1]
        w = weight.detach().to(x64) if weight is not None else None
        gammas = (x64.new_ones(E),) if w is None else (w, 1 + w)
        beta = bias.detach().to(x64) if bias is not None else x64.new_zeros(E)
        kept = _CONSTANTS[norm] = (version, gammas, beta)
    return kept[1], kept[2]


# The form (γ or 1 + γ, centred or not, 1/σ fitted or computed) that rebuilt each norm's output
# last time: tried first next time, the others only where it does not rebuild (the weights
# changed, another input) — one check per call instead of up to eight.
_FORMS: "weakref.WeakKeyDictionary[nn.Module, tuple[int, bool, bool]]" = weakref.WeakKeyDictionary()


def _spread(centred: torch.Tensor, eps: float) -> torch.Tensor:
    """(n, 1) σ (of centred rows) or rms: √(mean(x²) + ε)."""
    return (centred.pow(2).mean(-1, keepdim=True) + eps).sqrt()


def linearise(norm: nn.Module, x: torch.Tensor, output: torch.Tensor | None = None) -> Linearised:
    """`norm` as an affine map at the rows of `x` (n, E) (the vectors it read in the
    forward), checked against its output there: `output` (n, E) as the forward recorded it, else
    `norm(x)` computed; QkvError naming the norm where neither a LayerNorm's nor an RMSNorm's
    formula with its γ, β and ε rebuilds that output."""
    x64 = x.double()
    gammas, beta = _constants(norm, x64)
    eps = _eps(norm, x.dtype)
    if output is None:
        with torch.no_grad():
            output = norm(x)
    want = output
    shifted = affine(norm)[1] is not None  # without a β, β = 0: neither subtracted nor added
    y = want.double() - beta if shifted else want.double()  # (n, E)
    forms = [(g, c, fitted) for g in range(len(gammas)) for c in (True, False) for fitted in (True, False)]
    forms.sort(key=lambda form: form != _FORMS.get(norm))  # the last one that rebuilt first
    for g, centres, fitted in forms:
        gamma = gammas[g]
        centred = x64 - x64.mean(-1, keepdim=True) if centres else x64
        if fitted:
            # the scale the forward computed, read off its output where it has one (an RMSNorm of
            # transformers normalises in float32 whatever the model's dtype): 1/σ fitted per row
            z = centred * gamma  # (n, E)
            zz = z.pow(2).sum(-1, keepdim=True)
            inverse = (z * y).sum(-1, keepdim=True) / zz.clamp_min(1e-300)  # (n, 1): 1/σ
            if not bool((zz > 0).all()):  # a row the norm zeroed has no fit: 1/σ computed there
                inverse = torch.where(zz > 0, inverse, 1 / _spread(centred, eps))
        else:
            inverse = 1 / _spread(centred, eps)
        lin = Linearised(gamma * inverse, beta, centres)
        got = lin.apply(x64) + beta if shifted else lin.apply(x64)
        if rebuilds(got, want):
            _FORMS[norm] = (g, centres, fitted)
            return lin
    raise QkvError(f"{type(norm).__name__} is neither LayerNorm nor RMSNorm with its own weight, "
                   f"bias and eps (they do not rebuild its output); qkv cannot freeze it into an "
                   f"affine map")


__all__ = ["affine", "Linearised", "linearise"]
