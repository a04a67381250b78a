"""Asking a layer for what it wrote at some positions only: no attention trace, O(n) per layer.

A decomposition of layer ℓ's input (`qkv.explain.circuits.residual.stream`) reads, of every
earlier layer, each head's output and the residual `x + attn` — at the positions it splits (the
query's and the key's), nothing else: not the earlier layers' weights, keys or values.
`trace_rows=Writes(positions)` asks a layer for exactly that:

```text
layer ℓ' < ℓ:  attention runs untraced (the fast kernel, as a plain forward)
               records heads (b, n, h·d) and residual (b, n, E) at the n positions
```

so tracing a row of layer ℓ of a 2k-token, 22-layer GQA model keeps n × (h·d + 2E) numbers per
earlier layer (with what entered it: the stack keeps `hidden_states` before ℓ at the positions
too) instead of its keys and values repeated per query head and every row's heads, residual and
input. It rides on `LayerRows(ℓ, rows, earlier=Writes(positions))`.

`trace_rows=Weights(rows)` asks a layer for its traced rows' attention weights alone (h, r, s):
the rows run the reference path exactly as `trace_rows=rows` runs them (the same numbers), but
the trace's keys and values (repeated per query head), the inputs, every row's heads and the
residual are dropped as soon as the layer is done — what a ranking of every head by its weights
(`qkv heads`) reads, O(h · r · s) per layer.

The records of `Writes` are `AtPositions`: indexed by the *absolute* positions, as a full (b, t, ·) tensor
would be (`rec.heads[0, positions]`), so a reader needs not know which kind it holds.

Examples:
    >>> import torch
    >>> from qkv.modules import MultiHeadAttention
    >>> mha = MultiHeadAttention(16, 4)
    >>> rec = mha(torch.randn(1, 300, 16), is_causal=True,
    ...           trace_rows=Writes(torch.tensor([7, 250]))).trace
    >>> tuple(rec.heads.values.shape), tuple(rec.heads[0, torch.tensor([250])].shape)
    ((1, 2, 16), (1, 16))
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Writes:
    """`trace_rows=Writes(positions)`: record only what the layer wrote at `positions` (n,)."""

    positions: torch.Tensor

    def __post_init__(self):
        object.__setattr__(self, "positions", torch.unique(torch.as_tensor(self.positions).long()))

    def keep(self, x: torch.Tensor) -> "AtPositions":
        """x (b, t, ·) → its rows at the positions, read back by absolute position."""
        positions = self.positions.to(x.device)
        return AtPositions(positions, x.index_select(1, positions))


@dataclass(frozen=True)
class AtPositions:
    """Some rows of a (b, t, ·) tensor: `values` (b, n, ·) at `positions` (n,), sorted.

    `rec[b, positions]` reads them by absolute position, as the whole tensor would; a position
    not kept is a ValueError naming it.
    """

    positions: torch.Tensor
    values: torch.Tensor

    @property
    def dtype(self) -> torch.dtype:
        return self.values.dtype

    def __getitem__(self, index) -> torch.Tensor:
        batch, positions = index
        wanted = torch.as_tensor(positions).tolist()  # a handful: looked up in Python, one sync
        kept = {p: n for n, p in enumerate(self.positions.tolist())}
        missing = [p for p in wanted if p not in kept]
        if missing:
            raise ValueError(f"positions {missing} are not all among those kept "
                             f"({self.positions.tolist()})")
        return self.values[batch, [kept[p] for p in wanted]]


@dataclass(frozen=True)
class WritesTrace:
    """What a `Writes` request records of one attention call: `heads`, every head's output
    at the positions (b, n, h·d), exactly `out_proj`'s input there."""

    heads: AtPositions


@dataclass(frozen=True)
class Weights:
    """`trace_rows=Weights(rows)`: record only the attention weights of the query `rows` (r,)."""

    rows: torch.Tensor


@dataclass(frozen=True)
class WeightsTrace:
    """What a `Weights` request records of one attention call: `weights` (b, h, r, s), the
    traced rows' softmax weights as the reference path computed them in the forward."""

    weights: torch.Tensor


__all__ = ["AtPositions", "Weights", "WeightsTrace", "Writes", "WritesTrace"]
