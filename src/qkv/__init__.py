"""qkv — transformer self-attention, computed exactly and explained number by number.

    >>> import torch, qkv
    >>> q = k = v = torch.randn(1, 2, 4, 8)                # (b, h, t, d)
    >>> qkv.scaled_dot_product_attention(q, k, v).shape
    torch.Size([1, 2, 4, 8])
    >>> model = qkv.load("minilm")          # all-MiniLM-L6-v2, from the installed package
    >>> model.embed(["The dog ate it."]).shape
    torch.Size([1, 384])
"""

from qkv.attention import (
    AttentionMask, AttentionTrace, VarLen, attention_trace, scaled_dot_product_attention,
)
from qkv.attention import BlockMask, attention_weights, create_block_mask
from qkv import masks
from qkv.modules import (
    ALiBi, FeedForward, GatedFeedForward, KVCache, LearnedPositionalEmbedding, MultiHeadAttention,
    RotaryEmbedding, SinusoidalPositionalEncoding, TransformerLayer, TransformerStack,
)
from qkv.models import load

__version__ = "0.1.0"

__all__ = [
    "ALiBi", "AttentionMask", "AttentionTrace", "FeedForward", "GatedFeedForward", "KVCache",
    "LearnedPositionalEmbedding", "MultiHeadAttention", "RotaryEmbedding",
    "SinusoidalPositionalEncoding", "TransformerLayer", "TransformerStack", "VarLen",
    "attention_trace", "load", "scaled_dot_product_attention",
    "BlockMask", "attention_weights", "create_block_mask", "masks",
]
