"""One transformer layer — encoder or decoder, pre- or post-norm — built from its parts.

::

    post-norm (Vaswani, BERT)            pre-norm (GPT-2)
    x = norm1(x + self_attn(x))          x = x + self_attn(norm1(x))
    x = norm2(x + cross_attn(x, mem))    x = x + cross_attn(norm2(x), mem)
    x = norm3(x + ff(x))                 x = x + ff(norm3(x))

Encoder and decoder are the same class: a decoder layer has a ``cross_attn`` part and is
called with ``is_causal=True``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from qkv.modules.feedforward import FeedForward
from qkv.modules.kv_cache import KVCache
from qkv.modules.multihead import MultiHeadAttention, MultiHeadTrace


@dataclass(frozen=True)
class LayerTrace:
    """The attention traces of one layer (rows as requested)."""

    self_attn: MultiHeadTrace
    cross_attn: MultiHeadTrace | None = None


class TransformerLayer(nn.Module):
    """A residual stack of self-attention, optional cross-attention, and a feed-forward block.

    Args:
        self_attn: the self-attention module.
        feed_forward: the feed-forward block.
        cross_attn: attention from this layer's tokens to an encoder's output (decoders only).
        norm_first: pre-norm (True) or post-norm (False).
        norm_eps: LayerNorm epsilon (BERT 1e-12, GPT-2 and Vaswani 1e-5).
        dropout: dropout on each sub-block's output before the residual sum.

    Example:
        >>> layer = TransformerLayer.build(16, 4, 64, norm_first=True)
        >>> layer(torch.randn(2, 5, 16), is_causal=True).shape
        torch.Size([2, 5, 16])
    """

    def __init__(self, self_attn: MultiHeadAttention, feed_forward: FeedForward, *,
                 cross_attn: MultiHeadAttention | None = None, norm_first: bool = False,
                 norm_eps: float = 1e-5, dropout: float = 0.0):
        super().__init__()
        dim = self_attn.embed_dim
        self.self_attn, self.cross_attn, self.feed_forward = self_attn, cross_attn, feed_forward
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps) if cross_attn is not None else None
        self.norm3 = nn.LayerNorm(dim, eps=norm_eps)
        self.norm_first = norm_first
        self.dropout = nn.Dropout(dropout)

    @classmethod
    def build(cls, dim: int, num_heads: int, ff_dim: int, *, cross_attention: bool = False,
              norm_first: bool = False, norm_eps: float = 1e-5, dropout: float = 0.0,
              activation: str = "gelu", num_kv_heads: int | None = None, bias: bool = True,
              **attn_kwargs) -> "TransformerLayer":
        """Assemble a layer from sizes (``attn_kwargs`` go to the self-attention: rotary, alibi…)."""
        self_attn = MultiHeadAttention(dim, num_heads, num_kv_heads=num_kv_heads, bias=bias,
                                       dropout=dropout, **attn_kwargs)
        cross = MultiHeadAttention(dim, num_heads, num_kv_heads=num_kv_heads, bias=bias,
                                   dropout=dropout) if cross_attention else None
        ff = FeedForward(dim, ff_dim, activation=activation, dropout=dropout, bias=bias)
        return cls(self_attn, ff, cross_attn=cross, norm_first=norm_first, norm_eps=norm_eps,
                   dropout=dropout)

    def _residual(self, x: torch.Tensor, norm: nn.LayerNorm, block) -> tuple[torch.Tensor, object]:
        """Run ``block`` as a residual branch, pre- or post-norm; pass back its extra outputs."""
        h = norm(x) if self.norm_first else x
        y, *extra = block(h)
        x = x + self.dropout(y)
        return (x if self.norm_first else norm(x)), (extra[-1] if extra else None)

    def forward(self, x: torch.Tensor, *, memory: torch.Tensor | None = None,
                attn_mask: torch.Tensor | None = None,
                key_padding_mask: torch.Tensor | None = None, is_causal: bool = False,
                memory_key_padding_mask: torch.Tensor | None = None,
                kv_cache: KVCache | None = None, trace_rows: torch.Tensor | slice | None = None,
                memory_kv_cache: KVCache | None = None):
        """x: (b, t, E) → (b, t, E); with ``trace_rows``, ``(x, LayerTrace)``.

        ``memory`` (b, s, E) is the encoder output that ``cross_attn`` reads. ``memory_kv_cache``
        (decoding) holds the cross-attention's keys and values of ``memory``: the first call
        projects ``memory`` into it, later calls reuse it instead of projecting ``memory`` again.
        """
        if (memory is None) != (self.cross_attn is None):
            raise ValueError("memory must be given exactly when the layer has cross-attention")
        traced = dict(trace_rows=trace_rows) if trace_rows is not None else {}

        # 1) self-attention
        x, self_trace = self._residual(x, self.norm1, lambda h: self.self_attn(
            h, attn_mask=attn_mask, key_padding_mask=key_padding_mask, is_causal=is_causal,
            kv_cache=kv_cache, **traced))
        # 2) cross-attention: queries from here, keys and values from the encoder
        cross_trace = None
        if self.cross_attn is not None:
            if memory_kv_cache is not None and len(memory_kv_cache):
                memory = memory[:, :0]  # (b, 0, E): nothing new to project, the cache has it all
            x, cross_trace = self._residual(x, self.norm2, lambda h: self.cross_attn(
                h, memory, key_padding_mask=memory_key_padding_mask, kv_cache=memory_kv_cache,
                **traced))
        # 3) feed-forward
        x, _ = self._residual(x, self.norm3, lambda h: (self.feed_forward(h),))
        if trace_rows is None:
            return x
        return x, LayerTrace(self_trace, cross_trace)
