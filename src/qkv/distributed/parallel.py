"""How a model runs sequence-parallel: a
[`SequenceParallel`][qkv.distributed.parallel.SequenceParallel] given to its attention modules.

The model code stays as it is (torchtitan's rule: parallelism lives beside the model, not in
it). `MultiHeadAttention(..., sequence_parallel=sp)` — or
[`SequenceParallel.apply`][qkv.distributed.parallel.SequenceParallel.apply] on a whole model — makes
each self-attention call `sp.attend` on this rank's shard of the sequence instead of attending
locally; everything else in a transformer (projections, norms, feed-forward) works token by token
and needs no change. Positions must be the global ones
([`shard_positions`][qkv.distributed.shard_positions]).

Example (every rank, inside a process group):

```text
sp = qkv.distributed.SequenceParallel(layout="zigzag", method="ring")
sp.apply(model)                                             # every self-attention
ids = qkv.distributed.shard(input_ids, dim=1)               # (b, t_r)
pos = qkv.distributed.shard_positions(input_ids.shape[1])   # (t_r,) global positions
```
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from qkv.attention.block_mask import document
from qkv.attention.attention_mask import AttentionMask
from qkv.distributed.ring import ring_attention
from qkv.distributed.shard import check_layout
from qkv.distributed.ulysses import ulysses_attention

METHODS = {"ring": ring_attention, "ulysses": ulysses_attention}


@dataclass(frozen=True)
class SequenceParallel:
    """Where and how to run attention sequence-parallel.

    Attributes:
        group: the process group (None = the default group).
        layout: how the sequence is sharded (`"zigzag"` or `"contiguous"`).
        method: `"ring"` ([`ring_attention`][qkv.distributed.ring.ring_attention]) or `"ulysses"`
            ([`ulysses_attention`][qkv.distributed.ulysses.ulysses_attention]).
    """

    group: object = None
    layout: str = "zigzag"
    method: str = "ring"

    def __post_init__(self):
        check_layout(self.layout)
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {sorted(METHODS)}, got {self.method!r}")

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttentionMask, *,
               bias: torch.Tensor | None = None, dropout_p: float = 0.0, enable_gqa: bool = False,
               scale: float | None = None, needs_local: bool = False, return_lse: bool = False):
        """Self-attention of this rank's shard: q (b, h, t_r, d), k/v (b, h_kv, t_r, d) → (b, h,
        t_r, d).

        `mask` is the description a stack passes down, over global positions: causal, window,
        a block mask (`mask.block`) and packed sequences (`mask.varlen`, as documents) are
        supported (alignment does not matter: t = s = N). Refused with a ValueError: key padding
        and dense masks, score biases (ALiBi), attention dropout, and `needs_local` (weights,
        traces, KV caches, cross-attention — what only a local attention can give).
        `return_lse`: (out, lse), lse (b, h, t_r) the global log-sum-exp of this shard's rows
        (what `trace_rows=LSE` records for
        `qkv.explain.long.sharded_document.sharded_document`).
        """
        if needs_local:
            raise ValueError("sequence-parallel attention is self-attention over a sharded sequence: "
                             "need_weights, trace_rows, kv_cache and cross-attention are not available")
        if mask.dense is not None or mask.key_padding is not None or bias is not None or dropout_p:
            raise ValueError("sequence-parallel attention takes causal / window / block masks and "
                             "packed sequences over the global sequence; key padding, dense masks, "
                             "score biases (ALiBi) and attention dropout are not supported")
        block = mask.block
        if mask.varlen is not None:  # the built-in: pairs of chunks classified from their bounds
            block = document(mask.varlen.sequence)
        return METHODS[self.method](q, k, v, group=self.group, is_causal=mask.causal,
                                    window=mask.window, block_mask=block, scale=scale,
                                    enable_gqa=enable_gqa, layout=self.layout, return_lse=return_lse)

    def apply(self, model: nn.Module) -> nn.Module:
        """Give every self-attention of `model` (each layer's `self_attn`, or `model`
        itself when it is one) this strategy, in place; return `model`."""
        from qkv.modules.multihead import MultiHeadAttention

        for module in model.modules():
            attn = module if isinstance(module, MultiHeadAttention) and module is model else \
                getattr(module, "self_attn", None)
            if isinstance(attn, MultiHeadAttention):
                attn.sequence_parallel = self
        return model
