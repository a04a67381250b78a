"""Derived tolerances: an answer may be as wrong as the plain computation of it, times a factor.

flash-attention's rule, used across the suite: compute the exact answer in float64 (``ref``),
compute it the plain way in the dtype under test (``plain``: a peer such as ``transformers``, or
qkv's readable reference path), and require

    max |got − ref|  ≤  factor · max |plain − ref|  +  floor

The error of ``plain`` is what that dtype costs on *this* CPU with *these* inputs, so the bound
follows the machine (AVX2, AVX-512, another thread count) instead of a constant tuned to one.
``floor`` = 2 ulp of the largest |ref| in the tested dtype: when ``plain`` happens to round
exactly (error 0), ``got`` may still differ by a rounding or two.
"""

from __future__ import annotations

import torch


def ulp(x: torch.Tensor, dtype: torch.dtype) -> float:
    """The spacing of ``dtype`` numbers at the largest |x|."""
    top = float(x.detach().abs().max()) if x.numel() else 0.0
    return torch.finfo(dtype).eps * max(top, torch.finfo(dtype).tiny)


def max_err(a: torch.Tensor, ref: torch.Tensor, where: torch.Tensor | None = None) -> float:
    diff = (a.detach().double() - ref.detach().double()).abs()
    if where is not None:
        diff = diff[where.expand_as(diff)] if where.shape != diff.shape else diff[where]
    return float(diff.max()) if diff.numel() else 0.0


def bound(ref: torch.Tensor, plain: torch.Tensor, *, factor: float = 2.0,
          where: torch.Tensor | None = None, dtype: torch.dtype | None = None) -> float:
    """``factor · max|plain − ref| + 2 ulp`` — the derived tolerance (see the module doc)."""
    dtype = dtype or plain.dtype
    return factor * max_err(plain, ref, where) + 2 * ulp(ref, dtype)


def assert_within(got: torch.Tensor, ref: torch.Tensor, plain: torch.Tensor, *, factor: float = 2.0,
                  where: torch.Tensor | None = None, what: str = "result") -> None:
    """``got`` is no further from ``ref`` than ``factor`` times ``plain`` is (plus 2 ulp)."""
    err = max_err(got, ref, where)
    tol = bound(ref, plain, factor=factor, where=where, dtype=got.dtype)
    assert err <= tol, (f"{what}: max error {err:.3g} > {tol:.3g} = {factor} × the plain "
                        f"computation's {max_err(plain, ref, where):.3g} + 2 ulp")
