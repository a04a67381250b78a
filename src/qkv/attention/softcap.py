"""Logit soft-capping (Gemma 2): the scaled scores squashed smoothly into (−c, c).

```text
cap(z) = c · tanh(z / c)          ≈ z for |z| ≪ c,  → ±c as |z| grows
```

Written here once; the reference path, the blockwise kernel (forward and backward), the weights
from the lse, the traced rows and `qkv explain`'s float64 recomputation all call
`soft_cap`.

Examples:
    >>> import torch
    >>> [round(z, 4) for z in soft_cap(torch.tensor([0.0, 1.0, 100.0]), 2.0).tolist()]
    [0.0, 0.9242, 2.0]
"""

from __future__ import annotations

import torch


def soft_cap(scores: torch.Tensor, cap: float, *, inplace: bool = False,
             keep_tanh: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """`cap · tanh(scores / cap)`, elementwise, any shape.

    `inplace`: `scores` is overwritten (a kernel's scratch block, outside autograd: no new
    tensor for the division, the tanh and the product). `keep_tanh`: return `(capped, tanh)` —
    the backward's `d cap(z)/dz = 1 − tanh²` needs the tanh (then `capped` is a new tensor).
    """
    if not inplace:  # differentiable: no tensor autograd keeps is overwritten
        th = torch.tanh(scores / cap)
        return (th * cap, th) if keep_tanh else th * cap
    th = scores.div_(cap).tanh_()
    return (th * cap, th) if keep_tanh else th.mul_(cap)
