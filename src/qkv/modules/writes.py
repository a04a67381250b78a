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

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class Writes:
    """`trace_rows=Writes(positions)`: record only what the layer wrote at `positions` (n,)."""

    positions: torch.Tensor
    # the row of each kept position and the row indices of each request read so far, shared by
    # every record this request makes (a reader asks each layer's for the same positions)
    _lookup: "_Lookup" = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "positions", torch.unique(torch.as_tensor(self.positions).long()))
        object.__setattr__(self, "_lookup", _Lookup(self.positions.tolist()))

    def keep(self, x: torch.Tensor) -> "AtPositions":
        """x (b, t, ·) → its rows at the positions, read back by absolute position."""
        positions = self.positions.to(x.device)
        return AtPositions(positions, x.index_select(1, positions), self._lookup)


class _Lookup:
    """Absolute positions → rows of the kept values: `rows(wanted)` the (r,) row indices of
    the positions `wanted` (a tuple), None where all are kept in that order already; made
    once per request."""

    def __init__(self, kept: list[int]):
        self.kept = kept
        self.row = {p: n for n, p in enumerate(kept)}
        self.asked: dict[tuple[int, ...], torch.Tensor | None] = {}

    def rows(self, wanted: tuple[int, ...], device) -> torch.Tensor | None:
        if wanted not in self.asked:
            missing = [p for p in wanted if p not in self.row]
            if missing:
                raise ValueError(f"positions {missing} are not all among those kept ({self.kept})")
            self.asked[wanted] = None if list(wanted) == self.kept else \
                torch.tensor([self.row[p] for p in wanted], device=device)
        return self.asked[wanted]


@dataclass(frozen=True)
class AtPositions:
    """Some rows of a (b, t, ·) tensor: `values` (b, n, ·) at `positions` (n,), sorted.

    `rec[b, positions]` reads them by absolute position, as the whole tensor would; a position
    not kept is a ValueError naming it.
    """

    positions: torch.Tensor
    values: torch.Tensor
    lookup: _Lookup | None = field(default=None, repr=False, compare=False)

    @property
    def dtype(self) -> torch.dtype:
        return self.values.dtype

    def __getitem__(self, index) -> torch.Tensor:
        batch, positions = index
        lookup = self.lookup if self.lookup is not None else _Lookup(self.positions.tolist())
        wanted = tuple(torch.as_tensor(positions).tolist())  # a handful: looked up in Python, one sync
        rows = lookup.rows(wanted, self.values.device)
        picked = self.values[batch]  # an index drops the batch dim, a slice keeps it
        return picked if rows is None else picked.index_select(1 - self.values.dim() + picked.dim(), rows)


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
