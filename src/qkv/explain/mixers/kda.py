"""Kimi Delta Attention (kimi_linear): the gated delta rule with one decay per key channel.

The math is `qkv.explain.mixers.delta_rule` (`log_decay` (t, h, c) here); this file says
which kernel call of the transformers layer holds its q, k, v, g and β.
"""

from __future__ import annotations

import torch

from qkv.explain.mixers.capture import kernel_call
from qkv.explain.mixers.delta_rule import DeltaRule, from_call

KERNEL = "chunk_kimi_delta_attention"


def read(module: torch.nn.Module, hidden_states: torch.Tensor) -> DeltaRule:
    """Run a `KimiLinearDeltaAttention` layer on one text and return what its delta rule mixed.

    Args:
        module: the layer's `self_attn` where its type is `KimiLinearDeltaAttention`.
        hidden_states: (1, t, hidden) its input, after the layer's norm.
    """
    return from_call("kda", kernel_call(module, KERNEL, hidden_states))
