"""Qwen2 (Yang et al., 2024): Llama with biases on the query, key and value projections
(none on the output projection).

Qwen2's optional per-layer sliding windows (`use_sliding_window`) are not supported: the
released checkpoints leave them off, and a config that turns them on is refused by name.
"""

from __future__ import annotations

from qkv.errors import QkvError
from qkv.models.llama import LlamaConfig, LlamaModel, family, read_config

QWEN2_ARCHITECTURES = ("Qwen2ForCausalLM", "Qwen2Model")


def check_full_attention(d: dict, where: str) -> None:
    """Qwen's `use_sliding_window` / `layer_types` must leave every layer full attention."""
    if d.get("use_sliding_window"):
        raise QkvError(f"{where}: use_sliding_window=true is not supported (qkv runs Qwen with "
                       f"full attention in every layer; Mistral's single window is supported)")
    types = d.get("layer_types") or []
    if not isinstance(types, list):
        raise QkvError(f"{where}: layer_types must be a list, got {types!r}")
    other = sorted({t for t in types if t != "full_attention"}, key=str)
    if other:
        raise QkvError(f"{where}: layer_types {other} are not supported; qkv supports "
                       f"'full_attention'")


def qwen2_config(d: dict, *, where: str = "config.json") -> LlamaConfig:
    """A Qwen2 `config.json` (as a dict) → `LlamaConfig` with q/k/v biases.

    Examples:
        >>> qwen2_config({"hidden_size": 64, "num_attention_heads": 4}).qkv_bias
        True
    """
    check_full_attention(d, where)
    return read_config({k: v for k, v in d.items() if k != "attention_bias"}, "qwen2",
                       QWEN2_ARCHITECTURES, where=where, qkv_bias=True)


Qwen2Model = LlamaModel
FAMILY = family(qwen2_config)
