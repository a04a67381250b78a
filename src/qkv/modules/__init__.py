"""Modules assembled from the attention core.

* `multihead.py`   — [`MultiHeadAttention`][qkv.modules.MultiHeadAttention] (self, cross, GQA, MQA)
* `lse_trace.py`   — `trace_rows=LSE`: every row's log-sum-exp with q, k, v (`LseTrace`)
* `writes.py`      — `trace_rows=Writes(positions)`: what a layer wrote at some positions only;
  `Weights(rows)`: some rows' weights only
* `kv_cache.py`    — [`KVCache`][qkv.modules.KVCache] for incremental decoding
* `positional.py`  — sinusoidal, learned, rotary (RoPE), ALiBi
* `feedforward.py` — [`FeedForward`][qkv.modules.FeedForward],
  [`GatedFeedForward`][qkv.modules.GatedFeedForward] (SwiGLU)
* `transformer.py` — [`TransformerLayer`][qkv.modules.TransformerLayer] (pre-/post-norm, optional
  cross-attention)
* `stack.py`       — [`TransformerStack`][qkv.modules.TransformerStack], the one layer loop every
  model uses
* `intervention.py` — `Interventions`: heads zeroed/replaced, values zeroed, inputs patched
"""

from qkv.modules.feedforward import FeedForward, GatedFeedForward
from qkv.modules.intervention import AttentionEdit, Interventions
from qkv.modules.kv_cache import KVCache
from qkv.modules.lse_trace import LSE, LseTrace
from qkv.modules.multihead import AttentionOutput, MultiHeadAttention, MultiHeadTrace
from qkv.modules.positional import (
    ALiBi, LearnedPositionalEmbedding, RotaryEmbedding, SinusoidalPositionalEncoding,
)
from qkv.modules.stack import LayerRows, StackOutput, TransformerStack
from qkv.modules.transformer import LayerOutput, LayerTrace, TransformerLayer
from qkv.modules.writes import AtPositions, Weights, WeightsTrace, Writes, WritesTrace

__all__ = [
    "ALiBi", "AtPositions", "AttentionEdit", "AttentionOutput", "FeedForward", "GatedFeedForward", "Interventions",
    "KVCache", "LayerOutput", "LayerRows", "LayerTrace", "LearnedPositionalEmbedding", "LSE", "LseTrace",
    "MultiHeadAttention", "MultiHeadTrace",
    "RotaryEmbedding", "SinusoidalPositionalEncoding", "StackOutput", "TransformerLayer",
    "TransformerStack", "Weights", "WeightsTrace", "Writes", "WritesTrace",
]
