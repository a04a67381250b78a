"""Mamba-2's SSD as a matrix (mamba2, bamba, nemotron_h, falcon_h1, granitemoehybrid, zamba2).

Per head, with Δ_t = clamp(softplus(dt_t + dt_bias)), the scalar A < 0, B_t, C_t (n,) shared by
the heads of a group, and the skip D (transformers' `mamba2_chunk_scan`):

    h_t = exp(Δ_t A)·h_{t−1} + Δ_t x_t B_tᵀ,     y_t = h_t C_t + D x_t

so y = M·x with

    M[t, j] = (C_t · B_j) · exp(Σ_{j<r≤t} Δ_r A) · Δ_j  +  D·[t = j]

— `decayed_products` of C and B with G = cumsum(Δ·A), each
column scaled by its Δ_j. A row costs O(t·n).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from qkv.errors import QkvError
from qkv.explain.mixers.capture import KernelCall, kernel_call
from qkv.explain.mixers import mamba1
from qkv.explain.mixers.delta_rule import check_query
from qkv.explain.mixers.linear import EffectiveAttention, decayed_products, decayed_row

KERNEL = "mamba2_chunk_scan"


@dataclass(frozen=True)
class StateSpace(EffectiveAttention):
    """One text through a Mamba-2 mixer, per head, in float64. Letters: t, h heads, p head dim, n state."""

    kind = "mamba2"
    x: torch.Tensor        # (t, h, p) the values: the conv's output that the scan reads
    delta: torch.Tensor    # (t, h) Δ after softplus and the time-step limit
    A: torch.Tensor        # (h,) negative
    B: torch.Tensor        # (t, h, n) the group's B for each head
    C: torch.Tensor        # (t, h, n)
    D: torch.Tensor        # (h,) the skip (zeros where the layer has none)
    output: torch.Tensor   # (t, h, p) the scan's own output (before the gated norm)

    @property
    def heads(self) -> int:
        return self.x.shape[1]

    def values(self, head: int) -> torch.Tensor:
        return self.x[:, head]

    def _log_decay(self, head: int) -> torch.Tensor:
        return (self.delta[:, head] * self.A[head]).cumsum(0)  # (t,) G_t = Σ_{r≤t} Δ_r A

    def matrix(self, head: int) -> torch.Tensor:
        """(t, t) M with y = M·x for `head`: causal, signed, the D skip on its diagonal."""
        M = decayed_products(self.C[:, head], self.B[:, head], self._log_decay(head)) * self.delta[:, head]
        return M + torch.diag(self.D[head].expand(M.shape[0]))

    def row(self, head: int, query: int) -> torch.Tensor:
        """(t,) row `query` of `matrix` in O(t·n)."""
        check_query(query, self.x.shape[0])
        row = decayed_row(self.C[query, head], self.B[:, head], self._log_decay(head), query) * self.delta[:, head]
        row[query] += self.D[head]
        return row


def read(module: torch.nn.Module, hidden_states: torch.Tensor) -> StateSpace | mamba1.SelectiveScan:
    """Run a Mamba-2 mixer (`Mamba2Mixer`, `BambaMixer`, `NemotronHMamba2Mixer`, …) on one text.

    Jamba's Mamba-1 layers are their own kind (`mamba1`, registered to `mamba1.read`); one
    handed here anyway, recognised by its per-channel state (`mamba1.is_mamba1`), is read by
    `qkv.explain.mixers.mamba1`.

    Args:
        module: the mixer, in eval mode (training runs a fused kernel instead).
        hidden_states: (1, t, hidden) its input, after the layer's norm.
    """
    if mamba1.is_mamba1(module):
        return mamba1.read(module, hidden_states)
    return from_call(kernel_call(module, KERNEL, hidden_states))


def from_call(call: KernelCall, dtype: torch.dtype = torch.float64) -> StateSpace:
    """The `StateSpace` of a recorded `mamba2_chunk_scan` call, computed in `dtype`.

    The scan takes hidden_states (b, t, h, p), dt (b, t, h) before its bias and softplus, A (h,),
    B and C (b, t, g, n) shared by h // g consecutive heads, D (h,).
    """
    a = call.arguments
    if a["hidden_states"].shape[0] != 1:
        raise QkvError(f"one text at a time: the batch holds {a['hidden_states'].shape[0]}")
    if a.get("initial_states") is not None:
        raise QkvError("mamba2: the layer started from a cached state; run the whole text without a cache")
    x = a["hidden_states"][0].detach().to(dtype)  # (t, h, p)
    h = x.shape[1]
    dt = a["dt"][0].detach().to(dtype)  # (t, h)
    if a.get("dt_bias") is not None:
        dt = dt + a["dt_bias"].detach().to(dtype)
    if a.get("dt_softplus", False):
        dt = F.softplus(dt)
    low, high = a.get("dt_limit", (0.0, float("inf")))
    dt = dt.clamp(min=low, max=high)
    B, C = (a[n][0].detach().to(dtype) for n in ("B", "C"))  # (t, g, n)
    B, C = (m.repeat_interleave(h // m.shape[1], dim=1) for m in (B, C))  # (t, h, n)
    D = a.get("D")
    D = torch.zeros(h, dtype=dtype) if D is None else D.detach().to(dtype).reshape(h)
    output = call.result[0] if isinstance(call.result, tuple) else call.result
    return StateSpace(x=x, delta=dt, A=a["A"].detach().to(dtype).reshape(h), B=B, C=C, D=D,
                      output=output[0].detach().to(dtype))
