"""The gated delta rule as a matrix: o = M·v for Gated DeltaNet and KDA, exactly.

The recurrence (transformers' `torch_recurrent_gated_delta_rule`, the state S (d, c) per head):

    S_t = S_{t−1} · D_t · (I − β_t k_t k_tᵀ) + β_t v_t k_tᵀ,      o_t = S_t q_t

with q, k L2-normalised (eps 1e-6 under the root, as the kernels do), q scaled by c^(−1/2),
D_t = diag(exp g_t): g_t one number per head (Gated DeltaNet) or one per key channel (KDA).
Unrolled, o_i = Σ_j M[i, j] v_j with

    M[i, j] = β_j · k_jᵀ · A_{j+1} ⋯ A_i · q_i,      A_r = D_r (I − β_r k_r k_rᵀ),   j ≤ i.

Whole matrix (the UT form of the chunked kernels, one chunk): with G = cumsum g,
L = decayed q·k (`decayed_products`, diagonal kept) and
T = I + diag(β)·(decayed k·k, strictly below), the new values U solve T·U = diag(β)·V and
o = L·U, so M = L·T⁻¹·diag(β) — one triangular solve, O(t²·c + t³).

One row (`DeltaRule.row`): u = q_i, then for j = i, i−1, …, 0: M[i, j] = β_j k_jᵀu and
u ← A_j u — the recurrence run backwards on one vector, O(t + c) memory; done a chunk of tokens
at a time (one small triangular solve per chunk) so a 64k-token row is ~1,000 solves, not
64,000 Python steps.
‖A_r‖ ≤ 1 for β ∈ [0, 2] and unit k, so the sweep does not amplify rounding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from qkv.errors import QkvError
from qkv.explain.mixers.capture import KernelCall
from qkv.explain.mixers.linear import EffectiveAttention, decayed_products

L2_EPS = 1e-6  # under the square root, as transformers' l2norm and FLA's kernels add it


@dataclass(frozen=True)
class DeltaRule(EffectiveAttention):
    """One text through a delta-rule layer, per value head, in float64.

    Letters: t tokens, h value heads, c key channels, d value channels.
    """

    kind: str                 # "gated_deltanet" or "kda" (the MixerKind name)
    query: torch.Tensor       # (t, h, c) normalised and scaled, as the state reads it
    key: torch.Tensor         # (t, h, c) normalised
    value: torch.Tensor       # (t, h, d) after the short convolution
    log_decay: torch.Tensor   # (t, h) Gated DeltaNet, (t, h, c) KDA: g, the log of each step's decay
    beta: torch.Tensor        # (t, h) the write strength
    output: torch.Tensor      # (t, h, d) the layer's own kernel output (before its gated norm)

    @property
    def heads(self) -> int:
        return self.value.shape[1]

    def values(self, head: int) -> torch.Tensor:
        """(t, d) the values that M mixes."""
        return self.value[:, head]

    def matrix(self, head: int) -> torch.Tensor:
        """(t, t) M with o = M·v for `head`: signed, rows need not sum to 1, zero above the diagonal."""
        q, k, beta = self.query[:, head], self.key[:, head], self.beta[:, head]  # (t, c), (t, c), (t,)
        G = self.log_decay[:, head].cumsum(0)  # (t,) or (t, c)
        L = decayed_products(q, k, G)
        T = torch.eye(len(beta), dtype=q.dtype) + beta[:, None] * decayed_products(k, k, G, strict=True)
        return torch.linalg.solve_triangular(T, L, upper=False, left=False, unitriangular=True) * beta

    def row(self, head: int, query: int, *, chunk: int | None = None) -> torch.Tensor:
        """(t,) row `query` of `matrix` by the backward sweep: O(t·c·chunk), no (t, t) matrix.

        `chunk`: tokens per step of the sweep; by default 64 for one decay per head and 16 for one
        per key channel, whose chunk costs chunk²·c exponentials (measured at 64k tokens, c = 128,
        one thread of a loaded machine: 12.6 s in chunks of 16, 16.6 s of 8, 32.9 s of 64).

        The sweep u ← A_j u runs `chunk` tokens at a time (see the module docstring): within a
        chunk [s, e], w_j = k_jᵀ u^(j) solve (I + Aᵀ) w = b with A the chunk's β-scaled decayed
        k·k (strictly lower, as in `matrix`) and b_j = k_jᵀ exp(G_e − G_j) u^(e); then
        M[query, j] = β_j w_j and u^(s−1) = exp(G_e − G_{s−1}) u^(e) − Σ_r exp(G_r − G_{s−1}) β_r
        w_r k_r.
        """
        check_query(query, self.value.shape[0])
        if chunk is None:
            chunk = 16 if self.log_decay.dim() == 3 else 64
        if chunk < 1:
            raise ValueError(f"chunk must be a positive number of tokens, got {chunk}")
        k, beta = self.key[: query + 1, head], self.beta[: query + 1, head]  # (i+1, c), (i+1,)
        g = self.log_decay[: query + 1, head]  # (i+1,) or (i+1, c)
        out = torch.zeros(self.value.shape[0], dtype=k.dtype)
        u = self.query[query, head]  # (c,) u^(e), e = query first
        e = query
        while e >= 0:
            s = max(0, e - chunk + 1)
            kc, bc, G = k[s: e + 1], beta[s: e + 1], g[s: e + 1].cumsum(0)  # G_r − G_{s−1}, (C,) or (C, c)
            A = bc[:, None] * decayed_products(kc, kc, G, strict=True)  # (C, C)
            to_end = (G[-1] - G).exp()  # exp(G_e − G_j)
            b = (kc * to_end) @ u if G.dim() == 2 else (kc @ u) * to_end  # (C,)
            eye = torch.eye(len(bc), dtype=k.dtype)
            w = torch.linalg.solve_triangular(eye + A.T, b[:, None], upper=True, unitriangular=True)[:, 0]
            out[s: e + 1] = bc * w
            from_start = G.exp()  # exp(G_r − G_{s−1}), (C,) or (C, c)
            written = (bc * w)[:, None] * kc  # (C, c)
            u = from_start[-1] * u - (written * (from_start if G.dim() == 2 else from_start[:, None])).sum(0)
            e = s - 1
        return out


def check_query(query: int, t: int) -> None:
    if not 0 <= query < t:
        raise QkvError(f"query {query} is out of range for a text of {t} tokens")


def l2_normalise(x: torch.Tensor) -> torch.Tensor:
    """x / sqrt(Σ x² + 1e-6) over the last axis — the kernels' normalisation, in float64."""
    return x / ((x * x).sum(-1, keepdim=True) + L2_EPS).sqrt()


def from_call(kind: str, call: KernelCall, dtype: torch.dtype = torch.float64) -> DeltaRule:
    """The `DeltaRule` of a recorded `*_delta_rule` / `*_kimi_delta_attention` call.

    Both kernels take query, key (b, t, hk, c), value (b, t, h, d), g (b, t, h) or (b, t, h, c)
    and beta (b, t, h); key heads serve h // hk consecutive value heads. `dtype`: what the
    normalisation and every later step compute in (float64; the tests' float32 twin).
    """
    a = call.arguments
    query, key, value, g, beta = (a[n].detach().to(dtype) for n in ("query", "key", "value", "g", "beta"))
    if query.shape[0] != 1:
        raise QkvError(f"one text at a time: the batch holds {query.shape[0]}")
    if a.get("initial_state") is not None:
        raise QkvError(f"{kind}: the layer started from a cached state; run the whole text without a cache")
    h, hk = value.shape[2], key.shape[2]
    query, key = (x[0].repeat_interleave(h // hk, dim=1) for x in (query, key))  # (t, h, c)
    if a.get("use_qk_l2norm_in_kernel", False):
        query, key = l2_normalise(query), l2_normalise(key)
    output = call.result[0] if isinstance(call.result, tuple) else call.result
    return DeltaRule(kind=kind, query=query * query.shape[-1] ** -0.5, key=key, value=value[0],
                     log_decay=g[0], beta=beta[0], output=output[0].detach().to(dtype))
