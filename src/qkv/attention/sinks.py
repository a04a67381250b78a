"""Learned attention sinks (gpt-oss): one logit per head in the softmax's denominator, with no
value.

A sink adds `exp(sink_h)` to every row's sum and nothing to its output, so it can be merged
after any backend that gives the log-sum-exp (the way ring attention merges chunks):

```text
lse' = logaddexp(lse, sink_h)          out' = out · exp(lse − lse')
```

The weights `exp(s_ij − lse')` of the kept keys then sum to less than 1: the rest went to the sink.

Examples:
    >>> import torch
    >>> out, lse = torch.ones(1, 2, 3, 4), torch.zeros(1, 2, 3)   # (b, h, t, dv), (b, h, t)
    >>> out2, lse2 = merge_sinks(out, lse, torch.tensor([0.0, float("-inf")]))
    >>> out2[0, :, 0, 0].tolist()                                # half to the sink; no sink
    [0.5, 1.0]
"""

from __future__ import annotations

import torch


def check_sinks(sinks, query_shape: tuple[int, ...]) -> None:
    """`sinks` is a float tensor of shape (h,), one logit per query head."""
    h = query_shape[-3] if len(query_shape) >= 3 else 1
    if not isinstance(sinks, torch.Tensor) or not sinks.is_floating_point() or tuple(sinks.shape) != (h,):
        got = (f"{sinks.dtype} {tuple(sinks.shape)}" if isinstance(sinks, torch.Tensor)
               else type(sinks).__name__)
        raise ValueError(f"sinks must be a floating-point tensor of shape (h,) = ({h},), got {got}")


def merge_sinks(out: torch.Tensor, lse: torch.Tensor,
                sinks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """out (..., h, t, dv), lse (..., h, t), sinks (h,) → (out', lse') with the sinks counted.

    Differentiable in all three (plain torch ops). A row with no key keeps out = 0 and gets
    lse' = sink.
    """
    sink = sinks.to(lse.dtype).unsqueeze(-1).expand_as(lse)  # (..., h, t)
    merged = torch.logaddexp(lse, sink)
    # −inf − (−inf) is NaN: a row with no key and a −inf sink keeps factor 0 (its out is 0)
    factor = (lse - merged).masked_fill(torch.isneginf(merged), float("-inf")).exp()
    return (out * factor.unsqueeze(-1).to(out.dtype)), merged
