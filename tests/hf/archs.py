"""Tiny random transformers models, one per architecture, built offline from configs.

Each entry: the config and model class names and what the architecture needs beyond the common
sizes (a feature qkv must handle is named in the comment). Shared by tests/hf/test_*.py.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import copy

import torch

COMMON = dict(vocab_size=99, hidden_size=32, intermediate_size=37, num_hidden_layers=2,
              num_attention_heads=4, max_position_embeddings=64)
GQA = dict(num_key_value_heads=2)

DECODERS = {  # name: (config class, model class, extra config)
    "llama": ("LlamaConfig", "LlamaForCausalLM", GQA),
    "mistral": ("MistralConfig", "MistralForCausalLM", GQA | dict(sliding_window=5)),  # window
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", GQA),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", GQA | dict(head_dim=16)),  # QK-norm, head_dim ≠ hidden/heads
    "gemma": ("GemmaConfig", "GemmaForCausalLM", GQA | dict(head_dim=8)),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM",  # softcap, alternating local/global, post-norm
               GQA | dict(head_dim=8, sliding_window=5, attn_logit_softcapping=2.0,
                          query_pre_attn_scalar=12)),  # scale ≠ 1/√d
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM",
               GQA | dict(head_dim=8, sliding_window=5, query_pre_attn_scalar=12)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", GQA | dict(pad_token_id=0)),
    "olmo": ("OlmoConfig", "OlmoForCausalLM", dict(pad_token_id=0)),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", GQA | dict(pad_token_id=0)),  # QK-norm, post-norm
    "granite": ("GraniteConfig", "GraniteForCausalLM",  # multipliers, scale ≠ 1/√d
                GQA | dict(attention_multiplier=0.3, residual_multiplier=0.5, embedding_multiplier=2.0,
                           logits_scaling=3.0)),
    "starcoder2": ("Starcoder2Config", "Starcoder2ForCausalLM", GQA | dict(sliding_window=6)),
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM",  # NoPE layers
                GQA | dict(no_rope_layers=[1, 0], pad_token_id=0)),
    "cohere": ("CohereConfig", "CohereForCausalLM", GQA | dict(pad_token_id=0)),
    "stablelm": ("StableLmConfig", "StableLmForCausalLM", GQA),
    "phi": ("PhiConfig", "PhiForCausalLM", dict()),  # partial rotary
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(n_positions=64)),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", dict()),
    "gptj": ("GPTJConfig", "GPTJForCausalLM", dict(rotary_dim=4)),
    "opt": ("OPTConfig", "OPTForCausalLM", dict(ffn_dim=37, word_embed_proj_dim=32)),
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM",  # sinks, MoE, alternating windows
                GQA | dict(head_dim=8, sliding_window=5, num_local_experts=4, num_experts_per_tok=2)),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM",  # MoE
                  GQA | dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                             shared_expert_intermediate_size=16)),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", GQA | dict(num_local_experts=4)),
}

ENCODERS = {
    "bert": ("BertConfig", "BertModel", dict()),
    "roberta": ("RobertaConfig", "RobertaModel", dict(pad_token_id=1)),
    "distilbert": ("DistilBertConfig", "DistilBertModel", dict(dim=32, hidden_dim=37, n_layers=2, n_heads=4)),
    "electra": ("ElectraConfig", "ElectraModel", dict(embedding_size=32)),
    "xlm_roberta": ("XLMRobertaConfig", "XLMRobertaModel", dict(pad_token_id=1)),
}

SEQ2SEQ = {  # encoder-decoders with cross-attention
    "marian": ("MarianConfig", "MarianMTModel", dict()),
    "bart": ("BartConfig", "BartForConditionalGeneration", dict()),
    "mbart": ("MBartConfig", "MBartForConditionalGeneration", dict()),
    "m2m_100": ("M2M100Config", "M2M100ForConditionalGeneration", dict()),
    "t5": ("T5Config", "T5ForConditionalGeneration",  # relative position bias as bias=
           dict(d_model=32, d_ff=37, d_kv=8, num_layers=2, num_heads=4, decoder_start_token_id=0)),
}
SEQ2SEQ_SIZES = dict(vocab_size=99, d_model=32, encoder_layers=2, decoder_layers=2,
                     encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=37,
                     decoder_ffn_dim=37, max_position_embeddings=64, pad_token_id=1,
                     decoder_start_token_id=2)


def build(table: dict, name: str, *, seed: int = 0):
    """The model (float32, eval) with random weights, eager attention."""
    import transformers

    config_class, model_class, extra = table[name]
    base = SEQ2SEQ_SIZES if table is SEQ2SEQ and name != "t5" else COMMON
    if name == "t5":
        base = dict(vocab_size=99)
    config = getattr(transformers, config_class)(**(base | extra))
    torch.manual_seed(seed)
    model = getattr(transformers, model_class)._from_config(config, attn_implementation="eager")
    with torch.no_grad():  # bigger weights than init's: softmax rows far from uniform
        for p in model.parameters():
            if p.ndim >= 1:
                p.add_(torch.randn_like(p) * 0.05)
    return model.eval()


def twins(model):
    """(eager float64 — the truth, eager float32 — the plain peer, qkv float32 — under test)."""
    import qkv.hf  # noqa: F401  — registers "qkv"

    if getattr(model.config, "_experts_implementation", None) not in (None, "eager"):
        # the grouped-mm MoE kernel takes no float64 and wants 16-byte strides: the plain
        # loop over experts (MoE is not what is under test here)
        model.set_experts_implementation("eager")
    truth = copy.deepcopy(model).double()
    got = copy.deepcopy(model)
    got.set_attn_implementation("qkv")
    return truth, model, got
