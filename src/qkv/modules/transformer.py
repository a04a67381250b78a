"""One transformer layer — encoder or decoder, pre- or post-norm — built from its parts.

```text
post-norm (Vaswani, BERT)            pre-norm (GPT-2, Llama)
x = norm1(x + self_attn(x))          x = x + self_attn(norm1(x))
x = norm2(x + cross_attn(x, mem))    x = x + cross_attn(norm2(x), mem)
x = norm3(x + ff(x))                 x = x + ff(norm3(x))
```

Encoder and decoder are the same class: a decoder layer has a `cross_attn` part and is
called with a causal mask. The parts are given to the constructor (any norm module — LayerNorm,
RMSNorm; any feed-forward — plain or gated), so a new family is a new builder, not a new class.
Layers are stacked by [`TransformerStack`][qkv.modules.stack.TransformerStack].
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from qkv.attention.attention_mask import AttentionMask
from qkv.modules.feedforward import FeedForward, GatedFeedForward
from qkv.modules.intervention import AttentionEdit
from qkv.modules.kv_cache import KVCache
from qkv.modules.multihead import AttentionOutput, MultiHeadAttention, MultiHeadTrace
from qkv.modules.writes import AtPositions, Weights, Writes

NORMS: dict[str, Callable[..., nn.Module]] = {
    "layer": nn.LayerNorm,  # (x − mean) / std · γ + β  (Vaswani, BERT, GPT-2)
    "rms": nn.RMSNorm,  # x / rms(x) · γ  (Llama, Mistral, Qwen)
}


@dataclass(frozen=True)
class LayerTrace:
    """The attention traces of one layer (rows as requested), and its residual stream.

    Attributes:
        self_attn: the self-attention's `MultiHeadTrace` (a `WritesTrace` for a `Writes`
            request: the heads' outputs at its positions only).
        cross_attn: the cross-attention's `MultiHeadTrace` (decoders only).
        residual: (b, t, E) what the self-attention sub-block hands on, every row: `x + attn`
            (pre-norm), `norm1(x + attn)` (post-norm), `x + p₁(attn)` (a norm on the branch)
            or `α₁·r₁ + β₁·attn` (scaled: `ResidualForm`); None for a layer that never forms it
            (GPT-NeoX's parallel residual) or run for its attention's trace alone
            (`attention_only`). Not detached (see `MultiHeadTrace.heads`). For a
            `Writes` request, an `AtPositions` holding its positions' rows only.
        ffn_sum: (b, t, E) what a post-norm layer's last norm read, `residual + ff(residual)`,
            where the forward records it (a transformers post-norm layer, whose feed-forward
            qkv does not run); None otherwise.
    """

    self_attn: MultiHeadTrace
    cross_attn: MultiHeadTrace | None = None
    residual: torch.Tensor | AtPositions | None = None
    ffn_sum: torch.Tensor | None = None


@dataclass(frozen=True)
class LayerOutput:
    """What one layer returns, whatever was asked for.

    Attributes:
        hidden: (b, t, E) the layer's output; (b, 0, E) for `attention_only` (none computed).
        trace: None unless `trace_rows`; then the layer's `LayerTrace`.
    """

    hidden: torch.Tensor
    trace: LayerTrace | None = None


class TransformerLayer(nn.Module):
    """A residual stack of self-attention, optional cross-attention, and a feed-forward block.

    Args:
        self_attn: the self-attention module.
        feed_forward: the feed-forward block ([`FeedForward`][qkv.modules.feedforward.FeedForward]
            or [`GatedFeedForward`][qkv.modules.feedforward.GatedFeedForward]).
        norm1: the norm around self-attention.
        norm3: the norm around the feed-forward.
        cross_attn: attention from this layer's tokens to an encoder's output (decoders only),
            with its norm `norm2`.
        norm_first: pre-norm (True) or post-norm (False).
        dropout: dropout on each sub-block's output before the residual sum.

    Examples:
        >>> layer = TransformerLayer.build(16, 4, 64, norm_first=True)
        >>> layer(torch.randn(2, 5, 16), is_causal=True).hidden.shape
        torch.Size([2, 5, 16])
    """

    def __init__(self, self_attn: MultiHeadAttention, feed_forward: nn.Module, norm1: nn.Module,
                 norm3: nn.Module, *, cross_attn: MultiHeadAttention | None = None,
                 norm2: nn.Module | None = None, norm_first: bool = False, dropout: float = 0.0):
        super().__init__()
        if (cross_attn is None) != (norm2 is None):
            raise ValueError("cross_attn and norm2 come together: give both or neither")
        self.self_attn, self.cross_attn, self.feed_forward = self_attn, cross_attn, feed_forward
        self.norm1, self.norm2, self.norm3 = norm1, norm2, norm3
        self.norm_first = norm_first
        self.dropout = nn.Dropout(dropout)

    @classmethod
    def build(cls, dim: int, num_heads: int, ff_dim: int, *, cross_attention: bool = False,
              norm_first: bool = False, norm: str = "layer", norm_eps: float = 1e-5,
              dropout: float = 0.0, activation: str = "gelu", gated: bool = False,
              num_kv_heads: int | None = None, bias: bool = True, **attn_kwargs) -> "TransformerLayer":
        """Assemble a layer from sizes.

        `norm` is `"layer"` or `"rms"`; `gated` picks
        [`GatedFeedForward`][qkv.modules.feedforward.GatedFeedForward] (SwiGLU with
        `activation="silu"`); `attn_kwargs` go to the self-attention (`rotary`, `alibi`,
        `backend`…).
        """
        if norm not in NORMS:
            raise ValueError(f"unknown norm {norm!r}; choose from {sorted(NORMS)}")
        make_norm = lambda: NORMS[norm](dim, eps=norm_eps)  # noqa: E731
        self_attn = MultiHeadAttention(dim, num_heads, num_kv_heads=num_kv_heads, bias=bias,
                                       dropout=dropout, **attn_kwargs)
        cross = MultiHeadAttention(dim, num_heads, num_kv_heads=num_kv_heads, bias=bias,
                                   dropout=dropout) if cross_attention else None
        kind = GatedFeedForward if gated else FeedForward
        ff = kind(dim, ff_dim, activation=activation, dropout=dropout, bias=bias)
        return cls(self_attn, ff, make_norm(), make_norm(), cross_attn=cross,
                   norm2=make_norm() if cross_attention else None, norm_first=norm_first,
                   dropout=dropout)

    #: What the layer forms instead of x + attn before its feed-forward, in words; "" when it
    #: forms it (a subclass with its own forward says what it does; a transformers layer's
    #: adapter reads it off a forward).
    residual_note: str = ""

    @property
    def sequential_residual(self) -> bool:
        """Whether this layer forms x + attn before its feed-forward reads it (what ALTI
        decomposes): this class's forward does; a subclass with its own forward (GPT-NeoX's
        parallel residual) does not say so."""
        return type(self).forward is TransformerLayer.forward

    def _branch_input(self, x: torch.Tensor, norm: nn.Module) -> torch.Tensor:
        """(b, t, E) what a residual branch reads: norm(x) pre-norm, x itself post-norm."""
        return norm(x) if self.norm_first else x

    def _residual(self, x: torch.Tensor, norm: nn.Module, block) -> tuple[torch.Tensor, object]:
        """Run `block` as a residual branch, pre- or post-norm; pass back its trace, if any."""
        y = block(self._branch_input(x, norm))
        trace = None
        if isinstance(y, AttentionOutput):
            y, trace = y.output, y.trace
        x = x + self.dropout(y)
        return (x if self.norm_first else norm(x)), trace

    def forward(self, x: torch.Tensor, *, mask: AttentionMask | None = None,
                memory: torch.Tensor | None = None, memory_mask: AttentionMask | None = None,
                attn_mask: torch.Tensor | None = None,
                key_padding_mask: torch.Tensor | None = None, is_causal: bool = False,
                memory_key_padding_mask: torch.Tensor | None = None,
                kv_cache: KVCache | None = None, memory_kv_cache: KVCache | None = None,
                trace_rows: torch.Tensor | slice | None = None,
                positions: torch.Tensor | None = None,
                intervention: AttentionEdit | None = None,
                attention_only: bool = False) -> LayerOutput:
        """x: (b, t, E) → a `LayerOutput` (hidden (b, t, E); a trace with `trace_rows`).

        Masks: `mask` (an [`AttentionMask`][qkv.attention.AttentionMask], as the stack passes it) or
        the torch-style `attn_mask` / `key_padding_mask` / `is_causal`; for the
        cross-attention `memory_mask` or `memory_key_padding_mask`. `memory` (b, s, E)
        is the encoder output that `cross_attn` reads; `positions` (b, t) go to the
        self-attention's rotary embedding. `memory_kv_cache` (decoding) holds
        the cross-attention's keys and values of `memory`: the first call projects `memory`
        into it, later calls reuse it instead of projecting `memory` again. `intervention`
        (an `AttentionEdit`) goes to the self-attention. `attention_only`: run the
        self-attention for the trace of `trace_rows` (query positions) alone — what a reader of
        that trace needs (a score attribution): its kernel, `out_proj`, the residual, any
        cross-attention and the feed-forward are not run; `hidden` is then (b, 0, E).
        """
        if (memory is None) != (self.cross_attn is None):
            raise ValueError("memory must be given exactly when the layer has cross-attention")
        if attention_only:
            return self._attention_trace(x, mask=mask, attn_mask=attn_mask,
                                         key_padding_mask=key_padding_mask, is_causal=is_causal,
                                         kv_cache=kv_cache, trace_rows=trace_rows, positions=positions,
                                         intervention=intervention)
        # 1) self-attention
        x, self_trace = self._residual(x, self.norm1, lambda h: self.self_attn(
            h, mask=mask, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
            is_causal=is_causal, kv_cache=kv_cache, trace_rows=trace_rows, positions=positions,
            intervention=intervention))
        residual = x  # (b, t, E): what the self-attention sub-block hands on
        recorded = trace_rows.keep(x) if isinstance(trace_rows, Writes) else \
            None if isinstance(trace_rows, Weights) else residual
        # 2) cross-attention: queries from here, keys and values from the encoder
        cross_trace = None
        if self.cross_attn is not None:
            if memory_kv_cache is not None and len(memory_kv_cache):
                memory = memory[:, :0]  # (b, 0, E): nothing new to project, the cache has it all
            x, cross_trace = self._residual(x, self.norm2, lambda h: self.cross_attn(
                h, memory, mask=memory_mask, key_padding_mask=memory_key_padding_mask,
                kv_cache=memory_kv_cache, trace_rows=trace_rows))
        # 3) feed-forward
        x, _ = self._residual(x, self.norm3, self.feed_forward)
        trace = LayerTrace(self_trace, cross_trace, recorded) if trace_rows is not None else None
        return LayerOutput(x, trace)

    def _attention_trace(self, x: torch.Tensor, *, trace_rows, **attend) -> LayerOutput:
        """`forward(attention_only=True)`: the self-attention's trace of `trace_rows`, nothing
        else computed (no residual formed: `LayerTrace.residual` None), hidden (b, 0, E)."""
        if trace_rows is None:
            raise ValueError("attention_only=True runs the self-attention for its trace: give "
                             "trace_rows (query positions)")
        out = self.self_attn(self._branch_input(x, self.norm1), trace_rows=trace_rows,
                             trace_only=True, **attend)
        return LayerOutput(x[:, :0], LayerTrace(out.trace))  # (b, 0, E): no output computed
