"""What an explanation reads from a transformers model, recorded inside its attention call.

transformers hands every attention call to `qkv.hf.attention.qkv_attention_forward` with q and
k *after* the model's own positions (RoPE, partial rotary, QK-norm …) — the only place where the
numbers the softmax reads exist for any architecture. A forward run inside `recording`
records there, for the attention modules it names (a key per module: the layer index for a
decoder's or encoder's self-attention; any hashable for other calls, e.g. `("cross", 2)`):

- an [`AttentionTrace`][qkv.attention.AttentionTrace] of the query rows asked for (`rows`: positions
  or `slice(None)`), computed by the reference path — with the forward's mask, bias, scale,
  soft-cap and sinks — whose output rows *replace* the kernel's, so an explanation equals the
  forward; or, with `rows=LSE`, an `LseTrace` (q, k, v and every
  row's log-sum-exp, O(t) per head) — both by `qkv.attention.traced.traced_attention`, the
  one traced attention qkv's own layers call too;
- the heads' outputs concatenated, (b, t, h·dv): exactly what the module's output projection
  reads (it reshapes the returned (b, t, h, dv) and projects it), in the autograd graph (kept
  for a request of rows, or of nothing);
- for `Weights(rows)`, the traced rows' weights alone (a `WeightsTrace`); for `Writes(positions)`,
  the heads' outputs at the positions alone (a `WritesTrace`), the attention untraced — the
  requests qkv's own layers honour (`qkv.modules.writes`), asked of each call by its key
  (`Recording.requests`: what `HFModel.forward` makes of a `LayerRows`);
- the interventions: `AttentionEdit.values` scales the value vectors before attending,
  `AttentionEdit.heads` replaces or zeroes heads' outputs before they are returned (= before
  the output projection).

```text
with recording(Recording(keys={id(attn): 0 for ...}, rows=torch.tensor([4]))) as rec:
    model(ids)
rec.traces[0]          # AttentionTrace (b, h, 1, ·) of layer 0
rec.heads[0]           # (b, t, h·dv)
```

A module the recording does not name (or a forward outside any recording) runs untouched. The
recording is a context variable: one per thread, nothing left behind after the `with`.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Hashable, Iterator

import torch

from qkv.attention.attention_mask import AttentionMask
from qkv.attention.trace import AttentionTrace, LseRequest, LseTrace
from qkv.attention.traced import traced_attention as attend
from qkv.modules.intervention import AttentionEdit
from qkv.modules.writes import Weights, WeightsTrace, Writes, WritesTrace


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
    indexed: bool = False  # an indexer's selected keys came with the call (sparse attention)
    # what the call's scores carry beyond q·k, the mask and the scale (an lse record keeps
    # neither): "a score bias", "soft-capped logits", "sink logits"
    extras: tuple[str, ...] = ()


@dataclass
class Recording:
    """What one forward records (see the module doc).

    Attributes:
        keys: `id(module)` → its key (a layer index …); None: discover (every call is listed
            in `calls`, nothing else is done).
        rows: query positions to trace, `slice(None)`, `LSE`, `Weights`, `Writes`, or
            None (record nothing but the heads' outputs): what every call records.
        requests: key → that call's own request (any of `rows`' kinds), in place of `rows`;
            None: every call records `rows`.
        edits: key → `AttentionEdit` for that call.
        traces: filled by the forward, by key.
        heads: see `traces`.
        calls: the discovery's calls, in order.
    """

    keys: dict[int, Hashable] | None = None
    rows: torch.Tensor | slice | LseRequest | Weights | Writes | None = None
    requests: dict[Hashable, object] | None = None
    edits: dict[Hashable, AttentionEdit] = field(default_factory=dict)
    traces: dict[Hashable, AttentionTrace | LseTrace] = field(default_factory=dict)
    heads: dict[Hashable, torch.Tensor] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    called: set = field(default_factory=set)  # the keys whose first call ran

    def request(self, key: Hashable):
        """What the call keyed `key` records (`requests`' entry, else `rows`)."""
        return self.rows if self.requests is None else self.requests.get(key)


_ACTIVE: ContextVar[Recording | None] = ContextVar("qkv_hf_recording", default=None)


@contextmanager
def recording(rec: Recording) -> Iterator[Recording]:
    """Make `rec` the recording of every attention call in this thread until the `with` ends."""
    token = _ACTIVE.set(rec)
    try:
        yield rec
    finally:
        _ACTIVE.reset(token)


def active() -> Recording | None:
    """The recording in force, or None."""
    return _ACTIVE.get()


def traced_attention(rec: Recording, key_: Hashable, query: torch.Tensor, key: torch.Tensor,
                     value: torch.Tensor, *, mask: AttentionMask, bias: torch.Tensor | None,
                     scale: float, softcap: float | None, sinks: torch.Tensor | None,
                     dropout_p: float) -> torch.Tensor:
    """One attention call under `rec` for the module keyed `key_`: its output (b, t, h, dv),
    by `qkv.attention.traced.traced_attention` (the rows asked for traced, their output
    rows the trace's own, the edits applied), with what its request keeps (`Recording`).
    A module's second call in one forward (differential attention's second map) is kept under
    `(key_, 1)`, with the first's request; the edits apply to the first."""
    asked = rec.request(key_)
    if key_ in rec.called:
        key_ = (key_, 1)
    rec.called.add(key_)
    writes = asked if isinstance(asked, Writes) else None  # no rows traced: untraced
    rows = None if writes else asked.rows if isinstance(asked, Weights) else asked
    call = attend(query, key, value, mask=mask, bias=bias, scale=scale, softcap=softcap, sinks=sinks,
                  dropout_p=dropout_p, enable_gqa=query.shape[1] != key.shape[1], rows=rows,
                  edit=rec.edits.get(key_))
    b, h, t, dv = call.output.shape
    heads = call.output.transpose(1, 2).reshape(b, t, h * dv)  # (b, t, h·dv): the output projection's input
    if writes is not None:
        rec.traces[key_] = WritesTrace(writes.keep(heads))
    elif isinstance(asked, Weights):
        rec.traces[key_] = WeightsTrace(call.trace.weights)
    elif call.trace is not None:
        rec.traces[key_] = call.trace
    if not isinstance(asked, (Weights, Writes, LseRequest)):
        rec.heads[key_] = heads  # a row trace's MultiHeadTrace.heads; with nothing traced, all it keeps
    return heads.view(b, t, h, dv)  # (b, t, h, dv) as transformers expects: a view of ``heads``
