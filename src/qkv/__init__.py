"""qkv — transformer self-attention, computed exactly and explained number by number.

    >>> import torch, qkv
    >>> q = k = v = torch.randn(1, 2, 4, 8)                # (b, h, t, d)
    >>> qkv.scaled_dot_product_attention(q, k, v).shape
    torch.Size([1, 2, 4, 8])
    >>> model = qkv.load("minilm")          # all-MiniLM-L6-v2, from the installed package
    >>> model.embed(["The dog ate it."]).shape
    torch.Size([1, 384])
"""

from qkv.attention import AttentionTrace, attention_trace, scaled_dot_product_attention
from qkv.modules import (
    ALiBi, FeedForward, KVCache, LearnedPositionalEmbedding, MultiHeadAttention, RotaryEmbedding,
    SinusoidalPositionalEncoding, TransformerLayer,
)
from qkv.models import load

__version__ = "0.1.0"

__all__ = [
    "ALiBi", "AttentionTrace", "FeedForward", "KVCache", "LearnedPositionalEmbedding",
    "MultiHeadAttention", "RotaryEmbedding", "SinusoidalPositionalEncoding", "TransformerLayer",
    "attention_trace", "load", "scaled_dot_product_attention",
]
