"""The one layer loop: a [`TransformerStack`][qkv.modules.stack.TransformerStack] of
[`TransformerLayer`][qkv.modules.transformer.TransformerLayer]s.

Every model — BERT's encoder, GPT-2's decoder, both halves of the translation model — runs its
layers through [`TransformerStack.forward`][qkv.modules.stack.TransformerStack.forward]; nowhere
else loops over layers:

```text
x ─► layer 0 ─► layer 1 ─► … ─► layer L−1 ─► [final norm] ─► last_hidden_state
│        │          │                  │
hidden_states[0]   [1]     …        [L]   (what enters layer ℓ is hidden_states[ℓ])
```

The mask is built once per forward as an [`AttentionMask`][qkv.attention.AttentionMask] description
(causal, padding, packed sequences) and handed to every layer unchanged.

`trace_rows=LayerRows(ℓ, rows)` traces `rows` in layer ℓ alone and stops the loop after it:
an explanation of one layer pays for layers 0…ℓ, not for the rest (nor for the model's head).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator

import torch
from torch import nn

from qkv.attention.attention_mask import AttentionMask
from qkv.attention.trace import LseRequest
from qkv.modules.intervention import Interventions
from qkv.modules.kv_cache import KVCache
from qkv.modules.transformer import LayerTrace, TransformerLayer
from qkv.modules.writes import Weights, Writes


@dataclass(frozen=True)
class LayerRows:
    """`trace_rows=LayerRows(layer, rows)`: trace `rows` in layer `layer` only, and stop.

    Attributes:
        layer: the layer whose attention is recorded (from 0); the layers after it do not run.
        rows: what that layer records — query positions, `slice(None)`, or
            `LSE` (q, k, v and every row's lse: O(t) per head).
        earlier: True: record the same `rows` in every layer before it too; a
            [`Writes`][qkv.modules.writes.Writes]: record there only each head's output and
            the residual at its positions (what a decomposition of layer `layer`'s input reads),
            the attention running untraced; a [`Weights`][qkv.modules.writes.Weights]: record
            there only the weights of its rows (what a NaN check of the layers before reads).
        attention_only: layer `layer` runs its self-attention for the trace of `rows` (query
            positions) alone (where its layer class is `TransformerLayer`'s own forward): a
            reader of that trace (a score attribution) pays for no kernel, `out_proj`, residual
            or feed-forward there; `hidden_states` then end with what entered it
            (`hidden_states[layer + 1]` is not computed) and its `LayerTrace.residual` is None.

    It rides on `trace_rows` because every model already threads that argument from its
    forward to the stack. The stack's output then holds `traces[layer]` (the others None, or
    each earlier layer's with `earlier`),
    `hidden_states` up to what layer `layer` computed, and a `last_hidden_state` with no
    positions, (b, 0, E): nothing after the layer was computed, so a model's head reads nothing.
    """

    layer: int
    rows: torch.Tensor | slice | LseRequest
    earlier: bool | Writes | Weights = False
    attention_only: bool = False

    def at(self, layer: int):
        """What layer `layer` (≤ `self.layer`) is asked to record: `rows`, `earlier`'s, or None."""
        if layer == self.layer:
            return self.rows
        if isinstance(self.earlier, (Writes, Weights)):  # a request of its own for every earlier layer
            return self.earlier
        return self.rows if self.earlier else None


def stop_note(layers, layer: int) -> str:
    """Why a stack of `layers` cannot stop after `layer` keeping only what a `LayerRows` asks
    ("" where it can): the layer is not a `TransformerLayer` (its forward does not read
    `LayerRows`), or its attention's scores carry what a record of q, k and the lse does not
    keep (ALiBi's bias), or it runs sequence-parallel. qkv's own models answer
    `model.stop_note(layer)` with it (the model protocol's question)."""
    lay = layers[layer]
    if not isinstance(lay, TransformerLayer):
        return f"layer {layer} is run by the model's own loop, not qkv's TransformerStack"
    if lay.self_attn.alibi is not None:  # a TransformerLayer's is a MultiHeadAttention
        return f"layer {layer}'s attention adds ALiBi's score bias, which an lse record does not keep"
    if lay.self_attn.sequence_parallel is not None:
        return f"layer {layer}'s attention runs sequence-parallel"
    return ""


@dataclass(frozen=True)
class StackOutput:
    """What a stack returns, whatever was asked for.

    Attributes:
        last_hidden_state: (b, t, E) the last layer's output, after the final norm if any;
            (b, 0, E) when `trace_rows` was a `LayerRows` (the forward stopped there).
        hidden_states: None unless asked for; then `num_layers + 1` tensors (b, t, E):
            `hidden_states[ℓ]` is exactly what enters layer ℓ, and the last one is the last
            layer's output *before* the final norm. Under `LayerRows(ℓ, …, earlier=Writes(p))`
            those entering the layers before ℓ are `AtPositions` of the positions p.
        traces: None unless `trace_rows`; then one `LayerTrace` per layer (up to
            the stop, None but there, for a `LayerRows`).
    """

    last_hidden_state: torch.Tensor
    hidden_states: tuple[torch.Tensor, ...] | None = None
    traces: list[LayerTrace] | None = None


class TransformerStack(nn.Module):
    """Layers applied in order, then an optional final norm (pre-norm stacks end with one).

    Indexing, `len` and iteration reach the layers: `stack[0].self_attn`.

    Examples:
        >>> stack = TransformerStack([TransformerLayer.build(16, 4, 32) for _ in range(2)])
        >>> out = stack(torch.randn(1, 5, 16), mask=AttentionMask(causal=True),
        ...             output_hidden_states=True)
        >>> out.last_hidden_state.shape, len(out.hidden_states)
        (torch.Size([1, 5, 16]), 3)
    """

    def __init__(self, layers: Iterable[TransformerLayer], norm: nn.Module | None = None):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.norm = norm

    def __len__(self) -> int:
        return len(self.layers)

    def __getitem__(self, index: int) -> TransformerLayer:
        return self.layers[index]

    def __iter__(self) -> Iterator[TransformerLayer]:
        return iter(self.layers)

    def forward(self, x: torch.Tensor, *, mask: AttentionMask | None = None,
                memory: torch.Tensor | None = None, memory_mask: AttentionMask | None = None,
                kv_caches: list[KVCache] | None = None,
                memory_kv_caches: list[KVCache] | None = None,
                trace_rows: torch.Tensor | slice | None = None,
                output_hidden_states: bool = False,
                positions: torch.Tensor | None = None,
                interventions: Interventions | None = None) -> StackOutput:
        """x: (b, t, E) → a `StackOutput`.

        Args:
            mask: the self-attention's [`AttentionMask`][qkv.attention.AttentionMask] (None = full);
                `AttentionMask(block=qkv.create_block_mask(...))` carries a block mask (a
                window, packed documents, any `mask_mod`) to every layer.
            memory, memory_mask: the encoder output (b, s, E) and its mask, for layers with
                cross-attention.
            kv_caches, memory_kv_caches: one [`KVCache`][qkv.modules.kv_cache.KVCache] per layer
                (decoding).
            trace_rows: query positions whose attention every layer records, or a
                `LayerRows`: one layer's, and the forward stops after it.
            output_hidden_states: also return what enters each layer.
            positions: (b, t) each token's position, for rotary embeddings (default: counted
                from the caches' length).
            interventions: an `Interventions`: heads zeroed or
                replaced, value vectors zeroed, what enters a layer patched. `hidden_states`
                stay what each stage computed (`hidden_states[ℓ]` is layer ℓ−1's output, or the
                embeddings); an `inputs[ℓ]` patch replaces it on its way into layer ℓ.
        """
        for name, caches in (("kv_caches", kv_caches), ("memory_kv_caches", memory_kv_caches)):
            if caches is not None and len(caches) != len(self.layers):
                raise ValueError(f"{name} must hold one KVCache per layer ({len(self.layers)}), "
                                 f"got {len(caches)}")
        if interventions is not None:
            interventions.check(len(self.layers))
        stop = self._stop(trace_rows)
        hidden, traces = [x], []
        for i, layer in enumerate(self.layers):
            edit = None
            if interventions is not None:
                x, edit = interventions.input(i, x), interventions.attention(i)
            rows = trace_rows if stop is None else trace_rows.at(i)
            short = i == stop and trace_rows.attention_only and getattr(layer, "sequential_residual", False)
            out = layer(x, mask=mask, memory=memory, memory_mask=memory_mask,
                        kv_cache=kv_caches[i] if kv_caches is not None else None,
                        memory_kv_cache=memory_kv_caches[i] if memory_kv_caches is not None else None,
                        trace_rows=rows, positions=positions,
                        **({} if edit is None else {"intervention": edit}),
                        **({"attention_only": True} if short else {}))
            if stop is not None and i < stop and isinstance(trace_rows.earlier, Writes):
                hidden[i] = trace_rows.earlier.keep(hidden[i])  # its positions' rows: all it reads
            if short:  # its trace is all that was asked: no output of the layer was computed
                traces.append(out.trace)
                x = x[:, :0]  # (b, 0, E)
                break
            x = out.hidden
            hidden.append(x)
            traces.append(out.trace)
            if i == stop:  # nothing later is asked for: the remaining layers never run
                x = x[:, :0]  # (b, 0, E)
                break
        return StackOutput(
            last_hidden_state=self.norm(x) if self.norm is not None and stop is None else x,  # (b, 0, E) after a stop
            hidden_states=tuple(hidden) if output_hidden_states else None,
            traces=traces if trace_rows is not None else None,
        )

    def _stop(self, trace_rows) -> int | None:
        """The layer a `LayerRows` stops after (checked), else None."""
        if not isinstance(trace_rows, LayerRows):
            return None
        n = len(self.layers)
        if isinstance(trace_rows.layer, bool) or not isinstance(trace_rows.layer, int) \
                or not 0 <= trace_rows.layer < n:
            raise ValueError(f"LayerRows.layer must be a layer of the stack (0…{n - 1}), got "
                             f"{trace_rows.layer!r}")
        return trace_rows.layer
