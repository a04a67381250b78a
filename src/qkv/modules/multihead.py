"""Multi-head attention: project, split into heads, attend, merge, project.

```text
MHA (h_kv = h)          GQA (1 < h_kv < h)        MQA (h_kv = 1)
q: ■ ■ ■ ■              q: ■ ■ ■ ■                q: ■ ■ ■ ■
   | | | |                 \\ | | /                  \\ \\ / /
k: ■ ■ ■ ■              k:  ■   ■                 k:    ■
v: ■ ■ ■ ■              v:  ■   ■                 v:    ■
```
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from qkv.attention import AttentionTrace
from qkv.attention.attention_mask import AttentionMask, combine
from qkv.attention.traced import row_positions, trace_of_rows, traced_attention
from qkv.modules.intervention import AttentionEdit
from qkv.modules.kv_cache import KVCache
from qkv.modules.lse_trace import LseRequest, LseTrace
from qkv.modules.positional import ALiBi, RotaryEmbedding
from qkv.modules.writes import Weights, WeightsTrace, Writes, WritesTrace


@dataclass(frozen=True)
class MultiHeadTrace:
    """What one multi-head attention call did, for the kept query rows `r`.

    Attributes:
        rows: (r,) the query positions kept.
        query_input: (b, r, E) the vectors x_i that were projected into queries.
        key_input: (b, s, kdim) the vectors x_j projected into keys.
        value_input: (b, s, vdim) the vectors x_j projected into values.
        attention: the [`AttentionTrace`][qkv.attention.trace.AttentionTrace] per head, (b, h, r,
            ·); its `output` is each head's output before the heads are concatenated and mixed by
            `out_proj`.
        heads: (b, t, h·d) every row's heads concatenated, exactly `out_proj`'s input (after
            any `AttentionEdit`); not detached, so a forward
            run with autograd on can be differentiated with respect to it.
        position_step: the model's own position step between the projections (and any q/k
            norm) and the scores — `position_step(x (n, d), positions (n,)) → (n, d)` rotates
            one head's vectors as the forward rotated them (RoPE) — or None when q·k reads the
            projections as they are (positions already in x, or a score bias such as ALiBi).
    """

    rows: torch.Tensor
    query_input: torch.Tensor
    key_input: torch.Tensor
    value_input: torch.Tensor
    attention: AttentionTrace
    heads: torch.Tensor | None = None
    position_step: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None


@dataclass(frozen=True)
class ModuleRotation:
    """The position step of a [`MultiHeadAttention`][qkv.modules.multihead.MultiHeadAttention]: its
    own rotary module, applied to one head's vectors at their positions (the `position_step` of its
    traces)."""

    rotary: nn.Module

    def __call__(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x (n, d) at positions (n,) → rotated (n, d)."""
        if isinstance(self.rotary, RotaryEmbedding):  # its angles' rows, as the forward's
            cos, sin = self.rotary.at(positions, dtype=x.dtype)  # (n, d)
            return self.rotary.rotate(x, cos, sin)
        first = int(positions[0]) if positions.numel() else 0
        if torch.equal(positions, torch.arange(first, first + len(positions), device=positions.device)):
            return self.rotary(x[None, None], offset=first)[0, 0]  # as the forward: an offset
        return self.rotary(x[None, None], positions=positions[None])[0, 0]


def head_norm(norm: nn.Module, x: torch.Tensor, head_dim: int) -> torch.Tensor:
    """A q/k norm applied as the model applies it, to x (..., n·d), every head's features: per head
    when the norm's width is d (Qwen3's, qkv's `q_norm`), over all of them otherwise (OLMo 2
    normalises the whole projection before splitting heads). Returns (..., n·d)."""
    if norm_width(norm) == x.shape[-1]:
        return _in_dtype(norm, x)
    return _in_dtype(norm, x.unflatten(-1, (-1, head_dim))).flatten(-2)  # (..., n, d) normalised per head


def _in_dtype(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """`norm(x)` with the norm's parameters in x's dtype: torch's LayerNorm (Persimmon's q/k
    norms) refuses the float64 vectors `explain_head` recomputes a float32 model's q and k in."""
    params = dict(norm.named_parameters())
    if all(p.dtype == x.dtype for p in params.values()):
        return norm(x)
    return torch.func.functional_call(norm, {n: p.to(x.dtype) for n, p in params.items()}, (x,))


def norm_width(norm: nn.Module) -> int:
    """How many features `norm` normalises together: its weight's width (or its
    `normalized_shape` without one)."""
    weight = getattr(norm, "weight", None)
    return weight.shape[-1] if weight is not None else norm.normalized_shape[-1]


@dataclass(frozen=True)
class AttentionOutput:
    """What one multi-head attention call returns, whatever was asked for.

    Attributes:
        output: (b, t, E) the attention block's output (after `out_proj`).
        weights: None unless `need_weights`; then (b, t, s) averaged over heads, or
            (b, h, t, s) with `average_attn_weights=False`.
        trace: None unless `trace_rows`; then a `MultiHeadTrace` of those rows (an
            `LseTrace` with `trace_rows=LSE`, a `WritesTrace` / `WeightsTrace` with
            `trace_rows=Writes(…)` / `Weights(…)`).
    """

    output: torch.Tensor
    weights: torch.Tensor | None = None
    trace: MultiHeadTrace | LseTrace | None = None


class MultiHeadAttention(nn.Module):
    """Batch-first multi-head attention: self, cross, grouped-query and multi-query.

    Args:
        embed_dim: E, the width of the queries' input and of the output.
        num_heads: h; E must be divisible by h (head dim d = E / h).
        num_kv_heads: h_kv for GQA/MQA (default h); must divide h.
        kdim, vdim: widths of the key and value inputs (default E), for cross-attention.
        bias: whether the four projections have biases.
        dropout: dropout on the attention weights while training.
        rotary: a [`RotaryEmbedding`][qkv.modules.positional.RotaryEmbedding] applied to queries and
            keys, or None.
        alibi: an [`ALiBi`][qkv.modules.positional.ALiBi] bias added to the scores, or None.
        backend: the attention backend for calls that need no weights (see
            [`qkv.scaled_dot_product_attention`][qkv.scaled_dot_product_attention]).
        head_dim: d, when it is not E / h (some Llama-family checkpoints); then E need not be
            divisible by h.
        out_bias: whether `out_proj` has a bias (default: `bias`; Qwen2 has q/k/v biases only).
        q_norm, k_norm: a norm applied to each head's query / key vector before the rotation
            (Qwen3's per-head RMSNorm), or None.

    Masks follow [`qkv.scaled_dot_product_attention`][qkv.scaled_dot_product_attention]: **bool
    True = takes part** (the opposite of `torch.nn.MultiheadAttention`, whose True means "masked
    out"); float masks are added. `attn_mask` is (t, s), (b·h, t, s) or broadcastable to (b, h, t,
    s); `key_padding_mask` is (b, s), True (or 0.0) for real tokens.

    Examples:
        >>> mha = MultiHeadAttention(16, 4, num_kv_heads=2)
        >>> x = torch.randn(2, 5, 16)                          # (b, t, E)
        >>> res = mha(x, need_weights=True, is_causal=True)
        >>> res.output.shape, res.weights.shape                # (b, t, E), (b, t, s)
        (torch.Size([2, 5, 16]), torch.Size([2, 5, 5]))

    Sequence parallelism: set `sequence_parallel` to a
    [`qkv.distributed.SequenceParallel`][qkv.distributed.SequenceParallel]
    (`SequenceParallel.apply(model)` does it for every layer) and self-attention runs on this rank's
    shard of a sequence split across processes (ring or all-to-all).
    """

    sequence_parallel = None  # a qkv.distributed.SequenceParallel, or None: attend locally
    projection_note = ""  # q_proj, k_proj, v_proj are the projections (explain_head reads them)
    norm_after_rotation = False  # q_norm, k_norm act before the rotation (explain_head's order)

    def __init__(self, embed_dim: int, num_heads: int, *, num_kv_heads: int | None = None,
                 kdim: int | None = None, vdim: int | None = None, bias: bool = True,
                 dropout: float = 0.0, rotary: RotaryEmbedding | None = None,
                 alibi: ALiBi | None = None, backend: str = "auto", head_dim: int | None = None,
                 out_bias: bool | None = None, q_norm: nn.Module | None = None,
                 k_norm: nn.Module | None = None):
        super().__init__()
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if embed_dim <= 0 or num_heads <= 0 or num_kv_heads <= 0:
            raise ValueError(f"embed_dim ({embed_dim}), num_heads ({num_heads}) and num_kv_heads "
                             f"({num_kv_heads}) must be positive")
        if head_dim is None and embed_dim % num_heads:
            raise ValueError(f"embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads})")
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads ({num_heads}) must be divisible by num_kv_heads ({num_kv_heads})")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.embed_dim, self.num_heads, self.num_kv_heads = embed_dim, num_heads, num_kv_heads
        self.head_dim = embed_dim // num_heads if head_dim is None else head_dim
        if self.head_dim <= 0:
            raise ValueError(f"head_dim must be positive, got {head_dim}")
        self.kdim, self.vdim = kdim or embed_dim, vdim or embed_dim
        self.dropout, self.backend = dropout, backend
        self.q_proj = nn.Linear(embed_dim, num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(self.kdim, num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(self.vdim, num_kv_heads * self.head_dim, bias=bias)
        self.out_proj = nn.Linear(num_heads * self.head_dim, embed_dim,
                                  bias=bias if out_bias is None else out_bias)
        self.rotary, self.alibi = rotary, alibi
        self.q_norm, self.k_norm = q_norm, k_norm

    # -- helpers ---------------------------------------------------------------------------
    def _split(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        b, t, _ = x.shape
        return x.view(b, t, heads, self.head_dim).transpose(1, 2)  # (b, heads, t, d)

    def _check(self, name: str, x: torch.Tensor, width: int) -> None:
        if not isinstance(x, torch.Tensor) or x.ndim != 3 or x.shape[-1] != width:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"{name} must have shape (batch, length, {width}), got {shape}")
        if not x.is_floating_point():  # token ids belong to the model's embedding, not here
            raise ValueError(f"{name} must be a floating-point tensor (embeddings), got dtype {x.dtype}")

    def _describe(self, mask, attn_mask, key_padding_mask, b, t, s, is_causal, offset) -> AttentionMask:
        """This call's masks as one [`AttentionMask`][qkv.attention.attention_mask.AttentionMask]
description (nothing materialised)."""
        if mask is not None:
            if attn_mask is not None or key_padding_mask is not None or is_causal:
                raise ValueError("pass either mask=AttentionMask(...) or attn_mask / key_padding_mask / "
                                 "is_causal, not both")
            if not isinstance(mask, AttentionMask):
                raise ValueError(f"mask must be a qkv.attention.AttentionMask, got {type(mask).__name__}")
            return mask
        if attn_mask is not None:
            if attn_mask.ndim == 3:
                if attn_mask.shape[0] != b * self.num_heads:
                    raise ValueError(f"a 3-D attn_mask must be (batch*heads, t, s) = "
                                     f"({b * self.num_heads}, {t}, {s}), got {tuple(attn_mask.shape)}")
                attn_mask = attn_mask.view(b, self.num_heads, *attn_mask.shape[1:])
            if attn_mask.shape[-2:] != (t, s) or attn_mask.ndim not in (2, 4):
                raise ValueError(f"attn_mask must be (t, s) = ({t}, {s}), (b*h, t, s) or (b, h, t, s), "
                                 f"got {tuple(attn_mask.shape)}")
        if key_padding_mask is not None:
            if key_padding_mask.shape != (b, s):
                raise ValueError(f"key_padding_mask must be (batch, s) = ({b}, {s}), "
                                 f"got {tuple(key_padding_mask.shape)}")
            if key_padding_mask.dtype != torch.bool:  # a float one is added: part of the dense mask
                attn_mask = combine(attn_mask, key_padding_mask[:, None, None, :].to(self.q_proj.weight.dtype))
                key_padding_mask = None
        # Queries are the last t of s positions when a cache holds earlier tokens.
        return AttentionMask(causal=is_causal, alignment="bottom_right" if offset else "top_left",
                             key_padding=key_padding_mask, dense=attn_mask)

    # -- forward -----------------------------------------------------------------------------
    def forward(self, query: torch.Tensor, key: torch.Tensor | None = None,
                value: torch.Tensor | None = None, *, mask: AttentionMask | None = None,
                attn_mask: torch.Tensor | None = None,
                key_padding_mask: torch.Tensor | None = None, is_causal: bool = False,
                kv_cache: KVCache | None = None, need_weights: bool = False,
                average_attn_weights: bool = True,
                trace_rows: torch.Tensor | slice | None = None,
                positions: torch.Tensor | None = None,
                intervention: AttentionEdit | None = None,
                trace_only: bool = False) -> AttentionOutput:
        """Attend from `query` (b, t, E) to `key` (b, s, kdim) / `value` (b, s, vdim).

        `key`/`value` default to `query` (self-attention). With `kv_cache` the new keys
        and values are appended to it and the queries attend to everything cached, causally
        aligned bottom-right; rotary positions continue from the cache's length, unless
        `positions` (b, t) gives each new token's position (left-padded batches).

        Masks: either `mask`, an [`AttentionMask`][qkv.attention.AttentionMask] description (what a
        [`TransformerStack`][qkv.modules.TransformerStack] passes down, built once per forward; it
        may hold packed sequences), or the `torch.nn.MultiheadAttention`-style `attn_mask`,
        `key_padding_mask` and `is_causal`. ALiBi reaches the attention as a score bias,
        apart from the mask. A long sequence with a window, document or any `mask_mod` passes
        `mask=AttentionMask(block=qkv.create_block_mask(...))` (or a window/padding/packed
        description) and runs blockwise in O(t) memory (`backend="blockwise"`, or `"auto"`).

        `intervention`: an `AttentionEdit` — value vectors
        scaled (b, h_kv, s) before attending, heads' outputs (b, t, d) replaced or zeroed before
        `out_proj`. The trace records the attention as computed (edited values included); a
        replaced head's new output reaches `output` only.

        `trace_only`: the trace of `trace_rows` (positions or a slice) alone, the full call's
        numbers; no kernel, no `out_proj` (`output` (b, 0, E), `heads` None): a score attribution's.

        Returns:
            An `AttentionOutput`: `output` (b, t, E) always ((b, 0, E) with `trace_only`);
            `weights` when `need_weights`; `trace` when `trace_rows` (query positions, or
            `slice(None)` for all) is given.
        """
        key = query if key is None else key
        value = key if value is None else value
        self._check_inputs(query, key, value)
        b, t, _ = query.shape
        offset = len(kv_cache) if kv_cache is not None else 0

        # 1) project, split into heads, normalise and rotate q and k
        q, k, v = self._project(query, key, value, offset, positions)  # (b, h|h_kv, t|s_new, d)
        # 2) extend with the cached past
        if kv_cache is not None:
            k, v = kv_cache.update(k, v)  # (b, h_kv, s, d)
        s = k.shape[-2]
        description = self._describe(mask, attn_mask, key_padding_mask, b, t, s, is_causal, offset)

        if trace_only:  # the rows' trace alone (qkv.attention.traced.trace_of_rows)
            return self._trace_only(query, key, value, (q, k, v), description, trace_rows,
                                    need_weights, intervention)
        # 3) attend: the fast kernel, the reference path for the rows traced (qkv.attention.traced)
        needs_local = need_weights or kv_cache is not None or key is not query
        writes = trace_rows if isinstance(trace_rows, Writes) else None  # no rows traced: untraced
        rows = None if writes else trace_rows.rows if isinstance(trace_rows, Weights) else trace_rows
        heads, trace, weights = self._attend(q, k, v, description, rows, need_weights, needs_local,
                                             intervention)  # heads: (b, h, t, d)
        # 4) concatenate the heads and mix them
        concat = heads.transpose(1, 2).reshape(b, t, self.num_heads * self.head_dim)  # (b, t, h·d)
        out = self.out_proj(concat)

        if need_weights:
            weights = weights.to(query.dtype)  # (b, h, t, s)
            weights = weights.mean(dim=1) if average_attn_weights else weights
        if writes is not None:
            return AttentionOutput(out, weights, WritesTrace(writes.keep(concat)))
        if isinstance(trace_rows, Weights):
            return AttentionOutput(out, weights, WeightsTrace(trace.weights))
        if trace_rows is None or isinstance(trace_rows, LseRequest):
            return AttentionOutput(out, weights, trace)
        return AttentionOutput(out, weights, self._record(query, key, value, trace_rows, trace, concat, s))

    def _check_inputs(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
        """Each input's rank and width, and their batch (and key/value's length) agreeing."""
        self._check("query", query, self.embed_dim)
        self._check("key", key, self.kdim)
        self._check("value", value, self.vdim)
        if key.shape[:2] != value.shape[:2] or key.shape[0] != query.shape[0]:
            raise ValueError(f"query {tuple(query.shape)}, key {tuple(key.shape)} and value "
                             f"{tuple(value.shape)} must agree on batch, and key/value on length")

    def _project(self, query, key, value, offset: int, positions):
        """q (b, h, t, d), k and v (b, h_kv, s_new, d): projected, split into heads, q and k
        normalised (where the model has q/k norms) and rotated from position `offset`."""
        q = self._split(self.q_proj(query), self.num_heads)  # (b, h, t, d)
        k = self._split(self.k_proj(key), self.num_kv_heads)  # (b, h_kv, s_new, d)
        v = self._split(self.v_proj(value), self.num_kv_heads)  # (b, h_kv, s_new, d)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if hasattr(self.rotary, "pair"):  # RotaryEmbedding: one set of angles for q and k
            q, k = self.rotary.pair(q, k, offset=offset, positions=positions)
        elif self.rotary is not None:
            q = self.rotary(q, offset=offset, positions=positions)
            k = self.rotary(k, offset=offset, positions=positions)
        return q, k, v

    def _trace_only(self, query, key, value, qkv: tuple, description: AttentionMask, trace_rows,
                    need_weights: bool, intervention) -> AttentionOutput:
        """`forward(trace_only=True)` once q, k, v (`qkv`) are made: the rows' trace, recorded."""
        self._check_trace_only(trace_rows, need_weights, intervention)
        trace = self._trace_rows(*qkv, description, trace_rows)
        s = qkv[1].shape[-2]
        record = self._record(query, key, value, trace_rows, trace, None, s)
        return AttentionOutput(query[:, :0], None, record)  # (b, 0, E): no output computed

    def _check_trace_only(self, trace_rows, need_weights: bool, intervention) -> None:
        """ValueError where `trace_only` cannot hold what the call asks."""
        if trace_rows is None or isinstance(trace_rows, (Writes, Weights, LseRequest)):
            raise ValueError(f"trace_only=True traces query rows: give trace_rows as positions "
                             f"or a slice, got {type(trace_rows).__name__}")
        if need_weights or intervention is not None or self.sequence_parallel is not None:
            raise ValueError("trace_only=True computes the traced rows alone: not with "
                             "need_weights, an intervention or sequence parallelism")

    def _trace_rows(self, q, k, v, description: AttentionMask, trace_rows) -> AttentionTrace:
        """The trace of `trace_rows` alone, as `_attend` would record it (no kernel run)."""
        t, s = q.shape[-2], k.shape[-2]
        bias = self.alibi.bias(t, s, device=q.device) if self.alibi is not None else None  # (h, t, s)
        return trace_of_rows(q, k, v, mask=description, bias=bias,
                             dropout_p=self.dropout if self.training else 0.0,
                             enable_gqa=self.num_kv_heads != self.num_heads, rows=trace_rows)

    def _attend(self, q, k, v, description: AttentionMask, trace_rows, need_weights: bool,
                needs_local: bool, intervention):
        """(heads (b, h, t, d), the trace or None, weights (b, h, t, s) or None): this module's
        backend through `traced_attention`, or its sequence shard."""
        t, s = q.shape[-2], k.shape[-2]
        bias = self.alibi.bias(t, s, device=q.device) if self.alibi is not None else None  # (h, t, s)
        dropout_p = self.dropout if self.training else 0.0
        gqa = self.num_kv_heads != self.num_heads
        if self.sequence_parallel is not None:  # this rank's shard of one sequence (qkv.distributed)
            heads, trace = self._attend_shard(q, k, v, description, bias, dropout_p, gqa, trace_rows,
                                              needs_local, intervention)
            return heads, trace, None
        call = traced_attention(q, k, v, mask=description, bias=bias, dropout_p=dropout_p,
                                enable_gqa=gqa, backend=self.backend, rows=trace_rows,
                                need_weights=need_weights, edit=intervention)
        return call.output, call.trace, call.weights

    def _record(self, query, key, value, trace_rows, trace, concat: torch.Tensor | None,
                s: int) -> MultiHeadTrace:
        """The traced rows' record: their inputs, the attention trace, the heads (b, t, h·d;
        None where none were computed) and the position step; key/value inputs only when they
        are the whole key length `s`."""
        rows, new = row_positions(query.shape[1], trace_rows, query.device), key.shape[1]
        return MultiHeadTrace(rows=rows, query_input=query[:, rows],
                              key_input=key if new == s else key.new_empty(0),
                              value_input=value if new == s else value.new_empty(0),
                              attention=trace, heads=concat,
                              position_step=None if self.rotary is None else ModuleRotation(self.rotary))

    def _attend_shard(self, q, k, v, description, bias, dropout_p, gqa, trace_rows, needs_local,
                      intervention) -> tuple[torch.Tensor, LseTrace | None]:
        """This rank's shard of one sequence: (heads (b, h, t, d), an LseTrace or None).
        `trace_rows=LSE` is the one trace a shard can give: its rows' global lse, merged by the
        ring."""
        if intervention is not None:
            intervention.check(self.num_heads)
            v = intervention.edit_values(v)  # (b, h_kv, s, d)
        want_lse = isinstance(trace_rows, LseRequest)
        heads = self.sequence_parallel.attend(
            q, k, v, description, bias=bias, dropout_p=dropout_p, enable_gqa=gqa,
            needs_local=needs_local or (trace_rows is not None and not want_lse), return_lse=want_lse)
        trace = None
        if want_lse:  # this shard's q, k, v (global positions) and its rows' global lse
            heads, lse = heads
            trace = LseTrace(q.detach(), k.detach(), v.detach(), lse.detach(), description)
        if intervention is not None:
            heads = intervention.edit_heads(heads)  # (b, h, t, d)
        return heads, trace

    # -- interop -----------------------------------------------------------------------------
    @classmethod
    def from_torch(cls, m: nn.MultiheadAttention) -> "MultiHeadAttention":
        """A qkv module holding the weights of `torch.nn.MultiheadAttention` `m`.

        Inputs are always batch-first here, whatever `m.batch_first` was, and bool masks keep
        qkv's meaning (True = takes part): pass `~mask` where `m` took `mask`.
        """
        if not isinstance(m, nn.MultiheadAttention):
            raise ValueError(f"from_torch takes a torch.nn.MultiheadAttention, got {type(m).__name__}")
        if m.bias_k is not None or m.add_zero_attn:
            raise ValueError("from_torch: add_bias_kv and add_zero_attn are not supported")
        bias = m.in_proj_bias is not None
        new = cls(m.embed_dim, m.num_heads, kdim=m.kdim, vdim=m.vdim, bias=bias, dropout=m.dropout)
        # the peer's dtype and device before copying, so float64 weights are not rounded to float32
        new = new.to(device=m.out_proj.weight.device, dtype=m.out_proj.weight.dtype)
        E = m.embed_dim
        with torch.no_grad():
            if m._qkv_same_embed_dim:
                wq, wk, wv = m.in_proj_weight.split(E)
            else:
                wq, wk, wv = m.q_proj_weight, m.k_proj_weight, m.v_proj_weight
            for proj, w in ((new.q_proj, wq), (new.k_proj, wk), (new.v_proj, wv)):
                proj.weight.copy_(w)
            if bias:
                for proj, bb in zip((new.q_proj, new.k_proj, new.v_proj), m.in_proj_bias.split(E)):
                    proj.bias.copy_(bb)
                new.out_proj.bias.copy_(m.out_proj.bias)
            new.out_proj.weight.copy_(m.out_proj.weight)
        return new

