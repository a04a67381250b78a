"""Mamba-1's selective scan as a matrix per channel (jamba's Mamba layers).

Unlike Mamba-2's SSD (`qkv.explain.mixers.mamba2`: one scalar A and Δ per head), Mamba-1 keeps a
state of n numbers for every one of its d inner channels, each with its own decays A_c (n,) and
time step Δ_{t,c}; B_t, C_t (n,) are shared by the channels (transformers' `mamba_selective_scan`):

    h_{t,c} = exp(Δ_{t,c} A_c) ⊙ h_{t−1,c} + Δ_{t,c} x_{t,c} B_t,     y_{t,c} = C_t · h_{t,c} + D_c x_{t,c}

so each channel c is its own mixer, y_c = M_c·x_c, with

    M_c[t, j] = Σ_k C_tk B_jk exp(Σ_{j<r≤t} Δ_{r,c} A_ck) · Δ_{j,c}  +  D_c·[t = j]

— `decayed_products` of C and B with a per-state-channel log decay G_c = cumsum(Δ_c ⊗ A_c) (t, n),
each column scaled by Δ_{j,c}. A row costs O(t·n). The layer gates the scan's output by silu(z)
inside the same call; `output` is the scan without that gate (the same function, run again on the
recorded arguments with z left out). Letters: t tokens, d inner channels, n state size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from qkv.errors import QkvError
from qkv.explain.mixers.capture import KernelCall, kernel_call
from qkv.explain.mixers.delta_rule import check_query
from qkv.explain.mixers.linear import EffectiveAttention, decayed_products, decayed_row
from qkv.models.protocol import MixerKind

KERNEL = "mamba_selective_scan"


@dataclass(frozen=True)
class SelectiveScan(EffectiveAttention):
    """One text through a Mamba-1 mixer, per inner channel (its "heads"), in float64."""

    kind = "mamba2"        # the protocol's MixerKind of every Mamba layer (hf/mixers.py)
    x: torch.Tensor        # (t, d) the values: the conv's activated output that the scan reads
    delta: torch.Tensor    # (t, d) Δ after its bias and softplus
    A: torch.Tensor        # (d, n) negative
    B: torch.Tensor        # (t, n)
    C: torch.Tensor        # (t, n)
    D: torch.Tensor        # (d,) the skip (zeros where the layer has none)
    output: torch.Tensor   # (t, d, 1) the scan's own output, before the silu(z) gate

    @property
    def heads(self) -> int:
        return self.x.shape[1]

    def values(self, head: int) -> torch.Tensor:
        """(t, 1) channel `head`'s values."""
        return self.x[:, head: head + 1]

    def _log_decay(self, head: int) -> torch.Tensor:
        return (self.delta[:, head, None] * self.A[head]).cumsum(0)  # (t, n) G_tk = Σ_{r≤t} Δ_r A_k

    def matrix(self, head: int) -> torch.Tensor:
        """(t, t) M_c with y_c = M_c·x_c for channel `head`: causal, signed, D_c on its diagonal."""
        M = decayed_products(self.C, self.B, self._log_decay(head)) * self.delta[:, head]
        return M + torch.diag(self.D[head].expand(M.shape[0]))

    def row(self, head: int, query: int) -> torch.Tensor:
        """(t,) row `query` of `matrix` in O(t·n)."""
        check_query(query, self.x.shape[0])
        row = decayed_row(self.C[query], self.B, self._log_decay(head), query) * self.delta[:, head]
        row[query] += self.D[head]
        return row


def is_mamba1(module: torch.nn.Module) -> bool:
    """Whether `module` is a Mamba-1 mixer (its `A_log` per channel and state, (d, n), not
    Mamba-2's (h,)): the kind the model side recognises it as (`qkv.hf.mixers.stateful_kind`)."""
    from qkv.hf.mixers import stateful_kind  # imported here: qkv.hf registers with transformers

    return stateful_kind(module) is MixerKind.MAMBA1


def read(module: torch.nn.Module, hidden_states: torch.Tensor) -> SelectiveScan:
    """Run a Mamba-1 mixer (`JambaMambaMixer`) on one text and return what its scan mixed.

    Args:
        module: the mixer, in eval mode, without a cache.
        hidden_states: (1, t, hidden) its input, after the layer's norm.

    Raises:
        QkvError: a batch of more than one text; the scan's gate is not the last step of its call.
    """
    call = kernel_call(module, KERNEL, hidden_states)
    a = call.arguments
    with torch.no_grad():
        ungated = call.function(**{**a, "z": None, "return_last_state": False})  # (1, d, t)
    gated = call.result[0] if isinstance(call.result, tuple) else call.result
    z = a.get("z")
    if z is not None and not torch.equal(ungated * F.silu(z), gated):
        raise QkvError(f"{type(module).__name__}: its scan without the gate, times silu(z), is not the "
                       f"layer's own output; the gate is not the scan's last step")
    return from_call(call, ungated=ungated)


def from_call(call: KernelCall, dtype: torch.dtype = torch.float64, *,
              ungated: torch.Tensor | None = None) -> SelectiveScan:
    """The `SelectiveScan` of a recorded `mamba_selective_scan` call, computed in `dtype`.

    The scan takes hidden_states (b, d, t), dt (b, d, t) before its bias and softplus, A (d, n),
    B and C (b, n, t), D (d,), the gate z (b, d, t), delta_bias (d,). `ungated` (1, d, t) is the
    scan's output without z (`read` runs it); None: the call's own result (a call without z).
    """
    a = call.arguments
    if a["hidden_states"].shape[0] != 1:
        raise QkvError(f"one text at a time: the batch holds {a['hidden_states'].shape[0]}")
    if ungated is None:
        if a.get("z") is not None:
            raise QkvError("mamba1: the call gated its output by z; pass the scan's output without it")
        ungated = call.result[0] if isinstance(call.result, tuple) else call.result
    x = a["hidden_states"][0].detach().to(dtype).T  # (t, d)
    d = x.shape[1]
    dt = a["dt"][0].detach().to(dtype).T  # (t, d)
    if a.get("delta_bias") is not None:
        dt = dt + a["delta_bias"].detach().to(dtype)
    if a.get("delta_softplus", False):
        dt = F.softplus(dt)
    B, C = (a[n][0].detach().to(dtype).T for n in ("B", "C"))  # (t, n)
    D = a.get("D")
    D = torch.zeros(d, dtype=dtype) if D is None else D.detach().to(dtype).reshape(d)
    return SelectiveScan(x=x, delta=dt, A=a["A"].detach().to(dtype), B=B, C=C, D=D,
                         output=ungated[0].detach().to(dtype).T[:, :, None])
