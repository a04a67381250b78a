"""Derived tolerances: an answer may be as wrong as the plain computation of it, times a factor.

flash-attention's rule, used across the suite: compute the exact answer in float64 (``ref``),
compute it the plain way in the dtype under test (``plain``: a peer such as ``transformers``, or
qkv's readable reference path), and require

    max |got − ref|  ≤  factor · max |plain − ref|  +  floor

The error of ``plain`` is what that dtype costs on *this* CPU with *these* inputs, so the bound
follows the machine (AVX2, AVX-512, another thread count) instead of a constant tuned to one.
``floor`` = 2 ulp of the largest |ref| in the tested dtype: when ``plain`` happens to round
exactly (error 0), ``got`` may still differ by a rounding or two.

Answers already computed in float64 have no finer truth: :func:`assert_agree` measures their
rounding one precision down (the same computation in float32, rescaled by eps64/eps32).
Where two results come from the same operations on the same numbers, tests use ``torch.equal``
and say so; any other bound is derived in a comment next to it.
"""

from __future__ import annotations

import copy

import torch


# The factor for torch's CPU flash-attention kernel (qkv's "fused" backend) against a plain
# softmax path in the same dtype. The kernel computes exp with a polynomial accurate to 2 ulp
# (``Vectorized::exp_u20``) where ``torch.softmax``'s exp is within 1 ulp, and normalises the
# output by multiplying with a rounded reciprocal of the row sum (two roundings where a
# division makes one): per term it may round up to twice as much as the plain path, so
# flash-attention's factor 2 doubles. (Seen on this project's CPU: up to 3.3× the plain
# float32 error in a few thousand random problems of tests/attention/test_backends.py.)
FUSED_FACTOR = 4.0


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


def unit_roundoff_ratio(fine: torch.dtype, coarse: torch.dtype) -> float:
    """eps(fine) / eps(coarse): how much smaller a rounding is in ``fine`` (float64 vs float32: 2⁻²⁹)."""
    return torch.finfo(fine).eps / torch.finfo(coarse).eps


def agree_bound(ref: torch.Tensor, low: torch.Tensor, *, dtype: torch.dtype, factor: float = 4.0,
                where: torch.Tensor | None = None) -> float:
    """``factor · max|low − ref| · eps(dtype)/eps(low) + 2 ulp`` — see :func:`assert_agree`."""
    return (factor * max_err(low, ref, where) * unit_roundoff_ratio(dtype, low.dtype)
            + 2 * ulp(ref, dtype))


def assert_agree(got: torch.Tensor, ref: torch.Tensor, low: torch.Tensor, *, factor: float = 4.0,
                 where: torch.Tensor | None = None, what: str = "result") -> None:
    """``got`` and ``ref`` are one answer computed two ways in one dtype; they differ by rounding.

    For computations already in float64 (cached decoding against the full pass; qkv against a
    peer holding the same weights) there is no finer truth to measure against, so the rounding
    is measured one precision down: ``low`` is ``ref``'s computation repeated in a coarser dtype
    (float32) from the same inputs. To first order a computation's rounding error is proportional
    to the unit roundoff (Higham, *Accuracy and Stability of Numerical Algorithms*, §3), so

        max|low − ref| · eps(dtype) / eps(low.dtype)

    estimates how far ``ref`` is from the exact answer (an over-estimate: ``low`` also pays for
    rounding its inputs, which ``got`` and ``ref`` share exactly). ``got`` and ``ref`` may each be
    that far away, on opposite sides (×2), and flash-attention's margin doubles that (×2):
    ``factor = 4``. Plus 2 ulp of the largest |ref| in ``dtype``, as :func:`assert_within`.

    For float64 against float32 the bound is ~2⁻²⁹ of float32's error: a bug shows as a
    difference ten orders of magnitude larger.
    """
    if low.dtype == got.dtype or torch.finfo(low.dtype).eps <= torch.finfo(got.dtype).eps:
        raise AssertionError(f"low ({low.dtype}) must be coarser than got ({got.dtype})")
    err = max_err(got, ref, where)
    tol = agree_bound(ref, low, dtype=got.dtype, factor=factor, where=where)
    assert err <= tol, (f"{what}: max difference {err:.3g} > {tol:.3g} = {factor} × the "
                        f"{low.dtype} computation's {max_err(low, ref, where):.3g} × "
                        f"eps({got.dtype})/eps({low.dtype}) + 2 ulp")


def twin(module: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """A copy of ``module`` with its floating-point weights in ``dtype`` (``module`` is left as is):
    the same weights run at another precision, for ``ref`` (float64) or ``plain``/``low`` runs."""
    return copy.deepcopy(module).to(dtype)


def softmax_sum_tolerance(s: int, dtype: torch.dtype) -> float:
    """How far a row of ``s`` softmax weights may sum from 1 in ``dtype``.

    w_j = e_j / S with S = Σ e_k rounded: the sum S costs (s − 1) roundings, each w_j one more
    (the division), summing the w_j (s − 1) more; each rounding is ≤ u = eps/2 relative, and the
    weights add up to ≤ 1, so |Σ w_j − 1| ≤ (2s − 1)·u < (s + 1)·eps to first order. (exp's own
    error cancels: the same e_j are in the numerator and in S.)
    """
    return (s + 1) * torch.finfo(dtype).eps



def attention_reference(q, k, v, bm, dout, dlse, *, scale: float, dtype: torch.dtype):
    """(out, lse, dq, dk, dv): `ref` or `plain` for attention and its gradients — autograd
    through qkv's readable reference attention in ``dtype`` (k, v heads repeated for grouped
    queries, ``bm`` drawn whole), the loss Σ out ∘ dout (+ Σ lse ∘ dlse). Shapes: q (b, h, t, d),
    k, v (b, h_kv, s, d), dout like the output, dlse (b, h, t) or None."""
    from qkv.attention.reference import reference_attention

    x = [a.detach().to(dtype).requires_grad_() for a in (q, k, v)]
    g = q.shape[1] // k.shape[1]
    trace = reference_attention(x[0], x[1].repeat_interleave(g, 1), x[2].repeat_interleave(g, 1),
                                bm.materialize(), scale=scale)
    loss = (trace.output * dout.to(dtype)).sum()
    if dlse is not None:
        loss = loss + (trace.lse * dlse.to(dtype)).sum()
    grads = torch.autograd.grad(loss, x, allow_unused=True)
    return (trace.output.detach(), trace.lse.detach(), *grads)
