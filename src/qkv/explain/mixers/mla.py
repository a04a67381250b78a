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
through the module's own submodules, and the tests check they rebuild that call's q and k.
Letters: t tokens, h heads, dn/dr the content/RoPE widths, r_q/r_kv the latent widths.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from qkv.errors import QkvError
from qkv.explain.mixers.capture import kernel_call
from qkv.explain.mixers.delta_rule import check_query

KERNEL = "eager_attention_forward"  # the layer must run with attn_implementation="eager"


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
    b, t, _ = hidden_states.shape
    if b != 1:
        raise QkvError(f"one text at a time: the batch holds {b}")
    mask = torch.full((t, t), torch.finfo(hidden_states.dtype).min, dtype=hidden_states.dtype).triu(1)
    call = kernel_call(module, KERNEL, hidden_states, position_embeddings=position_embeddings,
                       attention_mask=mask[None, None])
    a = call.arguments
    query, key = a["query"][0].double(), a["key"][0].double()  # (h, t, dn + dr)
    dn, dr, dv = module.qk_nope_head_dim, module.qk_rope_head_dim, module.v_head_dim
    h = query.shape[0]
    x = hidden_states.detach()
    with torch.no_grad():
        if module.q_lora_rank is None:
            c_q_raw, c_q, q = None, None, module.q_proj(x)
        else:
            c_q_raw = module.q_a_proj(x)
            c_q = module.q_a_layernorm(c_q_raw)
            q = module.q_b_proj(c_q)
        q_nope, q_rope = q[0].view(t, h, dn + dr).transpose(0, 1).double().split([dn, dr], dim=-1)
        kv_latent, k_rope = module.kv_a_proj_with_mqa(x)[0].split([module.kv_lora_rank, dr], dim=-1)
        c_kv = module.kv_a_layernorm(kv_latent)
        k_nope, value = module.kv_b_proj(c_kv).view(t, h, dn + dv).transpose(0, 1).double().split([dn, dv], dim=-1)
    w_kb = module.kv_b_proj.weight.detach().double().view(h, dn + dv, module.kv_lora_rank)[:, :dn]  # (h, dn, r_kv)
    return Mla(c_q_raw=None if c_q_raw is None else c_q_raw[0].double(), c_kv_raw=kv_latent.double(),
               c_q=None if c_q is None else c_q[0].double(), c_kv=c_kv.double(), q_nope=q_nope,
               q_rope=q_rope, k_nope=k_nope, k_rope=k_rope.double(), q_rotated=query[..., dn:],
               k_rotated=key[0, :, dn:], value=value, w_kb=w_kb, scaling=float(a["scaling"]),
               weights=call.result[1][0].detach().double())
