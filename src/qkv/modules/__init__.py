"""Modules assembled from the attention core.

* ``multihead.py``   — :class:`MultiHeadAttention` (self, cross, GQA, MQA)
* ``kv_cache.py``    — :class:`KVCache` for incremental decoding
* ``positional.py``  — sinusoidal, learned, rotary (RoPE), ALiBi
* ``feedforward.py`` — :class:`FeedForward`, :class:`GatedFeedForward` (SwiGLU)
* ``transformer.py`` — :class:`TransformerLayer` (pre-/post-norm, optional cross-attention)
* ``stack.py``       — :class:`TransformerStack`, the one layer loop every model uses
"""

from qkv.modules.feedforward import FeedForward, GatedFeedForward
from qkv.modules.intervention import HeadEdit
from qkv.modules.kv_cache import KVCache
from qkv.modules.multihead import AttentionOutput, MultiHeadAttention, MultiHeadTrace
from qkv.modules.positional import (
    ALiBi, LearnedPositionalEmbedding, RotaryEmbedding, SinusoidalPositionalEncoding,
)
from qkv.modules.stack import StackOutput, TransformerStack
from qkv.modules.transformer import LayerOutput, LayerTrace, TransformerLayer

__all__ = [
    "ALiBi", "AttentionOutput", "FeedForward", "GatedFeedForward", "HeadEdit", "KVCache", "LayerOutput",
    "LayerTrace", "LearnedPositionalEmbedding", "MultiHeadAttention", "MultiHeadTrace",
    "RotaryEmbedding", "SinusoidalPositionalEncoding", "StackOutput", "TransformerLayer",
    "TransformerStack",
]
