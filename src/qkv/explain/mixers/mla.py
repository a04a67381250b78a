"""Multi-head latent attention (deepseek_v2, deepseek_v3, Kimi K2's shape) step by step.

    x ──q_a_proj──▶ c_q raw ─q_a_layernorm─▶ c_q (r_q) ──q_b_proj──▶ q_nope (h, dn) | q_rope (h, dr) ─RoPE─▶
    x ──kv_a_proj_with_mqa──▶ [ ─kv_a_layernorm─▶ c_kv (r_kv) | k_rope (dr), one for all heads ─RoPE─▶ ]
    c_kv ──kv_b_proj──▶ k_nope (h, dn) | v (h, dv)

    score[h, i, j] = scaling · (q_nope_i · k_nope_j)  +  scaling · (RoPE q_rope_i · RoPE k_rope_j)
                     └──────── content ───────────┘    └───────────── position ──────────────┘

The content part is linear in the key's latent: q_nope · k_nope_j = (W_kb,hᵀ q_nope) · c_kv_j, so it
splits over c_kv's r_kv channels (the "absorbed" query), terms that sum to it exactly.

What the layer computed is read from its own attention call (`eager_attention_forward`: the
query and key it was handed, RoPE applied, its scaling and weights); the steps before RoPE go
through the module's own submodules (`latents`: read once, here, for this record and for
`qkv.explain.score_attribution`), and the tests check they rebuild that call's q and k. RoPE at
each position is the matrix the layer's own RoPE function applies (`rotations`).
Letters: t tokens, h heads, dn/dr the content/RoPE widths, r_q/r_kv the latent widths.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from torch import nn

from qkv.errors import QkvError
from qkv.explain.mixers.capture import causal_call, causal_mask, kernel_calls
from qkv.explain.mixers.delta_rule import check_query

KERNEL = "eager_attention_forward"  # the layer must run with attn_implementation="eager"


@dataclass(frozen=True)
class Latents:
    """An MLA module's parts (`DeepseekV3Attention`, `DeepseekV2Attention` and the sparse
    layers' attention): its linear maps and the two latent norms, with their widths.

    q_proj (no query latent) or q_a_proj → q_norm → q_b_proj make h·(dn + dr) query features;
    kv_a_proj makes r_kv + dr: the latent (→ kv_norm → kv_b_proj: h·(dn + dv)) and k_rope.
    """

    heads: int
    nope: int                    # dn
    rope: int                    # dr
    value: int                   # dv
    rank: int                    # r_kv
    q_proj: nn.Linear | None     # (h·(dn + dr), E), None with a query latent
    q_a_proj: nn.Linear | None   # (r_q, E)
    q_norm: nn.Module | None     # the query latent's RMSNorm
    q_b_proj: nn.Linear | None   # (h·(dn + dr), r_q)
    kv_a_proj: nn.Linear         # (r_kv + dr, E)
    kv_norm: nn.Module           # the key/value latent's RMSNorm
    kv_b_proj: nn.Linear         # (h·(dn + dv), r_kv)

    def w_kb(self) -> torch.Tensor:
        """(h, dn, r_kv) float64: k_nope = w_kb · c_kv, per head."""
        w = self.kv_b_proj.weight.detach().double()
        return w.view(self.heads, self.nope + self.value, self.rank)[:, : self.nope]


def latents(module: nn.Module) -> Latents:
    """The parts of an MLA `module`, by the names transformers gives them."""
    dn, dr, dv = module.qk_nope_head_dim, module.qk_rope_head_dim, module.v_head_dim
    kv_b = module.kv_b_proj
    direct = module.q_lora_rank is None
    return Latents(heads=kv_b.out_features // (dn + dv), nope=dn, rope=dr, value=dv,
                   rank=module.kv_lora_rank, q_proj=module.q_proj if direct else None,
                   q_a_proj=None if direct else module.q_a_proj,
                   q_norm=None if direct else module.q_a_layernorm,
                   q_b_proj=None if direct else module.q_b_proj, kv_a_proj=module.kv_a_proj_with_mqa,
                   kv_norm=module.kv_a_layernorm, kv_b_proj=kv_b)


def rotations(module: nn.Module, hidden_states: torch.Tensor, position_embeddings) -> tuple[torch.Tensor, torch.Tensor]:
    """(R_q, R_k), each (t, dr, dr): the rotation the layer's own RoPE call applies at each
    position (q_rotated[p] = R_q[p] · q_rope[p]), read by running `module` once on
    `hidden_states` (1, t, hidden) and handing the function it called the unit vectors in the
    layer's dtype. The layer's call is told from an indexer's (which rotates (b, t, g, dr)
    queries) by its (b, h, t, dr) query. A layer that calls none of
    `qkv.hf.kernels.ROPE_FUNCTIONS` (Kimi's MLA
    layers: no positions in the score) gets the identity: whoever uses R checks what it rebuilds
    against the layer's own q and k (`score_attribution` does), so an unknown rotation is caught.
    """
    from qkv.hf.kernels import rope_functions  # imported here: qkv.hf registers with transformers

    lat, t = latents(module), hidden_states.shape[1]
    for name in rope_functions(module):
        calls = [c for c in kernel_calls(module, name, hidden_states, position_embeddings=position_embeddings,
                                         attention_mask=causal_mask(hidden_states))
                 if c.arguments.get("unsqueeze_dim", 1) == 1 and _shape(c, 0) == (1, lat.heads, t, lat.rope)]
        if calls:
            break
    else:
        unit = torch.eye(lat.rope, dtype=torch.float64).expand(t, -1, -1)  # (t, dr, dr)
        return unit, unit
    args, rope = calls[0].arguments, calls[0].function
    first, second = list(inspect.signature(rope).parameters)[:2]
    dtype = args[first].dtype
    unit = torch.eye(lat.rope, dtype=dtype)[:, None, None, :].expand(-1, 1, t, -1)  # (dr, 1, t, dr): e_i at every p
    with torch.no_grad():
        q, k = rope(**{**args, first: unit, second: unit})  # (dr, 1, t, dr): R[p] e_i
    return q[:, 0].permute(1, 2, 0).double(), k[:, 0].permute(1, 2, 0).double()  # (t, dr, dr): [p, out, in]


def _shape(call, index: int) -> tuple[int, ...]:
    value = list(call.arguments.values())[index]
    return tuple(value.shape) if isinstance(value, torch.Tensor) else ()


@dataclass(frozen=True)
class MlaScore:
    """Why head `head`'s query `query` scores key `key`: terms that sum to the layer's score."""

    head: int
    query: int
    key: int
    content: float          # scaling · q_nope · k_nope
    position: float         # scaling · RoPE(q_rope) · RoPE(k_rope)
    latent: torch.Tensor    # (r_kv,) the content over c_kv's channels: Σ = content
    score: float            # content + position: the logit before the mask and the softmax

    def to_dict(self) -> dict:
        return {"kind": "mla_score", "head": self.head, "query": self.query, "key": self.key,
                "content": self.content, "position": self.position, "latent": self.latent.tolist(),
                "score": self.score}


@dataclass(frozen=True)
class Mla:
    """One text through an MLA layer, every step in float64 (see the module docstring)."""

    kind = "mla"
    c_q_raw: torch.Tensor | None  # (t, r_q) x·W_qa, the query latent before its RMSNorm (None: q_proj direct)
    c_kv_raw: torch.Tensor     # (t, r_kv) the key/value latent before its RMSNorm
    c_q: torch.Tensor | None   # (t, r_q) the query latent after its norm
    c_kv: torch.Tensor         # (t, r_kv) the key/value latent after its norm
    q_nope: torch.Tensor       # (h, t, dn)
    q_rope: torch.Tensor       # (h, t, dr) before RoPE
    k_nope: torch.Tensor       # (h, t, dn)
    k_rope: torch.Tensor       # (t, dr) before RoPE, shared by the heads
    q_rotated: torch.Tensor    # (h, t, dr) after RoPE, as the layer's attention call got it
    k_rotated: torch.Tensor    # (t, dr) after RoPE
    value: torch.Tensor        # (h, t, dv)
    w_kb: torch.Tensor         # (h, dn, r_kv) k_nope = w_kb · c_kv, per head
    scaling: float
    weights: torch.Tensor      # (h, t, t) the layer's own attention weights

    @property
    def heads(self) -> int:
        return self.q_nope.shape[0]

    def latent_norms(self) -> dict[str, torch.Tensor]:
        """Per token, ‖c_q‖ and ‖c_kv‖ (t,) before their RMSNorms: how much each token writes into the
        latents (after the norm every token's latent has the same RMS, scaled by the norm's weight)."""
        norms = {"c_kv": self.c_kv_raw.norm(dim=-1)}
        if self.c_q_raw is not None:
            norms["c_q"] = self.c_q_raw.norm(dim=-1)
        return norms

    def content(self, head: int) -> torch.Tensor:
        """(t, t) scaling · q_nope · k_nopeᵀ, every pair (the mask not applied)."""
        return self.scaling * self.q_nope[head] @ self.k_nope[head].T

    def position(self, head: int) -> torch.Tensor:
        """(t, t) scaling · RoPE(q_rope) · RoPE(k_rope)ᵀ."""
        return self.scaling * self.q_rotated[head] @ self.k_rotated.T

    def scores(self, head: int) -> torch.Tensor:
        """(t, t) content + position: the layer's logits before the causal mask."""
        return self.content(head) + self.position(head)

    def score(self, head: int, query: int, key: int) -> MlaScore:
        """The score of (query, key) in `head` as its terms; `key` may not follow `query`."""
        t = self.c_kv.shape[0]
        check_query(query, t)
        if not 0 <= key <= query:
            raise QkvError(f"key {key} is not visible from query {query} (causal: 0 ≤ key ≤ query)")
        absorbed = self.w_kb[head].T @ self.q_nope[head, query]  # (r_kv,) the query in latent space
        latent = self.scaling * absorbed * self.c_kv[key]
        content = float(self.scaling * self.q_nope[head, query] @ self.k_nope[head, key])
        position = float(self.scaling * self.q_rotated[head, query] @ self.k_rotated[key])
        return MlaScore(head=head, query=query, key=key, content=content, position=position,
                        latent=latent, score=content + position)


def read(module: torch.nn.Module, hidden_states: torch.Tensor,
         position_embeddings) -> Mla:
    """Run an MLA layer (`DeepseekV3Attention`, `DeepseekV2Attention`) on one text, causally.

    Args:
        module: the layer's `self_attn`, its config's `_attn_implementation` "eager".
        hidden_states: (1, t, hidden) its input, after the layer's norm.
        position_embeddings: what the model hands the layer: (cos, sin) for v3, the complex
            frequencies for v2 (the model's rotary embedding of the positions 0 … t−1).
    """
    t = hidden_states.shape[1]
    call = causal_call(module, KERNEL, hidden_states, position_embeddings)
    a = call.arguments
    query, key = a["query"][0].double(), a["key"][0].double()  # (h, t, dn + dr)
    lat = latents(module)
    dn, dr, dv, h = lat.nope, lat.rope, lat.value, lat.heads
    x = hidden_states.detach()
    with torch.no_grad():
        if lat.q_proj is not None:
            c_q_raw, c_q, q = None, None, lat.q_proj(x)
        else:
            c_q_raw = lat.q_a_proj(x)
            c_q = lat.q_norm(c_q_raw)
            q = lat.q_b_proj(c_q)
        q_nope, q_rope = q[0].view(t, h, dn + dr).transpose(0, 1).double().split([dn, dr], dim=-1)
        kv_latent, k_rope = lat.kv_a_proj(x)[0].split([lat.rank, dr], dim=-1)
        c_kv = lat.kv_norm(kv_latent)
        k_nope, value = lat.kv_b_proj(c_kv).view(t, h, dn + dv).transpose(0, 1).double().split([dn, dv], dim=-1)
    return Mla(c_q_raw=None if c_q_raw is None else c_q_raw[0].double(), c_kv_raw=kv_latent.double(),
               c_q=None if c_q is None else c_q[0].double(), c_kv=c_kv.double(), q_nope=q_nope,
               q_rope=q_rope, k_nope=k_nope, k_rope=k_rope.double(), q_rotated=query[..., dn:],
               k_rotated=key[0, :, dn:], value=value, w_kb=lat.w_kb(), scaling=float(a["scaling"]),
               weights=call.result[1][0].detach().double())
