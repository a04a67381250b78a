"""qkv — transformer self-attention, computed exactly and explained number by number.

    >>> import torch, qkv
    >>> q = k = v = torch.randn(1, 2, 4, 8)                # (b, h, t, d)
    >>> qkv.scaled_dot_product_attention(q, k, v).shape
    torch.Size([1, 2, 4, 8])
    >>> model = qkv.load("minilm")          # all-MiniLM-L6-v2, from the installed package
    >>> model.embed(["The dog ate it."]).shape
    torch.Size([1, 384])

The names below are imported when first used (PEP 562), so ``import qkv`` costs no torch
import: the ``qkv`` command answers ``--help`` and argument errors without it (about 3 s of CPU).
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# Each public name → the module that defines it.
_WHERE = {
    **dict.fromkeys(("AttentionMask", "AttentionTrace", "VarLen", "attention_trace",
                     "scaled_dot_product_attention", "BlockMask", "attention_weights",
                     "create_block_mask"), "qkv.attention"),
    **dict.fromkeys(("ALiBi", "FeedForward", "GatedFeedForward", "KVCache",
                     "LearnedPositionalEmbedding", "MultiHeadAttention", "RotaryEmbedding",
                     "SinusoidalPositionalEncoding", "TransformerLayer", "TransformerStack"),
                    "qkv.modules"),
    "load": "qkv.models",
}

__all__ = [*_WHERE, "masks"]


def __getattr__(name: str):
    """``qkv.load``, ``qkv.MultiHeadAttention`` …: imported from their module on first use; any
    other name is a sub-package (``qkv.explain``, ``qkv.masks``) imported the same way."""
    if name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name]), name)
    else:
        try:
            value = importlib.import_module(f"qkv.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"qkv.{name}":
                raise
            raise AttributeError(f"module 'qkv' has no attribute {name!r}") from None
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
