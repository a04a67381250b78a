"""What a norm is, read from what it does: centred or not, its scale, a bias or none.

LayerNorm and RMSNorm differ by one step, and models name and store them many ways (torch's
`LayerNorm`, a family's `…RMSNorm`, Gemma's RMSNorm scaling by 1 + γ, OLMo's LayerNorm with no
parameters). The class name is not asked: `fit` recognises a norm from an input and its output,

    y = (x − [mean(x)]) / √(mean(·²) + ε) · w + [b]      (one w and b per channel)

and `norm_kind` feeds a norm a probe (rows with different means) to say which it is:

```text
centres   subtracts each row's mean first (LayerNorm) or not (RMSNorm)
offset    scales by 1 + its stored weight (Gemma) rather than by the weight
bias      adds a β per channel
```

Examples:
    >>> import torch
    >>> norm_kind(torch.nn.LayerNorm(6)).name, norm_kind(torch.nn.RMSNorm(6)).name
    ('LayerNorm', 'RMSNorm')
    >>> x = torch.randn(5, 6)
    >>> fit(x, torch.nn.LayerNorm(6)(x)).centres, fit(x, x + 1) is None
    (True, True)
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from torch import nn

from qkv.modules.multihead import head_norm, norm_width


@dataclass(frozen=True)
class NormFit:
    """A norm's behaviour on some rows: `centres` (the mean subtracted first), the weight w (E,)
    and bias b (E,) or None it applies (float64)."""

    centres: bool
    weight: torch.Tensor
    bias: torch.Tensor | None


def fit(given: torch.Tensor, made: torch.Tensor) -> NormFit | None:
    """How a part made `made` (…, E) of `given` (…, E) as a norm does, or None where it is not a
    norm: each row scaled to unit RMS (RMSNorm) or centred first (LayerNorm) — times a factor per
    row a little under 1 (the norm's ε), one weight per channel and a bias per channel or none —
    fitted by alternating least squares and checked to float32's rounding. By behaviour, so any
    norm class is one (Gemma's 1 + γ, a LayerNorm without bias); a single row fits anything."""
    if not (isinstance(given, torch.Tensor) and isinstance(made, torch.Tensor)) \
            or given.shape != made.shape or given.ndim < 2 or given.shape[-1] < 2 \
            or torch.equal(given, made):  # an identity (dropout in eval) normalises nothing
        return None
    x = given.detach().double().reshape(-1, given.shape[-1])  # (n, E)
    y = made.detach().double().reshape(-1, made.shape[-1])
    if not bool(torch.isfinite(x).all() and torch.isfinite(y).all()):
        return None
    # float32's rounding at least: transformers normalises in float32 whatever the model's dtype
    eps = max(torch.finfo(made.dtype).eps, torch.finfo(torch.float32).eps)
    tol = 64 * eps * max(float(y.abs().max()), 1.0)
    for centres in (False, True):
        z = x - x.mean(-1, keepdim=True) if centres else x
        ms = z.pow(2).mean(-1, keepdim=True)  # (n, 1) each row's mean square
        z = z / ms.add(1e-300).sqrt()  # (n, E) unit RMS rows
        for with_bias in (False, True):
            if with_bias and len(z) < 3:
                continue
            r = torch.ones(len(z), 1, dtype=z.dtype)  # (n, 1) the ε's shrinking of each row
            for _ in range(25):  # converges in a few steps: r is within ε of 1
                zr = z * r
                if with_bias:
                    zc, yc = zr - zr.mean(0), y - y.mean(0)
                    w = (zc * yc).sum(0) / (zc * zc).sum(0).clamp_min(1e-300)  # (E,)
                    b = y.mean(0) - w * zr.mean(0)
                else:
                    w = (zr * y).sum(0) / (zr * zr).sum(0).clamp_min(1e-300)
                    b = torch.zeros_like(w)
                wz = z * w
                r = (((y - b) * wz).sum(1) / (wz * wz).sum(1).clamp_min(1e-300))[:, None]
                r = r / r.max().clamp_min(1e-300)  # r·w is one product: the largest row's r is 1
            w = (z * r * (y - b)).sum(0) / (z * r).pow(2).sum(0).clamp_min(1e-300)  # w for that r
            # ε only shrinks a row a little (r ≤ 1); a free row factor would make any per-row
            # rescaling a "norm"
            if float(w.abs().max()) > 0 and 0.5 <= float(r.min()) and _one_eps(r, ms) \
                    and float((y - (z * r * w + b)).abs().max()) <= tol:
                return NormFit(centres, w, b if with_bias else None)
    return None


def _one_eps(r: torch.Tensor, ms: torch.Tensor) -> bool:
    """Whether the rows' shrinking factors `r` (n, 1) (scaled so the largest is 1) are one ε's:
    a norm divides row i by √(ms_i + ε), so 1/r_i² = c²·(1 + ε/ms_i) — a line in 1/ms_i with
    a positive intercept and ε no larger than a typical row's mean square. A per-row rescaling
    that is not a norm's (x ↦ x + 1 read as unit rows times rms_i) has r_i ∝ rms_i: the line
    goes through the origin. Fewer than three rows fit any line: accepted."""
    if len(r) < 3 or float(r.min()) == float(r.max()):
        return True
    u, v = 1 / ms.reshape(-1), 1 / r.reshape(-1).pow(2)  # (n,), (n,)
    A = torch.stack([torch.ones_like(u), u], 1)  # (n, 2)
    c2, slope = torch.linalg.lstsq(A, v[:, None]).solution.reshape(-1)  # intercept c², slope c²·ε
    if float(c2) <= 0:
        return False
    eps = float(slope) / float(c2)
    fits = float((A @ torch.stack([c2, slope]) - v).abs().max()) <= 1e-2 * float(v.max())  # r from float32 rows
    typical = float(ms.median())
    return fits and -1e-3 * typical <= eps <= typical  # ε ≥ 0 up to r's own rounding


@dataclass(frozen=True)
class NormKind:
    """Which norm a module is (see the module doc): `centres`, `offset`, `bias`."""

    centres: bool
    offset: bool
    bias: bool

    @property
    def name(self) -> str:
        """"LayerNorm" (centred) or "RMSNorm"."""
        return "LayerNorm" if self.centres else "RMSNorm"


# Each norm's kind while its parameters stay the same (their version counters move on any
# in-place change): one probe per norm, not per call.
_KINDS: "weakref.WeakKeyDictionary[nn.Module, tuple]" = weakref.WeakKeyDictionary()


def norm_kind(norm: nn.Module, width: int | None = None) -> NormKind:
    """The kind of `norm`, from its output on a probe of 8 rows with different means and spreads
    (`width` features; default its weight's width or `normalized_shape`), in float64 with the
    norm's parameters taken to it; ValueError naming it where it does not behave as a norm.

    Examples:
        >>> import torch
        >>> norm_kind(torch.nn.LayerNorm(4, bias=False))
        NormKind(centres=True, offset=False, bias=False)
    """
    params = list(norm.parameters(recurse=False))
    like = params[0] if params else torch.empty(0)
    width = width if width is not None else norm_width(norm)
    version = tuple((p._version, p.data_ptr(), p.dtype) for p in params) + (width,)
    kept = _KINDS.get(norm)
    if kept is not None and kept[0] == version:
        return kept[1]
    g = torch.Generator().manual_seed(0)
    rows = torch.randn(8, width, generator=g, dtype=torch.float64)  # (8, width)
    rows = rows * torch.linspace(0.5, 3.0, 8, dtype=torch.float64)[:, None] \
        + torch.linspace(-2.0, 2.0, 8, dtype=torch.float64)[:, None]
    probe = rows.to(like.device)  # float64, the parameters taken to it: a bfloat16 norm's kind too
    with torch.no_grad():
        found = fit(probe, head_norm(norm, probe, width))
    if found is None:
        raise ValueError(f"{type(norm).__name__} does not normalise a probe of width {width} "
                         f"as a LayerNorm or RMSNorm does")
    weight = dict(norm.named_parameters(recurse=False)).get("weight")
    offset = False
    if weight is not None:
        w = weight.detach().double().cpu().reshape(-1)
        offset = float((found.weight.cpu() - 1 - w).abs().max()) < float((found.weight.cpu() - w).abs().max())
    kind = NormKind(found.centres, offset, found.bias is not None)
    _KINDS[norm] = (version, kind)
    return kind


__all__ = ["NormFit", "NormKind", "fit", "norm_kind"]
