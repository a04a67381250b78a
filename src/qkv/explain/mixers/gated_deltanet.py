"""Gated DeltaNet (qwen3_next, qwen3_5, qwen3_5_moe, olmo_hybrid): its layer read as a delta rule.

The math is `qkv.explain.mixers.delta_rule`; this file says which kernel call of the
transformers layer holds its q, k, v, g and β (after the projections and the short convolution).
"""

from __future__ import annotations

import torch

from qkv.explain.mixers.capture import kernel_call
from qkv.explain.mixers.delta_rule import DeltaRule, from_call

KERNEL = "torch_chunk_gated_delta_rule"  # a whole text without a cache runs the chunked form


def read(module: torch.nn.Module, hidden_states: torch.Tensor) -> DeltaRule:
    """Run a Gated DeltaNet layer on one text and return what its delta rule mixed.

    Args:
        module: e.g. `Qwen3NextGatedDeltaNet` (the layer's `linear_attn`).
        hidden_states: (1, t, hidden) its input, after the layer's norm.

    Returns:
        `DeltaRule` with `matrix(head)` and `row(head, query)`.
    """
    return from_call("gated_deltanet", kernel_call(module, KERNEL, hidden_states))
