"""How heads of different layers compose, from the weights alone (Elhage et al., 2021, "A
Mathematical Framework for Transformer Circuits", §"Composition").

In the row convention (x · W) head h reads x and writes x · W_OV^h, W_OV = W_V W_O (E, E), and
scores query x_i against key x_j as x_i W_QK x_jᵀ, W_QK = W_Q W_Kᵀ (E, E). An earlier head 1's
write can feed a later head 2's query, key or value:

```text
Q-composition  ‖W_OV¹ W_QK²‖_F   / (‖W_OV¹‖_F ‖W_QK²‖_F)
K-composition  ‖W_QK² W_OV¹ᵀ‖_F  / (‖W_OV¹‖_F ‖W_QK²‖_F)
V-composition  ‖W_OV¹ W_OV²‖_F   / (‖W_OV¹‖_F ‖W_OV²‖_F)
```

Norm gains, biases and RoPE are left out, as in the paper's definition. Every norm is taken
through (d × d) Gram matrices (‖P M Qᵀ‖²_F = tr(QᵀQ Mᵀ PᵀP M)), never an (E × E) product.

Examples:
    >>> import qkv
    >>> c = composition(qkv.load("lm"))
    >>> c.k.shape, c.top("k", 1)[0][:2]                 # (L, h, L, h): writer, then reader
    (torch.Size([2, 2, 2, 2]), ('L0.H1', 'L1.H1'))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from qkv.errors import QkvError
from qkv.explain.circuits.residual import head_name, out_weight
from qkv.explain.forward import check_model, model_name
from qkv.explain.jsonable import numbers
from qkv.explain.steps import head_slice

KINDS = ("q", "k", "v")


@dataclass(frozen=True)
class Composition:
    """Q-, K-, V-composition of every (earlier head → later head) pair.

    Fields: q, k, v (L, h, L, h) float64 — [l1, h1, l2, h2] how much head (l1, h1)'s output
    composes into (l2, h2)'s query, key or value; NaN where l2 ≤ l1.
    """

    kind: ClassVar[str] = "composition"  # its row in qkv.explain.kinds.KINDS

    model: str
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor

    def top(self, which: str = "k", n: int = 10) -> list[tuple[str, str, float]]:
        """The n strongest pairs of one kind: (writer, reader, score)."""
        if which not in KINDS:
            raise ValueError(f"which must be one of {', '.join(KINDS)}, got {which!r}")
        s = {"q": self.q, "k": self.k, "v": self.v}[which]
        flat = torch.nan_to_num(s.flatten(), nan=-1.0)
        L, H = s.shape[:2]
        out = []
        for index in flat.argsort(descending=True)[:n]:
            l1, h1, l2, h2 = torch.unravel_index(index, s.shape)
            if flat[index] < 0:
                break
            out.append((head_name(int(l1), int(h1)), head_name(int(l2), int(h2)), float(flat[index])))
        return out

    def to_dict(self) -> dict:
        return {"kind": self.kind, "model": self.model, "q": numbers(self.q),
                "k": numbers(self.k), "v": numbers(self.v),
                "top": {w: [{"writer": a, "reader": b, "score": s} for a, b, s in self.top(w)]
                        for w in KINDS}}


def head_matrices(model, layer: int):
    """Per head of `layer`: W_Q (h, E, d), W_K (h, E, d), W_V (h, E, dv), W_O (h, dv, E),
    float64 (GQA: each query head with its group's W_K, W_V)."""
    attn = model.layers[layer].self_attn
    if attn.projection_note or attn.out_proj is None:
        raise QkvError(f"{model_name(model)}: layer {layer}'s W_Q, W_K, W_V, W_O are not read as "
                       f"matrices; composition needs them")
    wq, wk, wv = [], [], []
    for h in range(attn.num_heads):
        q_rows, kv_rows = head_slice(attn, h)
        wq.append(attn.q_proj.weight[q_rows].detach().double().T)
        wk.append(attn.k_proj.weight[kv_rows].detach().double().T)
        dv = attn.out_proj.weight.shape[1] // attn.num_heads
        g = h // (attn.num_heads // attn.num_kv_heads)
        wv.append(attn.v_proj.weight[g * dv:(g + 1) * dv].detach().double().T)
    return torch.stack(wq), torch.stack(wk), torch.stack(wv), out_weight(attn).detach().double()


def _fro2(p: torch.Tensor, m: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """‖P M Qᵀ‖²_F for batches P (..., E, a), M (..., a, b), Q (..., E, b)."""
    gp, gq = p.transpose(-1, -2) @ p, q.transpose(-1, -2) @ q  # (..., a, a), (..., b, b)
    return torch.einsum("...ij,...ik,...kl,...jl->...", m, gp, m, gq).clamp_min(0)


@torch.no_grad()
def composition(model) -> Composition:
    """Every pair's Q-, K- and V-composition (see the module doc) → `Composition`."""
    check_model(model)
    mats = [head_matrices(model, ell) for ell in range(len(model.layers))]
    L, H = len(mats), mats[0][0].shape[0]
    out = {w: torch.full((L, H, L, H), float("nan"), dtype=torch.float64) for w in KINDS}
    eye = lambda n: torch.eye(n, dtype=torch.float64)  # noqa: E731
    for l1 in range(L):
        _, _, wv1, wo1 = mats[l1]  # (H, E, dv), (H, dv, E)
        ov1 = _ov_norm(wv1, wo1)  # (H,)
        for l2 in range(l1 + 1, L):
            wq2, wk2, wv2, wo2 = mats[l2]
            qk2 = _fro2(wq2, eye(wq2.shape[-1]).expand(H, -1, -1), wk2).sqrt()  # (H,)
            ov2 = _ov_norm(wv2, wo2)  # (H,)
            # pairs (writer a, reader b): broadcast (H, 1, …) against (1, H, …)
            a = lambda t: t[:, None]  # noqa: E731
            b = lambda t: t[None, :]  # noqa: E731
            qc = _fro2(a(wv1), a(wo1) @ b(wq2), b(wk2)).sqrt()
            kc = _fro2(b(wq2), b(wk2).transpose(-1, -2) @ a(wo1).transpose(-1, -2), a(wv1)).sqrt()
            vc = _fro2(a(wv1), a(wo1) @ b(wv2), b(wo2).transpose(-1, -2)).sqrt()
            out["q"][l1, :, l2] = qc / (a(ov1) * b(qk2))
            out["k"][l1, :, l2] = kc / (a(ov1) * b(qk2))
            out["v"][l1, :, l2] = vc / (a(ov1) * b(ov2))
    return Composition(model=model_name(model), **out)


def _ov_norm(wv: torch.Tensor, wo: torch.Tensor) -> torch.Tensor:
    """(H,) ‖W_V W_O‖_F per head."""
    return _fro2(wv, torch.eye(wv.shape[-1], dtype=wv.dtype).expand(wv.shape[0], -1, -1),
                 wo.transpose(-1, -2)).sqrt()


__all__ = ["Composition", "composition", "head_matrices"]
