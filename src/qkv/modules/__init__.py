"""Modules assembled from the attention core.

* ``multihead.py``   — :class:`MultiHeadAttention` (self, cross, GQA, MQA)
* ``kv_cache.py``    — :class:`KVCache` for incremental decoding
* ``positional.py``  — sinusoidal, learned, rotary (RoPE), ALiBi
* ``feedforward.py`` — :class:`FeedForward`
* ``transformer.py`` — :class:`TransformerLayer` (pre-/post-norm, optional cross-attention)
"""

from qkv.modules.feedforward import FeedForward
from qkv.modules.kv_cache import KVCache
from qkv.modules.multihead import MultiHeadAttention, MultiHeadTrace
from qkv.modules.positional import (
    ALiBi, LearnedPositionalEmbedding, RotaryEmbedding, SinusoidalPositionalEncoding,
)
from qkv.modules.transformer import LayerTrace, TransformerLayer

__all__ = [
    "ALiBi", "FeedForward", "KVCache", "LayerTrace", "LearnedPositionalEmbedding",
    "MultiHeadAttention", "MultiHeadTrace", "RotaryEmbedding", "SinusoidalPositionalEncoding",
    "TransformerLayer",
]
