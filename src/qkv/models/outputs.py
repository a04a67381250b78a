"""What a model's forward returns: typed records, never tuples to index by position.

Dimension letters: b batch, t tokens, E model width, V vocabulary size, L layer index.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from qkv.modules import LayerTrace


@dataclass(frozen=True)
class EncoderOutput:
    """The result of an encoder (BERT) forward.

    Attributes:
        last_hidden_state: (b, t, E) the last layer's output.
        hidden_states: `num_layers + 1` tensors (b, t, E), or None unless asked for.
            `hidden_states[0]` is the embedding output and `hidden_states[L]` is exactly
            what *enters* layer L (so `hidden_states[L + 1]` is layer L's output).
        traces: one `qkv.modules.LayerTrace` per layer for the requested query rows,
            or None unless `trace_rows` was given.
    """

    last_hidden_state: torch.Tensor
    hidden_states: tuple[torch.Tensor, ...] | None = None
    traces: list[LayerTrace] | None = None


@dataclass(frozen=True)
class DecoderOutput:
    """The result of a decoder-only (GPT-2) forward.

    Attributes:
        logits: (b, t, V) next-token scores at every position.
        hidden_states: `num_layers + 1` tensors (b, t, E), or None unless asked for, indexed
            like `EncoderOutput`'s: `hidden_states[L]` enters layer L and the last one
            is the last layer's output *before* the final LayerNorm (Hugging Face's tuple
            instead ends with the normalised one).
        traces: one `qkv.modules.LayerTrace` per layer, or None unless asked for.
    """

    logits: torch.Tensor
    hidden_states: tuple[torch.Tensor, ...] | None = None
    traces: list[LayerTrace] | None = None
