"""Tiny transformers token mixers for tests/explain/mixers: one layer each, seeded, float64, eval.

Each builder makes the layer module alone (the mixer of a 2-layer config) with transformers'
own constructor and initialisation, and ``inputs(t)`` a seeded (1, t, hidden) input.
"""

from __future__ import annotations

import torch

HIDDEN = 32
NO_TOKENS = {"pad_token_id": None, "bos_token_id": None, "eos_token_id": None}  # a 64-token vocabulary


def inputs(t: int, *, hidden: int = HIDDEN, seed: int = 1) -> torch.Tensor:
    """(1, t, hidden) float64 standard-normal hidden states."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, t, hidden, generator=g, dtype=torch.float64)


def _ready(module: torch.nn.Module) -> torch.nn.Module:
    return module.double().eval()


def qwen3_next_delta(seed: int = 0) -> torch.nn.Module:
    """A Qwen3-Next Gated DeltaNet: 2 key heads serving 4 value heads (c = d = 8), conv of 4."""
    from transformers import Qwen3NextConfig
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet

    torch.manual_seed(seed)
    cfg = Qwen3NextConfig(vocab_size=64, hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=2,
                          num_key_value_heads=1, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
                          linear_key_head_dim=8, linear_value_head_dim=8, linear_conv_kernel_dim=4,
                          intermediate_size=64, layer_types=["linear_attention", "full_attention"], **NO_TOKENS)
    return _ready(Qwen3NextGatedDeltaNet(cfg, 0))


def qwen3_5_delta(seed: int = 0) -> torch.nn.Module:
    """A Qwen3.5 Gated DeltaNet (separate in_proj_qkv / z / b / a): 2 key heads, 2 value heads."""
    from transformers import Qwen3_5TextConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet

    torch.manual_seed(seed)
    cfg = Qwen3_5TextConfig(vocab_size=64, hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=2,
                            num_key_value_heads=1, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=2,
                            linear_key_head_dim=8, linear_value_head_dim=16, linear_conv_kernel_dim=4,
                            intermediate_size=64, layer_types=["linear_attention", "full_attention"], **NO_TOKENS)
    return _ready(Qwen3_5GatedDeltaNet(cfg, 0))


def olmo_hybrid_delta(seed: int = 0) -> torch.nn.Module:
    """An OLMo-Hybrid Gated DeltaNet with β ∈ [0, 2] (``linear_allow_neg_eigval``)."""
    from transformers import OlmoHybridConfig
    from transformers.models.olmo_hybrid.modeling_olmo_hybrid import OlmoHybridGatedDeltaNet

    torch.manual_seed(seed)
    cfg = OlmoHybridConfig(vocab_size=64, hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=2,
                           num_key_value_heads=2, intermediate_size=64, linear_num_key_heads=2,
                           linear_num_value_heads=2, linear_key_head_dim=8, linear_value_head_dim=8,
                           linear_conv_kernel_dim=4, linear_allow_neg_eigval=True,
                           layer_types=["linear_attention", "full_attention"], **NO_TOKENS)
    return _ready(OlmoHybridGatedDeltaNet(cfg, 0))


def kimi_kda(seed: int = 0) -> torch.nn.Module:
    """A Kimi-Linear KDA layer: 2 heads of 8 channels, one decay per key channel."""
    from transformers import KimiLinearConfig
    from transformers.models.kimi_linear.modeling_kimi_linear import KimiLinearDeltaAttention

    torch.manual_seed(seed)
    cfg = KimiLinearConfig(vocab_size=64, hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=2,
                           num_key_value_heads=2, intermediate_size=64, moe_intermediate_size=16,
                           linear_attn_config={"head_dim": 8, "num_heads": 2, "short_conv_kernel_size": 4,
                                               "kda_layers": [1], "full_attn_layers": [2]}, **NO_TOKENS)
    layer = KimiLinearDeltaAttention(cfg, 0)
    # transformers leaves these empty until the model's _init_weights: its own values, per its init
    with torch.no_grad():
        # rates of 0.05-0.5 (the checkpoints' 1-16 forget within a few tokens: little to test)
        layer.forget_gate.A_log.copy_(torch.log(torch.empty_like(layer.forget_gate.A_log).uniform_(0.05, 0.5)))
        layer.forget_gate.dt_bias.normal_(0, 1)
    return _ready(layer)


def mamba2_mixer(seed: int = 0, *, chunk_size: int = 16) -> torch.nn.Module:
    """A Mamba-2 mixer: 4 heads of 16, 2 groups, state 8; chunks of 16 so texts cross chunks."""
    from transformers import Mamba2Config
    from transformers.models.mamba2.modeling_mamba2 import Mamba2Mixer

    torch.manual_seed(seed)
    cfg = Mamba2Config(vocab_size=64, hidden_size=HIDDEN, num_hidden_layers=2, num_heads=4, head_dim=16,
                       n_groups=2, state_size=8, expand=2, chunk_size=chunk_size, conv_kernel=4, **NO_TOKENS)
    return _ready(Mamba2Mixer(cfg, 0))


def bamba_mixer(seed: int = 0) -> torch.nn.Module:
    """A Bamba mixer (Mamba-2 with a conv bias): 4 heads of 16, 1 group, state 8, chunks of 8."""
    from transformers import BambaConfig
    from transformers.models.bamba.modeling_bamba import BambaMixer

    torch.manual_seed(seed)
    cfg = BambaConfig(vocab_size=64, hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, intermediate_size=64, attn_layer_indices=[1], mamba_n_heads=4,
                      mamba_d_head=16, mamba_n_groups=1, mamba_d_state=8, mamba_chunk_size=8, **NO_TOKENS)
    return _ready(BambaMixer(cfg, 0))


def minimax_lightning(seed: int = 0, *, block_size: int = 8, hidden_act: str = "silu",
                      head_dim: int = 16, hidden: int = HIDDEN) -> torch.nn.Module:
    """A MiniMax lightning-attention layer (layer 0 of 2): 2 heads; blocks of 8 so texts cross blocks."""
    from transformers import MiniMaxConfig
    from transformers.models.minimax.modeling_minimax import MiniMaxLightningAttention

    torch.manual_seed(seed)
    cfg = MiniMaxConfig(vocab_size=64, hidden_size=hidden, num_hidden_layers=2, num_attention_heads=2,
                        num_key_value_heads=2, head_dim=head_dim, intermediate_size=64, block_size=block_size,
                        hidden_act=hidden_act, layer_types=["linear_attention", "full_attention"],
                        num_local_experts=2, num_experts_per_tok=1, **NO_TOKENS)
    return _ready(MiniMaxLightningAttention(cfg, 0))


def in_dtype(record, dtype: torch.dtype):
    """``record`` (a mixer's dataclass) with every tensor field cast to ``dtype``: the same method
    run one precision down, the ``plain``/``low`` computation of tests/tolerance.py."""
    import dataclasses

    return dataclasses.replace(record, **{f.name: getattr(record, f.name).to(dtype)
                                          for f in dataclasses.fields(record)
                                          if isinstance(getattr(record, f.name), torch.Tensor)})


def one_hot_values(t: int, heads: int) -> torch.Tensor:
    """(1, t, heads, t): token j's value is the j-th basis vector, in every head — so a layer's
    output o_i = Σ_j M[i, j] v_j is row i of M itself."""
    return torch.eye(t, dtype=torch.float64)[None, :, None, :].expand(1, t, heads, t).contiguous()


def deepseek_mla(version: int = 3, seed: int = 0, *, q_lora_rank: int | None = 24):
    """A DeepSeek MLA attention layer with eager attention, and its rotary embedding module:
    4 heads, q latent 24 (None: q_proj direct), kv latent 16, content 8 + RoPE 4 per head, v 8."""
    if version == 3:
        from transformers import DeepseekV3Config as Config
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
            DeepseekV3Attention as Attention, DeepseekV3RotaryEmbedding as Rotary)
    else:
        from transformers import DeepseekV2Config as Config
        from transformers.models.deepseek_v2.modeling_deepseek_v2 import (
            DeepseekV2Attention as Attention, DeepseekV2RotaryEmbedding as Rotary)
    torch.manual_seed(seed)
    cfg = Config(vocab_size=64, hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=4, intermediate_size=64, moe_intermediate_size=16, n_routed_experts=2,
                 num_experts_per_tok=1, q_lora_rank=q_lora_rank, kv_lora_rank=16, qk_nope_head_dim=8,
                 qk_rope_head_dim=4, v_head_dim=8, first_k_dense_replace=2, **NO_TOKENS)
    cfg._attn_implementation = "eager"
    layer = _ready(Attention(cfg, 0))
    with torch.no_grad():  # the norms' weights start at 1: make them count
        for norm in (layer.kv_a_layernorm, layer.q_a_layernorm):
            if norm is not None:
                norm.weight.uniform_(0.5, 1.5)
    return layer, Rotary(cfg)


def rotary_inputs(rotary, x: torch.Tensor):
    """What the model hands its layers for positions 0 … t−1: (cos, sin), or v2's complex frequencies."""
    positions = torch.arange(x.shape[1])[None]
    return rotary(x, positions)


def diffllama_attention(seed: int = 0, *, layer_idx: int = 1, kv_heads: int = 2):
    """A DiffLlama attention layer (eager) and its rotary module: 4 heads (2 differential) of 8."""
    from transformers import DiffLlamaConfig
    from transformers.models.diffllama.modeling_diffllama import DiffLlamaAttention, DiffLlamaRotaryEmbedding

    torch.manual_seed(seed)
    cfg = DiffLlamaConfig(vocab_size=64, hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=kv_heads, intermediate_size=64, lambda_std_dev=0.3, **NO_TOKENS)
    cfg._attn_implementation = "eager"
    return _ready(DiffLlamaAttention(cfg, layer_idx)), DiffLlamaRotaryEmbedding(cfg)


def qwen3_next_attention(seed: int = 0):
    """A Qwen3-Next full-attention layer (eager; output gate; biases, so a gate can be shut) and its
    rotary module: 4 heads of 8."""
    from transformers import Qwen3NextConfig
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextAttention, Qwen3NextRotaryEmbedding

    torch.manual_seed(seed)
    cfg = Qwen3NextConfig(vocab_size=64, hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, head_dim=8, intermediate_size=64, attention_bias=True,
                          layer_types=["linear_attention", "full_attention"], **NO_TOKENS)
    cfg._attn_implementation = "eager"
    return _ready(Qwen3NextAttention(cfg, 1)), Qwen3NextRotaryEmbedding(cfg)


def sparse_attention(kind: str = "deepseek_v32", seed: int = 0, *, topk: int = 5):
    """A DeepSeek-V3.2 / GLM-MoE-DSA sparse attention layer (eager) and its rotary module:
    MLA of 4 heads, an indexer of 2 heads × 8 (RoPE 4) keeping ``topk`` keys per query."""
    if kind == "deepseek_v32":
        from transformers import DeepseekV32Config as Config
        from transformers.models.deepseek_v32.modeling_deepseek_v32 import (
            DeepseekV32Attention as Attention, DeepseekV32RotaryEmbedding as Rotary)
    else:
        from transformers import GlmMoeDsaConfig as Config
        from transformers.models.glm_moe_dsa.modeling_glm_moe_dsa import (
            GlmMoeDsaAttention as Attention, GlmMoeDsaRotaryEmbedding as Rotary)
    torch.manual_seed(seed)
    cfg = Config(vocab_size=64, hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=4, intermediate_size=64, moe_intermediate_size=16, n_routed_experts=2,
                 num_experts_per_tok=1, q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4,
                 v_head_dim=8, index_topk=topk, index_head_dim=8, index_n_heads=2, **NO_TOKENS)
    cfg._attn_implementation = "eager"
    return _ready(Attention(cfg, 0)), Rotary(cfg)


def lfm2_short_conv(seed: int = 0, *, bias: bool = False) -> torch.nn.Module:
    """An LFM2 gated short convolution: 32 channels, kernel 3."""
    from transformers import Lfm2Config
    from transformers.models.lfm2.modeling_lfm2 import Lfm2ShortConv

    torch.manual_seed(seed)
    cfg = Lfm2Config(vocab_size=64, hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=2,
                     num_key_value_heads=2, intermediate_size=64, conv_L_cache=3, conv_bias=bias,
                     layer_types=["conv", "full_attention"], **NO_TOKENS)
    return _ready(Lfm2ShortConv(cfg, 0))
