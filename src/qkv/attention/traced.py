"""One traced attention call: what every model's attention runs when an explanation reads it.

qkv's own [`MultiHeadAttention`][qkv.modules.MultiHeadAttention] and transformers' attention
function (through `qkv.hf.trace`) both call `traced_attention` with q, k, v after the model's own
positions and norms; it is the one place where

- the rows an explanation reads are traced by the reference path (scores, scaled, softcap,
  bias, mask, sinks, weights, output, lse: [`AttentionTrace`][qkv.attention.trace.AttentionTrace])
  while the other rows run the fast kernel, and the traced rows' outputs *replace* the kernel's, so
  an explanation equals the forward;
- `rows=LSE` records q, k, v and every row's log-sum-exp instead (`LseTrace`, O(t));
- an edit (`AttentionEdit`) scales the value vectors before
  attending and replaces or zeroes heads' outputs after.

```text
q (b, h, t, d) ─┐                       rows asked for: reference path → trace, output rows
k (b, h_kv, s, d) ─ edit values ─ attend                 every other row: the kernel
v (b, h_kv, s, dv) ┘                    → output (b, h, t, dv) ─ edit heads ─→ returned
```

Examples:
    >>> import torch
    >>> from qkv.attention import AttentionMask
    >>> q, k, v = torch.randn(1, 4, 6, 8), torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
    >>> call = traced_attention(q, k, v, mask=AttentionMask(causal=True), enable_gqa=True,
    ...                         rows=torch.tensor([5]), softcap=5.0)
    >>> call.output.shape, call.trace.weights.shape            # (b, h, t, dv), (b, h, r, s)
    (torch.Size([1, 4, 6, 8]), torch.Size([1, 4, 1, 6]))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from qkv.attention.attention_mask import AttentionMask
from qkv.attention.functional import attention_trace, checked_trace, resolve_scale, scaled_dot_product_attention
from qkv.attention.trace import AttentionTrace, LseRequest, LseTrace
from qkv.errors import QkvError


class Edit(Protocol):
    """What `traced_attention` asks of an edit (`qkv.modules.intervention.AttentionEdit`)."""

    def check(self, num_heads: int) -> None: ...

    def edit_values(self, v: torch.Tensor) -> torch.Tensor: ...  # (b, h_kv, s, dv) → same

    def edit_heads(self, heads: torch.Tensor) -> torch.Tensor: ...  # (b, h, t, dv) → same


@dataclass(frozen=True)
class TracedCall:
    """What one traced attention call gives back.

    Attributes:
        output: (b, h, t, dv) every row's output, the traced rows the trace's own, after the
            edit's head changes: what the module concatenates and projects.
        trace: None unless `rows`; then the [`AttentionTrace`][qkv.attention.trace.AttentionTrace]
            of those rows (detached; key/value repeated per query head), or an `LseTrace` for
            `rows=LSE`.
        weights: (b, h, t, s) every row's weights when `need_weights` (in the graph), else None.
    """

    output: torch.Tensor
    trace: AttentionTrace | LseTrace | None = None
    weights: torch.Tensor | None = None


# index dtypes read as positions (torch reads a uint8 index as a mask: left to its indexing)
_POSITIONS = (torch.int64, torch.int32, torch.int16, torch.int8)


def row_positions(t: int, rows, device) -> torch.Tensor:
    """(r,) the query positions `rows` picks out of `t` (positions or a slice); ValueError
    naming it otherwise."""
    if isinstance(rows, torch.Tensor) and rows.ndim == 1 and rows.dtype in _POSITIONS:
        # a few positions, checked in Python after one read (not an arange indexed)
        listed = rows.tolist()
        if all(-t <= r < t for r in listed):
            index = rows.to(device=device, dtype=torch.long)
            return index % t if listed and min(listed) < 0 else index
    try:
        if isinstance(rows, (str, bytes)):  # torch would index with its characters
            raise TypeError("a string is not a position")
        return torch.arange(t, device=device)[rows]
    except (IndexError, TypeError, ValueError, RuntimeError) as e:
        raise ValueError(f"trace_rows must pick query positions among the {t} (0…{t - 1}), "
                         f"got {rows!r} ({e})") from None


def trace_of_rows(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *,
                  mask: AttentionMask, bias: torch.Tensor | None = None,
                  scale: float | None = None, softcap: float | None = None,
                  sinks: torch.Tensor | None = None, dropout_p: float = 0.0,
                  enable_gqa: bool = False, rows: torch.Tensor | slice) -> AttentionTrace:
    """The (detached) trace of query rows `rows` alone, the kernel run for no row: the trace
    `traced_attention(..., rows=rows)` gives (the same reference path on the same arguments),
    for a reader of the trace and nothing else. Arguments as `traced_attention`'s, checked the
    same way."""
    index = row_positions(query.shape[-2], rows, query.device)
    return attention_trace(query, key, value, mask=mask, bias=bias, scale=scale,
                           dropout_p=dropout_p, enable_gqa=enable_gqa, rows=index,
                           softcap=softcap, sinks=sinks).detach()


def traced_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *,
                     mask: AttentionMask, bias: torch.Tensor | None = None,
                     scale: float | None = None, softcap: float | None = None,
                     sinks: torch.Tensor | None = None, dropout_p: float = 0.0,
                     enable_gqa: bool = False, backend: str = "auto",
                     rows: torch.Tensor | slice | LseRequest | None = None,
                     need_weights: bool = False, edit: Edit | None = None) -> TracedCall:
    """Attend from query (b, h, t, d) to key (b, h_kv, s, d) / value (b, h_kv, s, dv), tracing
    the rows asked for and applying `edit` (see the module doc).

    Args:
        mask, bias, scale, softcap, sinks, dropout_p, enable_gqa, backend: as
            [`scaled_dot_product_attention`][qkv.attention.scaled_dot_product_attention] takes them.
        rows: query positions or `slice(None)` to trace, `LSE`
            for every row's lse, or None (trace nothing).
        need_weights: every row's weights too (then every row runs the reference path).
        edit: value and head edits, or None.

    Returns:
        A `TracedCall`.
    """
    if edit is not None:
        edit.check(query.shape[-3])
        value = edit.edit_values(value)  # (b, h_kv, s, dv); a KV cache keeps the unedited ones
    extras = dict(mask=mask, bias=bias, scale=scale, dropout_p=dropout_p, enable_gqa=enable_gqa,
                  softcap=softcap, sinks=sinks)
    trace, weights = None, None
    if isinstance(rows, LseRequest):  # qkv.explain.long.document: every row's lse, O(t)
        if softcap is not None or sinks is not None:  # a document's rows and sums take neither
            raise QkvError("a document of a model with soft-capped attention logits (Gemma 2) or "
                           "sink logits (gpt-oss) is not supported yet: its weights would leave "
                           "them out; explain one token at a time (qkv.explain.explain) instead")
        out, lse = scaled_dot_product_attention(query, key, value, return_lse=True, **extras)
        trace = LseTrace(query.detach(), key.detach(), value.detach(), lse.detach(), mask, scale,
                         softcap=softcap)
    elif need_weights or (rows is not None and dropout_p > 0):
        # every weight wanted (or dropout, whose draw the trace must share): trace every row
        full = attention_trace(query, key, value, **extras)
        out = full.output  # (b, h, t, dv)
        weights = full.weights  # (b, h, t, s)
        if rows is not None:
            trace = full.detach().select_rows(row_positions(query.shape[-2], rows, query.device))
    else:
        out = scaled_dot_product_attention(query, key, value, backend=backend, **extras)
        if rows is not None:
            # trace only the rows asked for: O(r·s) numbers, not O(t·s), for a long text; the
            # traced rows of the output are the trace's own, so an explanation equals the forward
            index = row_positions(query.shape[-2], rows, query.device)
            # the call above checked these arguments: the trace reads them as they are
            described = mask if mask is not None else AttentionMask()
            trace = checked_trace(query, key, value, rows=index, mask=described, bias=bias,
                                  scale=resolve_scale(scale, query.shape[-1]), dropout_p=dropout_p,
                                  enable_gqa=enable_gqa, softcap=softcap, sinks=sinks)
            out = out.index_copy(-2, index, trace.output.to(out.dtype))  # (b, h, t, dv)
            trace = trace.detach()
    if edit is not None:
        out = edit.edit_heads(out)  # (b, h, t, dv)
    return TracedCall(out, trace, weights)
