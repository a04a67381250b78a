"""An MLA head's query and key by component: the latents, their norms and RoPE, each linear.

Multi-head latent attention (DeepSeek V2/V3, the sparse layers' attention of V3.2 and GLM-DSA;
`qkv.explain.mixers.mla` records its steps) makes each head's query and key from the layer's
input x (after the layer's norm) through low-rank latents:

```text
q = W_qb · n_q(W_qa · x)             → q_nope (dn) | q_rope (dr) → R_i · q_rope
kv = W_kva · x  →  n_kv(latent) | k_rope (dr, one for all heads)  → R_j · k_rope
k_nope = W_kb,h · n_kv(latent)
score = scale · q_nope · k_nope  +  scale · (R_i q_rope) · (R_j k_rope)
        └──── content ─────────┘     └────────── position ──────────┘
```

n_q, n_kv (RMSNorms) are frozen at the scale the forward computed (`norms.linearise`) and R_p is
the rotation the layer's own RoPE function applies at position p (`mla.rotations`; the identity
in Kimi's MLA layers, which have no RoPE), so each
side is linear in x and splits over x's components as the softmax path's does (`score.side`).
`side` returns the head's [nope | rotated rope] features per component — the layout the
attention call got — so the forward's q and k check them as they check any head's.

Examples:
    On a DeepSeek-V3 checkpoint (`tests/hf/hybrids.py` builds a tiny one):

    ```python
    r = qkv.explain.score_attribution(model, text, layer=1, head=0, token=5, key=2)
    r.latent.content, r.latent.position  # the score's content and RoPE parts
    ```
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from qkv.explain.circuits.norms import linearise
from qkv.explain.mixers import mla


@contextmanager
def handed(module: torch.nn.Module):
    """For the forward run inside the `with`: a dict whose `"position_embeddings"` is what the
    model handed `module` (an MLA layer: (cos, sin), or DeepSeek-V2's complex frequencies); the
    hook is removed when the `with` ends."""
    given: dict = {}

    def keep(_module, args, kwargs):
        given["position_embeddings"] = kwargs.get("position_embeddings")

    hook = module.register_forward_pre_hook(keep, with_kwargs=True)
    try:
        yield given
    finally:
        hook.remove()


def _linear(proj: torch.nn.Linear, parts: torch.Tensor) -> torch.Tensor:
    """(C, n, out) the parts (C, n, in) through `proj` in float64, its bias in the last (`bias`)
    component."""
    out = parts @ proj.weight.detach().double().T
    if proj.bias is not None:
        out[-1] += proj.bias.detach().double()
    return out


def _frozen(norm: torch.nn.Module, parts: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(C, n, r) the parts of the vectors a latent norm read, after it, at the forward's scale."""
    lin = linearise(norm, parts.sum(0).to(dtype))
    out = lin.apply(parts)
    out[-1] += lin.shift
    return out


def side(lat: mla.Latents, parts: torch.Tensor, positions: torch.Tensor, head: int, which: str,
         rotation: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(C, n, dn + dr) float64: head `head`'s query (`which="q"`) or key (`"k"`) at `positions`
    (n,) per component, [nope | rotated rope].

    Args:
        lat: the layer's `mla.Latents`.
        parts: (C, n, E) the layer's input after its norm, by component (`bias` last).
        rotation: (t, dr, dr) that side's R_p (`mla.rotations`).
        dtype: the forward's, at which the latent norms ran.
    """
    C, n, _ = parts.shape
    dn, dr = lat.nope, lat.rope
    if which == "q":
        if lat.q_proj is not None:
            q = _linear(lat.q_proj, parts)
        else:
            q = _linear(lat.q_b_proj, _frozen(lat.q_norm, _linear(lat.q_a_proj, parts), dtype))
        nope, rope = q.view(C, n, lat.heads, dn + dr)[:, :, head].split([dn, dr], dim=-1)
    else:
        latent, rope = _linear(lat.kv_a_proj, parts).split([lat.rank, dr], dim=-1)  # (C, n, r_kv), (C, n, dr)
        nope = _frozen(lat.kv_norm, latent, dtype) @ lat.w_kb()[head].T  # (C, n, dn)
    rotated = torch.einsum("noi,cni->cno", rotation[positions], rope)  # (C, n, dr)
    return torch.cat([nope, rotated], dim=-1)


__all__ = ["handed", "side"]
