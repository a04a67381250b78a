"""What a request for attention weights holds in memory, asked before it runs: one cost model.

Every entry point that computes weights over a whole text asks [`map_cost`][qkv.explain.cost.map_cost]
or [`document_cost`][qkv.explain.cost.document_cost] first, and
[`check_fits`][qkv.explain.cost.check_fits] refuses, in one line, what would not fit — instead of
the process being killed:

```text
request                         path     bytes at the peak
one head's map   (1 map)        lse      forward + maps · t · s · c + block + first call
one layer's maps (h maps)       lse      (the forward stops after the layer: q, k, lse kept)
every layer's    (L · h maps)   lse
any of them, a model that       trace    forward + L · h · t · s · TRACE_TENSORS + the last call's
cannot stop after the layer                temporaries + maps · t · s · c + first call (every
                                           layer's whole trace is kept)
a document                      document forward + t · TOKEN_BYTES + first call (never t · s)
```

`forward` is [`forward_bytes`][qkv.explain.cost.forward_bytes] (what the forward holds: every
layer's q, k, v, lse and input, one layer's work); `c` the copies the answer is made in (the map,
the stack of every layer's, the grouping into words); `block` the
reference path's working set for one block of rows (`REFERENCE_TENSORS` tensors of at most
`BLOCK_NUMBERS` numbers: `qkv.explain.forward.block_weights`). Measured (loaded machine, VmHWM):
MiniLM's every layer's maps 68–76 MB at 254 tokens (98 estimated), 248–288 MB at 512 (347); a tiny
transformers Llama on the trace path (2 layers, 4 heads), one head's map 41–45 MB at 480 tokens (50).
tests/explain/test_cost.py measures the peak (VmHWM of a fresh process) at two lengths and holds
the estimate at or above it, and above it by at most the parts it counts that need not be live at
the peak (the forward, a block, the maps' one temporary copy).

Examples:
    >>> import qkv
    >>> cost = map_cost(qkv.load("minilm"), 128, EVERY)
    >>> cost.path, cost.maps, cost.result_bytes == 6 * 12 * 128 * 128 * 4
    ('lse', 72, True)
"""

from __future__ import annotations

import math
import numbers
import resource
from dataclasses import dataclass

import torch

from qkv.errors import QkvError
from qkv.explain.forward import BLOCK_NUMBERS, model_name, num_heads, num_layers, stops_at_layer
from qkv.explain.wording import ArgumentError

#: the requests a map entry point makes: one head's map, one layer's heads, every layer's heads
HEAD, LAYER, EVERY = "one head's map", "one layer's maps", "every layer's maps"
REQUESTS = (HEAD, LAYER, EVERY)
#: the (t, s) tensors a trace keeps per head: scores, scaled, masked, weights
#: (`qkv.attention.trace.AttentionTrace`; its mask is one per layer)
TRACE_TENSORS = 4
#: the reference path's temporaries while one call runs, (t, s) per head: logsumexp's
#: exponentials, the softmax before its empty rows are zeroed
WORKING_TENSORS = 2
#: a block of rows' working set, (rows × keys) numbers each: what its trace keeps, its
#: temporaries and its mask's rows
REFERENCE_TENSORS = TRACE_TENSORS + WORKING_TENSORS + 1
#: what the text side holds per token once tokenised: the tokenizer's Encoding (ids, offsets,
#: token strings, masks), the Python lists read from it, the page's label of the token and its
#: JSON (measured with ``qkv view --file``'s work on reader, 25k–100k tokens: ~0.7 KB; rounded up)
TOKEN_BYTES = 1024
#: the peak while the tokenizer runs, per byte of UTF-8 text (measured: ~350 on reader, 2 bytes a
#: token; a 10 MB text took 1.6 GB): checked before tokenising, when N is not known yet
TOKENIZING_BYTES = 400
#: what a process's first forward allocates whatever the length (torch's thread pools, the
#: kernels' workspaces): ~40 MiB measured on reader's first document
FIRST_CALL_BYTES = 64 * 2**20
#: the most bytes of whole maps (every layer's, every head's) the viewer sends a page at once:
#: MiniLM's 6 × 12 maps of 48 tokens in float32 (a page draws 72 thumbnails of them)
WHOLE_MAPS_BYTES = 6 * 12 * 48 * 48 * 4


@dataclass(frozen=True)
class Cost:
    """What one request holds at its peak.

    Attributes:
        request: `HEAD`, `LAYER`, `EVERY` or `"a document"`.
        tokens: t, the text's length in tokens.
        maps: how many (t, s) maps the answer holds (0 for a document).
        path: `"lse"` (each layer's q, k and lse kept, rows a block at a time), `"trace"` (every
            layer's whole trace) or `"document"` (the record alone, O(t)).
        bytes: the estimate of the peak, in bytes.
        result_bytes: what the answer's maps hold, in bytes (what a viewer sends a page).
        block_bytes: the working set of one block of rows (`"lse"`; 0 otherwise).
    """

    request: str
    tokens: int
    maps: int
    path: str
    bytes: int
    result_bytes: int
    block_bytes: int


def _attention_layers(model) -> list:
    return [layer.self_attn for layer in model.layers if layer.self_attn is not None]  # None: not softmax


def _element_size(model) -> int:
    for p in model.parameters():
        return p.element_size()
    return 4


def forward_bytes(model, n: int) -> int:
    """What the recorded forward over `n` tokens holds, in bytes: the record of every layer
    (queries, keys, values until the forward ends, lse, value norms), what enters every layer
    (the stack keeps each), and one layer's working set — fitted to the peak RSS of `qkv view
    --file` on reader (25k–100k tokens, docs/reliability.md): 16 vectors of the model's width
    (norms, projections, rotated copies, attention output, residuals) and 6 of its widest linear
    layer (the gated feed-forward's gate, up, activation and product, with their copies)."""
    size = _element_size(model)
    attns = _attention_layers(model)
    total = 0
    for attn in attns:
        q = attn.num_heads * attn.head_dim
        kv = attn.num_kv_heads * attn.head_dim
        total += n * ((q + 2 * kv) * size + 2 * attn.num_heads * 4)  # q, k, v; lse, value norms
    widest = max((mod.out_features * size for layer in model.layers
                  for mod in layer.modules() if isinstance(mod, torch.nn.Linear)), default=0)
    first = attns[0]
    width = first.embed_dim * size
    kept = (len(model.layers) + 1) * width  # what enters each layer, and the last output
    return total + n * (kept + 16 * width + 6 * widest)


def tokenizing_bytes(text: str) -> int:
    """The most memory tokenising `text` takes, in bytes (`TOKENIZING_BYTES` a byte)."""
    return TOKENIZING_BYTES * len(text.encode("utf-8", "surrogatepass"))


def estimate_bytes(model, n: int) -> int:
    """How much memory [`document`][qkv.explain.long.document.document] holds at its peak for `n`
    tokens, in bytes: the tokens (`TOKEN_BYTES` each), the recorded forward
    ([`forward_bytes`][qkv.explain.cost.forward_bytes]) and `FIRST_CALL_BYTES`. Measured
    peaks (reader, `qkv view --file`'s work): 12k tokens 330 MiB, 48k 1,168 MiB, 96k 1,607 MiB
    against 376, 1,314 and 2,566 estimated."""
    return n * TOKEN_BYTES + forward_bytes(model, n) + FIRST_CALL_BYTES


def document_cost(model, n: int) -> Cost:
    """A document's [`Cost`][qkv.explain.cost.Cost] for `n` tokens
    ([`estimate_bytes`][qkv.explain.cost.estimate_bytes])."""
    return Cost(request="a document", tokens=n, maps=0, path="document",
                bytes=estimate_bytes(model, n), result_bytes=0, block_bytes=0)


def map_cost(model, t: int, request: str, *, layer: int | None = None, words: bool = False) -> Cost:
    """The [`Cost`][qkv.explain.cost.Cost] of `request` (`HEAD`, `LAYER` at `layer`, or `EVERY`)
    over a text of `t` tokens: its path (`"lse"` where the forward can stop after the layer and keep
    q, k and lse — `stops_at_layer` — `"trace"` otherwise) and its bytes (the table above).

    Args:
        words: the maps are regrouped into words (two more copies, at most t × t each).
    """
    if request not in REQUESTS:
        raise ValueError(f"request must be one of {REQUESTS}, got {request!r}")
    h, L = num_heads(model), num_layers(model)
    maps = {HEAD: 1, LAYER: h, EVERY: L * h}[request]
    layers = range(L) if request == EVERY else [layer if layer is not None else L - 1]
    size = max(4, _element_size(model))  # the attention computes in float32 (float64 for fp64)
    one = t * t * size
    # the maps and one temporary of their size (every layer's stacked from a list), two more
    # grouped into words; the finite check reads row sums (maps._check_finite, finite._finite)
    copies = 2 + 2 * words
    block = 0
    if all(stops_at_layer(model, i) for i in layers):
        # one head at a time, or every head in one call where the mask may differ between heads
        # (`block_weights`): at most BLOCK_NUMBERS a block — counted as the every-head call's
        path, block = "lse", min(min(maps, h) * t * t, BLOCK_NUMBERS) * size * REFERENCE_TENSORS
        work = block
    else:
        # every layer's trace and mask; the last call's temporaries; the finite check's copy
        # of one layer's weights (qkv.explain.finite)
        path = "trace"
        work = L * h * one * TRACE_TENSORS + L * one + h * one * (WORKING_TENSORS + 1)
    need = forward_bytes(model, t) + work + copies * maps * one + FIRST_CALL_BYTES
    return Cost(request=request, tokens=t, maps=maps, path=path, bytes=need, result_bytes=maps * one,
                block_bytes=block)


def whole_maps_fit(model, t: int) -> bool:
    """Whether every head's map of a `t`-token text is sent to a page at once (the viewer's and the
    export's choice): the maps of `EVERY` hold at most `WHOLE_MAPS_BYTES`; longer texts go per
    head (and per row beyond the map limit)."""
    return map_cost(model, t, EVERY).result_bytes <= WHOLE_MAPS_BYTES


def whole_maps_units(model) -> int:
    """The longest text, in tokens, whose whole maps fit (`whole_maps_fit`): what a page compares
    its units with before asking for every head's map."""
    per_token2 = map_cost(model, 1, EVERY).result_bytes
    return math.isqrt(WHOLE_MAPS_BYTES // per_token2)


def memory_allowed(memory_limit) -> int | None:
    """The bytes a document may take: `memory_limit` (a positive, finite number of bytes), or
    the memory available now when it is None; ArgumentError naming `memory_limit` otherwise."""
    if memory_limit is None:
        return available_bytes()
    if isinstance(memory_limit, bool) or not isinstance(memory_limit, numbers.Real) \
            or not math.isfinite(memory_limit) or memory_limit <= 0:
        raise ArgumentError("memory_limit", "{name} must be a positive, finite number of bytes (None: "
                            "the memory available now), got {value!r}", value=memory_limit)
    return int(memory_limit)


def available_bytes(device: torch.device | None = None) -> int | None:
    """The memory a request on `device` may still take: on a CUDA device its free memory
    (`torch.cuda.mem_get_info`); on the CPU MemAvailable from /proc/meminfo (Linux), or less where
    an address-space limit (`ulimit -v`, RLIMIT_AS) leaves less above what this process maps now;
    None where neither can be read."""
    if device is not None and torch.device(device).type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    have = _status("/proc/meminfo", "MemAvailable:")
    limit, _ = resource.getrlimit(resource.RLIMIT_AS)
    mapped = _status("/proc/self/status", "VmSize:")
    if limit != resource.RLIM_INFINITY and mapped is not None:
        left = max(0, limit - mapped)
        have = left if have is None else min(have, left)
    return have


def _status(path: str, key: str) -> int | None:
    """The value of `key` (kB) in a /proc file, in bytes; None where it cannot be read."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def gib(n: int) -> str:
    """`n` bytes as the messages write them: `1.25 GiB`."""
    return f"{n / 2**30:.2f} GiB"


def check_fits(model, cost: Cost, have: int | None) -> None:
    """QkvError, one line, when `cost` needs more than `have` bytes (None: not known, nothing is
    refused): the request, the length, the estimate, what is available, and what to use instead."""
    if have is None or cost.bytes <= have:
        return
    raise QkvError(f"{cost.request} of {model_name(model)} over {cost.tokens} tokens would take about "
                   f"{gib(cost.bytes)} ({cost.maps} map{'s' * (cost.maps != 1)} of {cost.tokens} × {cost.tokens}, "
                   f"{'a whole trace' if cost.path == 'trace' else 'q, k, lse and a block of rows'}) "
                   f"but {gib(have)} is available; read a long text with "
                   f"qkv.explain.long.document.document() (O(N) memory)")


__all__ = ["Cost", "EVERY", "FIRST_CALL_BYTES", "HEAD", "LAYER", "REQUESTS", "TOKEN_BYTES",
           "TOKENIZING_BYTES", "TRACE_TENSORS", "WORKING_TENSORS", "WHOLE_MAPS_BYTES", "available_bytes", "check_fits", "document_cost",
           "estimate_bytes", "forward_bytes", "map_cost", "memory_allowed", "tokenizing_bytes",
           "whole_maps_fit", "whole_maps_units"]
