"""Hugging Face's eager BERT as the peer of qkv's explanations, with derived tolerances.

The truth is the peer run in float64 (same weights, :func:`tolerance.twin`); the plain float32
peer's distance from it is what float32 costs here, and qkv's float32 weights may be
``FACTOR`` times as far (:mod:`tolerance`'s rule). A comparison of qkv with the float64 peer
then uses :func:`weights_bound` instead of a constant tuned to one machine.
"""

from __future__ import annotations

import functools

import torch
from tolerance import bound, twin

FACTOR = 2.0  # flash-attention's: qkv's float32 path may round up to twice as much as the plain one


@functools.lru_cache(maxsize=4)
def _hf64(hf):
    return twin(hf, torch.float64)


def hf_attentions(hf, ids: list[int], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(layers, h, t, s) eager attention probabilities of ``hf`` (float64: its float64 twin)."""
    peer = hf if dtype == torch.float32 else _hf64(hf)
    with torch.no_grad():
        out = peer(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                   output_attentions=True)
    return torch.stack(out.attentions)[:, 0].double()


def reference(hf, ids: list[int]) -> tuple[torch.Tensor, float]:
    """(the float64 peer's weights (layers, h, t, s), the derived bound on qkv's float32 weights
    against them: FACTOR · max|hf32 − hf64| + 2 ulp)."""
    ref, plain = hf_attentions(hf, ids, torch.float64), hf_attentions(hf, ids)
    return ref, bound(ref, plain, factor=FACTOR, dtype=torch.float32)
