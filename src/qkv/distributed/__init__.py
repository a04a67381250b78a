"""Sequence parallelism on `torch.distributed`: one sequence's attention across processes.

* `shard` / [`unshard`][qkv.distributed.unshard] /
  [`shard_positions`][qkv.distributed.shard_positions] — split a sequence over the ranks
  (`"zigzag"`: balanced under causal masks; `"contiguous"`) and gather it back.
* [`ring_attention`][qkv.distributed.ring_attention] — queries stay, key/value shards travel round
  the ring (P − 1 steps), partial results merged with the log-sum-exp; any mask over global
  positions; backward.
* [`ulysses_attention`][qkv.distributed.ulysses_attention] — DeepSpeed-Ulysses: all-to-all from
  sequence shards to head shards, local attention over the whole sequence, all-to-all back.
* [`SequenceParallel`][qkv.distributed.SequenceParallel] — what
  [`MultiHeadAttention`][qkv.modules.MultiHeadAttention] takes to run its attention
  sequence-parallel.

Works on gloo (CPU) and NCCL (GPU); launch with `torchrun` (see `examples/ring_attention.py`).
"""

from qkv.distributed.ring import ring_attention
from qkv.distributed.shard import LAYOUTS, layout_ranges, shard, shard_length, shard_positions, unshard
from qkv.distributed.ulysses import ulysses_attention
from qkv.distributed.parallel import SequenceParallel

__all__ = ["LAYOUTS", "SequenceParallel", "layout_ranges", "ring_attention", "shard",
           "shard_length", "shard_positions", "ulysses_attention", "unshard"]
