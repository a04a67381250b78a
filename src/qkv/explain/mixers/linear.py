"""Decayed linear attention: the score every linear and state-space mixer starts from.

For queries a_i and keys b_j (per channel c) and a cumulative log decay G (t,) or (t, c),

    L[i, j] = Σ_c a_ic · b_jc · exp(G_ic − G_jc)      for j ≤ i, else 0

is the (t, t) matrix with o = L·v for the plain recurrence S_i = S_{i−1}·diag(exp g_i) + v_i b_iᵀ,
o_i = S_i a_i (G = cumsum g). Lightning attention is L with G = −slope·i; Mamba-2's SSD is L of
C and B with G = cumsum(Δ·A), times Δ_j; the delta rule solves a system built of two of them.
exp(G_i − G_j) is formed from the difference (≤ 1 for decays), never as exp(G_i)·exp(−G_j),
which overflows on long texts. Letters: t tokens, c channels of a query/key.
"""

from __future__ import annotations

import torch

class EffectiveAttention:
    """What a mixer's record answers when its map is an effective M, o = M·v (a linear or
    state-space mixer's, differential attention's); every such record derives from it
    (letters: t tokens, d value channels).

    A record has `kind` (its mixer kind's name), `output` (t, h, d) the layer's own mixing
    output (before its gate / norm / projection), `heads`, `values(head)` (t, d) the v that M
    mixes, `matrix(head)` (t, t) M, and for the linear and state-space kinds `row(head, query)`
    (t,) M[query] in O(t · state). What the base gives, each record overriding where it differs:
    `rebuilt(head)` and `map_lambda()`.
    """

    kind: str
    output: torch.Tensor

    def matrix(self, head: int) -> torch.Tensor:
        raise NotImplementedError

    def values(self, head: int) -> torch.Tensor:
        raise NotImplementedError

    def rebuilt(self, head: int) -> torch.Tensor:
        """(t, d) head `head`'s output as its map rebuilds it: M·v, plus whatever the layer adds
        that no value carries (a short convolution's bias through its output gate)."""
        return self.matrix(head) @ self.values(head)

    def map_lambda(self) -> float | None:
        """λ where M = A₁ − λ·A₂ combines two softmax maps (differential attention), else None."""
        return None


# Rows of a per-channel product taken at once: the (rows, t, c) decay tensor stays ≤ 2²⁴ numbers.
_BLOCK_NUMBERS = 1 << 24


def decayed_products(a: torch.Tensor, b: torch.Tensor, log_decay: torch.Tensor, *,
                     strict: bool = False) -> torch.Tensor:
    """L[i, j] = Σ_c a_ic b_jc exp(G_ic − G_jc) on and below the diagonal (below only if `strict`).

    Args:
        a: (t, c) queries. b: (t, c) keys.
        log_decay: G, the cumulative log decay: (t,) one per token or (t, c) one per channel.
        strict: leave the diagonal out too (j < i).

    Returns:
        (t, t), zero above the diagonal.

    Examples:
        >>> a = b = torch.ones(3, 1, dtype=torch.float64)
        >>> decayed_products(a, b, torch.tensor([0.0, -1.0, -2.0], dtype=torch.float64))[2]
        tensor([0.1353, 0.3679, 1.0000], dtype=torch.float64)
    """
    t = a.shape[0]
    keep = torch.ones(t, t, dtype=torch.bool, device=a.device).tril(-1 if strict else 0)
    if log_decay.dim() == 1:
        gap = (log_decay[:, None] - log_decay[None, :]).masked_fill(~keep, float("-inf"))  # (t, t)
        return (a @ b.T) * gap.exp()
    out = torch.zeros(t, t, dtype=a.dtype, device=a.device)
    rows = max(1, _BLOCK_NUMBERS // max(1, t * a.shape[1]))
    for start in range(0, t, rows):
        stop = min(t, start + rows)
        gap = log_decay[start:stop, None, :] - log_decay[None, :stop, :]  # (r, s, c)
        gap = gap.masked_fill(~keep[start:stop, :stop, None], float("-inf"))
        out[start:stop, :stop] = torch.einsum("rc,sc,rsc->rs", a[start:stop], b[:stop], gap.exp())
    return out


def decayed_row(a_i: torch.Tensor, b: torch.Tensor, log_decay: torch.Tensor, i: int) -> torch.Tensor:
    """Row `i` of `decayed_products` in O(t·c): (t,), zero after i.

    Args:
        a_i: (c,) the query of row i. b: (t, c) keys. log_decay: G, (t,) or (t, c).
    """
    out = torch.zeros(b.shape[0], dtype=b.dtype, device=b.device)
    gap = (log_decay[i] - log_decay[: i + 1]).exp()  # (i+1,) or (i+1, c)
    if gap.dim() == 1:
        out[: i + 1] = (b[: i + 1] @ a_i) * gap
    else:
        out[: i + 1] = (b[: i + 1] * gap) @ a_i
    return out
