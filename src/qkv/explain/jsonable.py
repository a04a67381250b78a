"""How qkv.explain results become JSON: the one convention every `to_dict()` follows.

`to_dict()` returns plain data — dict, list, str, int, float, bool, None — that
`json.dumps(result.to_dict(), allow_nan=False)` accepts; `qkv … --json` prints exactly that.

JSON has no infinities, and attention has one: a key the mask excludes gets the score −inf
(`mask` and `masked` rows of a causal or padded head). Such a number is written as the
**string** `"-inf"` (`"inf"` and `"nan"` likewise; neither occurs in practice). Every other
number is the float as computed — float64 for the recomputed steps, the forward's float32
widened to float64 for its own tensors — never rounded.

Examples:
    >>> numbers(torch.tensor([0.5, float("-inf")]))
    [0.5, '-inf']
"""

from __future__ import annotations

import math

import torch


def finite(v: float) -> float | str:
    """`v` itself when finite, else `"-inf"`, `"inf"` or `"nan"`."""
    return v if math.isfinite(v) else ("-inf" if v < 0 else "inf" if v > 0 else "nan")


def numbers(t: torch.Tensor) -> list:
    """A tensor of any rank ≥ 1 as nested lists of `finite` floats."""
    return [finite(v) for v in t.tolist()] if t.ndim == 1 else [numbers(r) for r in t]
