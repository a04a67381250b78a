"""Qwen3 (Qwen team, 2025): Llama with an RMSNorm on each head's query and key.

Each head's query and key vector (length d) is normalised before RoPE rotates it:

```text
q_h = RoPE(rmsnorm_q(W_q x)_h),   k_h = RoPE(rmsnorm_k(W_k x)_h)   (one γ of length d, shared by heads)
```

which bounds the scores' scale. No q/k/v biases by default (`attention_bias` as in Llama).
"""

from __future__ import annotations

from qkv.models.llama import LlamaConfig, LlamaModel, family, read_config
from qkv.models.qwen2 import check_full_attention

QWEN3_ARCHITECTURES = ("Qwen3ForCausalLM", "Qwen3Model")


def qwen3_config(d: dict, *, where: str = "config.json") -> LlamaConfig:
    """A Qwen3 `config.json` (as a dict) → `LlamaConfig` with per-head q/k norms.

    Examples:
        >>> qwen3_config({"hidden_size": 64, "num_attention_heads": 4, "head_dim": 32}).qk_norm
        True
    """
    check_full_attention(d, where)
    return read_config(d, "qwen3", QWEN3_ARCHITECTURES, where=where, qk_norm=True)


Qwen3Model = LlamaModel
FAMILY = family(qwen3_config)
