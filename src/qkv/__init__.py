"""qkv — transformer self-attention, computed exactly and explained number by number.

    >>> import torch, qkv
    >>> q = k = v = torch.randn(1, 2, 4, 8)                # (b, h, t, d)
    >>> qkv.scaled_dot_product_attention(q, k, v).shape
    torch.Size([1, 2, 4, 8])
"""

from qkv.attention import AttentionTrace, attention_trace, scaled_dot_product_attention
from qkv.modules import (
    ALiBi, FeedForward, KVCache, LearnedPositionalEmbedding, MultiHeadAttention, RotaryEmbedding,
    SinusoidalPositionalEncoding, TransformerLayer,
)

__version__ = "0.1.0"

__all__ = [
    "ALiBi", "AttentionTrace", "FeedForward", "KVCache", "LearnedPositionalEmbedding",
    "MultiHeadAttention", "RotaryEmbedding", "SinusoidalPositionalEncoding", "TransformerLayer",
    "attention_trace", "scaled_dot_product_attention",
]
