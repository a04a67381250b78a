"""What an explanation reads from a transformers model, recorded inside its attention call.

transformers hands every attention call to ``qkv.hf.attention.qkv_attention_forward`` with q and
k *after* the model's own positions (RoPE, partial rotary, QK-norm …) — the only place where the
numbers the softmax reads exist for any architecture. A forward run inside :func:`recording`
records there, for the attention modules it names (a key per module: the layer index for a
decoder's or encoder's self-attention; any hashable for other calls, e.g. ``("cross", 2)``):

- an :class:`~qkv.attention.AttentionTrace` of the query rows asked for (``rows``: positions or
  ``slice(None)``), computed by the reference path — with the forward's mask, bias, scale,
  soft-cap and sinks — whose output rows *replace* the kernel's, so an explanation equals the
  forward; or, with ``rows=LSE``, an :class:`~qkv.modules.lse_trace.LseTrace` (q, k, v and every
  row's log-sum-exp, O(t) per head);
- the heads' outputs concatenated, (b, t, h·dv): exactly what the module's output projection
  reads (it reshapes the returned (b, t, h, dv) and projects it), in the autograd graph;
- the interventions: ``AttentionEdit.values`` scales the value vectors before attending,
  ``AttentionEdit.heads`` replaces or zeroes heads' outputs before they are returned (= before
  the output projection).

::

    with recording(Recording(keys={id(attn): 0 for ...}, rows=torch.tensor([4]))) as rec:
        model(ids)
    rec.traces[0]          # AttentionTrace (b, h, 1, ·) of layer 0
    rec.heads[0]           # (b, t, h·dv)

A module the recording does not name (or a forward outside any recording) runs untouched. The
recording is a context variable: one per thread, nothing left behind after the ``with``.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import Hashable, Iterator

import torch

from qkv.attention.functional import attention_trace, scaled_dot_product_attention
from qkv.attention.attention_mask import AttentionMask
from qkv.attention.trace import AttentionTrace
from qkv.errors import QkvError
from qkv.modules.intervention import AttentionEdit
from qkv.modules.lse_trace import LseRequest, LseTrace


@dataclass
class Call:
    """One attention call seen while discovering a model's attention modules (shapes only).

    Fields: module; heads h, kv_heads h_kv, head_dim d, value_dim dv; width E of what the
    output projection returns is not known here; t, s the query and key lengths.
    """

    module: torch.nn.Module
    heads: int
    kv_heads: int
    head_dim: int
    value_dim: int
    t: int
    s: int
    output: torch.Tensor  # (b, t, h·dv): what this call returned, to find the output projection


@dataclass
class Recording:
    """What one forward records (see the module doc).

    Fields:
        keys: ``id(module)`` → its key (a layer index …); None: discover (every call is listed
            in ``calls``, nothing else is done).
        rows: query positions to trace, ``slice(None)``, :data:`~qkv.modules.lse_trace.LSE`, or
            None (record nothing but the heads' outputs).
        edits: key → :class:`~qkv.modules.intervention.AttentionEdit` for that call.
        traces, heads: filled by the forward, by key.
        calls: the discovery's calls, in order.
    """

    keys: dict[int, Hashable] | None = None
    rows: torch.Tensor | slice | LseRequest | None = None
    edits: dict[Hashable, AttentionEdit] = field(default_factory=dict)
    traces: dict[Hashable, AttentionTrace | LseTrace] = field(default_factory=dict)
    heads: dict[Hashable, torch.Tensor] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)


_ACTIVE: ContextVar[Recording | None] = ContextVar("qkv_hf_recording", default=None)


@contextmanager
def recording(rec: Recording) -> Iterator[Recording]:
    """Make ``rec`` the recording of every attention call in this thread until the ``with`` ends."""
    token = _ACTIVE.set(rec)
    try:
        yield rec
    finally:
        _ACTIVE.reset(token)


def active() -> Recording | None:
    """The recording in force, or None."""
    return _ACTIVE.get()


def row_trace(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, rows: torch.Tensor, *,
              mask: AttentionMask, bias: torch.Tensor | None, scale: float, groups: int,
              softcap: float | None = None, sinks: torch.Tensor | None = None) -> AttentionTrace:
    """The :class:`AttentionTrace` of query rows ``rows`` (r,): every intermediate, as the reference
    path computes it, with soft-capping and sinks counted (q (b, h, t, d), k (b, h_kv, s, d)).

    Soft-capping sits between the scaling and the mask (Gemma 2: ``c · tanh(z / c)``), so the
    masked scores are rebuilt from the reference's ``scaled``, ``bias`` and ``mask`` rows; a sink
    adds ``exp(sinks[h])`` to each row's denominator (gpt-oss) and takes no value.
    """
    tr = attention_trace(query, key, value, mask=mask, bias=bias, scale=scale,
                         enable_gqa=groups > 1, rows=rows)
    if softcap is None and sinks is None:
        return tr
    masked = tr.scaled if softcap is None else softcap * torch.tanh(tr.scaled / softcap)  # (b, h, r, s)
    for extra in (tr.bias, tr.mask):
        if extra is not None:
            masked = masked + extra
    lse = torch.logsumexp(masked, dim=-1)  # (b, h, r)
    if sinks is not None:
        lse = torch.logaddexp(lse, sinks.to(lse.dtype)[:, None])  # the sink's share of the denominator
    safe = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)  # a row with no key: weights 0
    weights = torch.exp(masked - safe[..., None])  # (b, h, r, s)
    output = (weights @ tr.value.to(weights.dtype)).to(tr.output.dtype)  # (b, h, r, dv)
    return replace(tr, masked=masked, weights=weights, output=output, lse=lse, softcap=softcap,
                   sinks=None if sinks is None else sinks.detach())


def _positions(t: int, rows, device) -> torch.Tensor:
    return torch.arange(t, device=device)[rows]


def traced_attention(rec: Recording, key_: Hashable, query: torch.Tensor, key: torch.Tensor,
                     value: torch.Tensor, *, mask: AttentionMask, bias: torch.Tensor | None,
                     scale: float, softcap: float | None, sinks: torch.Tensor | None,
                     dropout_p: float) -> torch.Tensor:
    """One attention call under ``rec`` for the module keyed ``key_``: its output (b, t, h, dv),
    with the rows asked for traced (and their output rows the trace's own), the edits applied
    and the heads' outputs kept."""
    edit = rec.edits.get(key_)
    groups = query.shape[1] // key.shape[1]
    if edit is not None:
        edit.check(query.shape[1])
        value = edit.edit_values(value)  # (b, h_kv, s, dv)
    extras = dict(mask=mask, bias=bias, dropout_p=dropout_p, scale=scale, enable_gqa=groups > 1,
                  softcap=softcap, sinks=sinks)
    if isinstance(rec.rows, LseRequest):  # qkv.explain.document: every row's lse, O(t)
        if softcap is not None or sinks is not None:  # qkv.explain.document's rows and sums take neither
            raise QkvError("a document of a model with soft-capped attention logits (Gemma 2) or "
                           "sink logits (gpt-oss) is not supported yet: its weights would leave "
                           "them out; explain one token at a time (qkv.explain.explain) instead")
        out, lse = scaled_dot_product_attention(query, key, value, return_lse=True, **extras)
        rec.traces[key_] = LseTrace(query.detach(), key.detach(), value.detach(), lse.detach(), mask,
                                    scale, softcap=softcap)
    else:
        out = scaled_dot_product_attention(query, key, value, **extras)  # (b, h, t, dv)
        if rec.rows is not None:
            rows = _positions(query.shape[2], rec.rows, query.device)
            tr = row_trace(query, key, value, rows, mask=mask, bias=bias, scale=scale, groups=groups,
                           softcap=softcap, sinks=sinks)
            out = out.index_copy(-2, rows, tr.output.to(out.dtype))  # the explanation is the forward
            rec.traces[key_] = tr.detach()
    if edit is not None:
        out = edit.edit_heads(out)  # (b, h, t, dv)
    b, h, t, dv = out.shape
    heads = out.transpose(1, 2).reshape(b, t, h * dv)  # (b, t, h·dv): the output projection's input
    rec.heads[key_] = heads
    return heads.view(b, t, h, dv)  # (b, t, h, dv) as transformers expects: a view of ``heads``
