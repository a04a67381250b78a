"""Whether a tensor rebuilt from parts is a forward's, to rounding — the one tolerance the
projection reader (`qkv.hf.projections`), the transformers adapter's discovery of parts
(`qkv.hf.adapter`) and the norms' linearisation (`qkv.explain.circuits.norms`) apply. Plain torch:
importing it loads nothing else (it lived in `qkv.hf.projections`, whose package registers with
transformers on import — seconds that the viewer's first "why this weight" paid).

Examples:
    >>> import torch
    >>> x = torch.randn(4, 8)
    >>> close(x.double() + 1e-9, x), close(x * 1.01, x)
    (True, False)
    >>> rebuilds(x.double() + 1e-6, x.double())  # a float32 forward's numbers held in float64
    True
"""

from __future__ import annotations

import torch


def close(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Whether a rebuilt q, k or v is the kernel's, to the rounding of a different summation
    order: a wrong layout, norm or rotation is off by the size of the numbers themselves."""
    if got.shape != want.shape:
        return False
    eps = max(torch.finfo(got.dtype).eps, torch.finfo(want.dtype).eps)  # the model's, not the trace's
    if not want.numel():
        return True
    # the largest difference and the largest entry read together: one sync, not two
    diff, top = torch.stack([got.to(want.dtype) - want, want]).abs().flatten(1).amax(1).tolist()
    # float32/64: E-term dot products summed in another order (E ≤ 2¹⁶), a norm and a rotation,
    # far inside 2¹⁰ eps of the largest entry; 16-bit: the same operations rounded to a few ulp
    # (float32 accumulation), inside 16 eps — where a wrong layout is off by the entries' size
    factor = 1024 if eps < 1e-4 else 16
    return diff <= factor * eps * max(top, 1.0)


def rebuilds(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Whether `got` (float64, rebuilt from parts) is the forward's `want` to its rounding:
    `close`, or float32's where `want` is float64 — a float64 model computes parts in
    float32 (transformers' RMSNorms and RoPE tables), and a float32 forward's numbers are often
    held in float64 to be compared."""
    return close(got, want) or (want.dtype == torch.float64 and close(got.float(), want.float()))
