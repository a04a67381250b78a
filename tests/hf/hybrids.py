"""Tiny random checkpoints of 2026's hybrid architectures (issue 39): linear-attention, SSM,
latent (MLA), sparse (indexed), differential and gated attention beside softmax layers.

Each entry: config class, model class, the config beyond :data:`BASE` (4 layers, hidden 32) and
the mixer kind of each of the 4 layers as transformers builds them. Shared by tests/hf/ and
``benchmarks/hf_common_tests.py``.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

BASE = dict(vocab_size=99, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
            pad_token_id=0, bos_token_id=1, eos_token_id=2)
S, G, M = "softmax", "gated_deltanet", "mamba2"

# Gated DeltaNet sizes (Qwen3-Next / 3.5, OLMo hybrid): 2 key heads, 4 value heads
GDN = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
           linear_value_head_dim=8, linear_conv_kernel_dim=4)
MAMBA = dict(mamba_n_heads=4, mamba_d_head=16, mamba_n_groups=1, mamba_d_state=8, mamba_d_conv=4,
             mamba_expand=2, mamba_chunk_size=4)
MLA = dict(kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=4, qk_nope_head_dim=8, v_head_dim=8,
           num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
           moe_intermediate_size=16, n_shared_experts=1, first_k_dense_replace=1)
HYBRID_LAYERS = ["linear_attention", "full_attention", "linear_attention", "full_attention"]

HYBRIDS = {  # model_type: (config class, model class, extra config, mixer kind per layer)
    "qwen3_5": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM",
                GDN | dict(head_dim=8, layer_types=HYBRID_LAYERS), [G, S, G, S]),
    "qwen3_5_moe": ("Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM",
                    GDN | dict(head_dim=8, layer_types=HYBRID_LAYERS, num_experts=4,
                               num_experts_per_tok=2, moe_intermediate_size=16,
                               shared_expert_intermediate_size=16), [G, S, G, S]),
    "qwen3_next": ("Qwen3NextConfig", "Qwen3NextForCausalLM",
                   GDN | dict(head_dim=8, layer_types=HYBRID_LAYERS, num_experts=4,
                              num_experts_per_tok=2, moe_intermediate_size=16,
                              shared_expert_intermediate_size=16), [G, S, G, S]),
    "minimax": ("MiniMaxConfig", "MiniMaxForCausalLM",
                dict(head_dim=8, layer_types=HYBRID_LAYERS, num_local_experts=4,
                     num_experts_per_tok=2, block_size=4), ["lightning", S, "lightning", S]),
    "deepseek_v2": ("DeepseekV2Config", "DeepseekV2ForCausalLM", MLA, ["mla"] * 4),
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM", MLA, ["mla"] * 4),
    "diffllama": ("DiffLlamaConfig", "DiffLlamaForCausalLM", dict(head_dim=8), ["differential"] * 4),
    "lfm2": ("Lfm2Config", "Lfm2ForCausalLM",
             dict(layer_types=["conv", "full_attention", "conv", "full_attention"], conv_L_cache=3),
             ["short_conv", S, "short_conv", S]),
    "kimi_linear": ("KimiLinearConfig", "KimiLinearForCausalLM",
                    MLA | dict(linear_head_dim=8, linear_num_heads=4, linear_conv_kernel_dim=4,
                               num_local_experts=4, layer_types=HYBRID_LAYERS),
                    ["kda", "mla", "kda", "mla"]),
    "olmo_hybrid": ("OlmoHybridConfig", "OlmoHybridForCausalLM",
                    GDN | dict(layer_types=HYBRID_LAYERS), [G, S, G, S]),
    "nemotron_h": ("NemotronHConfig", "NemotronHForCausalLM",
                   dict(layers_block_type=["mamba", "attention", "mlp", "mamba"], head_dim=8,
                        mamba_num_heads=4, mamba_head_dim=16, n_groups=1, ssm_state_size=8,
                        conv_kernel=4, expand=2, chunk_size=4, use_mamba_kernels=False),
                   [M, S, (), M]),  # layer 2: a feed-forward only
    "falcon_h1": ("FalconH1Config", "FalconH1ForCausalLM",  # attention and Mamba-2 side by side
                  MAMBA | dict(head_dim=8, mamba_d_ssm=64), [(S, M)] * 4),
    "granitemoehybrid": ("GraniteMoeHybridConfig", "GraniteMoeHybridForCausalLM",
                         MAMBA | dict(layer_types=["mamba", "attention", "mamba", "attention"],
                                      num_local_experts=4, num_experts_per_tok=2,
                                      shared_intermediate_size=16), [M, S, M, S]),
    "bamba": ("BambaConfig", "BambaForCausalLM", MAMBA | dict(attn_layer_indices=[1, 3]), [M, S, M, S]),
    "jamba": ("JambaConfig", "JambaForCausalLM",
              dict(attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2,
                   expert_layer_offset=1, num_experts=4, num_experts_per_tok=2, mamba_d_state=8,
                   mamba_d_conv=4, mamba_expand=2, use_mamba_kernels=False), ["mamba1", S, "mamba1", S]),  # Jamba's is Mamba-1's scan
    "zamba2": ("Zamba2Config", "Zamba2ForCausalLM",
               dict(layers_block_type=["mamba", "hybrid", "mamba", "hybrid"], mamba_d_state=8,
                    mamba_d_conv=4, mamba_expand=2, mamba_ngroups=1, n_mamba_heads=4, chunk_size=4,
                    num_mem_blocks=1, use_mamba_kernels=False, adapter_rank=4),
               [M, (S, M), M, (S, M)]),  # a hybrid layer: shared attention, then its Mamba-2
    "deepseek_v32": ("DeepseekV32Config", "DeepseekV32ForCausalLM",
                     MLA | dict(index_topk=4, index_head_dim=8, index_n_heads=2), ["sparse"] * 4),
    "glm_moe_dsa": ("GlmMoeDsaConfig", "GlmMoeDsaForCausalLM",
                    MLA | dict(index_topk=4, index_head_dim=8, index_n_heads=2), ["sparse"] * 4),
}
#: classic Falcon: its attention dispatches on its own (no AttentionInterface), refused by name
FALCON = ("FalconConfig", "FalconForCausalLM",
          dict(num_kv_heads=2, new_decoder_architecture=True, alibi=False, bias=False), [S] * 4)


def kinds(name: str) -> list[tuple[str, ...]]:
    """Each layer's mixer kinds (``MixerKind`` values) as :data:`HYBRIDS` declares them."""
    return [k if isinstance(k, tuple) else (k,) for k in HYBRIDS[name][3]]


def save_tokenizer(path) -> None:
    """A word-level tokenizer of 14 ids in ``path``."""
    from tokenizers import Tokenizer as Raw, models, pre_tokenizers

    words = ["[PAD]", "[BOS]", "[EOS]", "[UNK]", *"the cat sat on mat a dog . red apple".split()]
    tok = Raw(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(os.path.join(path, "tokenizer.json"))


def save_hybrid(name: str, path) -> torch.nn.Module:
    """:func:`build_hybrid`'s model saved in ``path`` (``save_pretrained``) with a word-level
    tokenizer of 14 ids; the model is returned (eager, its experts run as a plain loop)."""
    model = build_hybrid(name)
    if getattr(model.config, "_experts_implementation", None) not in (None, "eager"):
        model.set_experts_implementation("eager")  # the grouped kernel takes no float64
    model.save_pretrained(path)
    save_tokenizer(path)
    return model


def build_hybrid(name: str, *, seed: int = 0):
    """The model (float32, eval, eager attention) with random weights, bigger than init's."""
    import transformers

    config_class, model_class, extra, _ = FALCON if name == "falcon" else HYBRIDS[name]
    config = getattr(transformers, config_class)(**(BASE | extra))
    torch.manual_seed(seed)
    model = getattr(transformers, model_class)._from_config(config, attn_implementation="eager")
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim >= 1:
                p.add_(torch.randn_like(p) * 0.05)
    return model.eval()
