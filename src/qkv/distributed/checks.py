"""The arguments of a sequence-parallel attention call, checked locally and then across ranks.

Local checks raise at once. The cross-rank check gathers one integer row per rank (dtype,
shapes, mask arguments, layout) and compares them, so a rank whose shard has another dtype, head
count or a length that does not fit the layout makes *every* rank raise the same
:class:`ValueError` — rather than some ranks waiting for a message that never comes.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

import torch

from qkv.distributed.group import decode, describe, gather_rows, group_info
from qkv.distributed.shard import LAYOUTS, check_layout, layout_ranges, shard_length


@dataclass(frozen=True)
class Agreed:
    """What every rank now knows: the group, the layout and every rank's runs of global positions."""

    group: object
    rank: int
    world: int
    layout: str
    length: int  # N, the global sequence length
    ranges: tuple[tuple[tuple[int, int], ...], ...]  # ranges[r] = rank r's runs [start, end)
    scale: float


def _check_local(query, key, value, enable_gqa: bool, window, what: str) -> None:
    for name, x in (("query", query), ("key", key), ("value", value)):
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            raise ValueError(f"{what}: {name} must be a floating-point tensor, got "
                             f"{getattr(x, 'dtype', type(x).__name__)}")
        if x.ndim < 3:
            raise ValueError(f"{what}: {name} must be (..., heads, length, dim), got {tuple(x.shape)}")
    qs, ks, vs = tuple(query.shape), tuple(key.shape), tuple(value.shape)
    if not query.dtype == key.dtype == value.dtype:
        raise ValueError(f"{what}: query, key and value must share a dtype, got {query.dtype}, "
                         f"{key.dtype}, {value.dtype}")
    if len(qs) != len(ks) or qs[:-3] != ks[:-3] or ks[:-1] != vs[:-1] or qs[-1] != ks[-1]:
        raise ValueError(f"{what}: shapes do not fit (..., h, t, d) / (..., h_kv, t, d) / "
                         f"(..., h_kv, t, dv): query {qs}, key {ks}, value {vs}")
    if qs[-2] != ks[-2]:
        raise ValueError(f"{what}: sequence parallelism is self-attention over one sequence: this "
                         f"rank's query and key shards must hold the same tokens, got lengths "
                         f"{qs[-2]} and {ks[-2]}")
    h, hkv = qs[-3], ks[-3]
    if (enable_gqa and (hkv == 0 or h % hkv)) or (not enable_gqa and h != hkv):
        raise ValueError(f"{what}: query has {h} heads and key/value {hkv}; they must be equal, or "
                         f"h a multiple of h_kv with enable_gqa=True")
    if window is not None and not (isinstance(window, (tuple, list)) and len(window) == 2 and all(
            w is None or (isinstance(w, int) and not isinstance(w, bool) and w >= 0) for w in window)):
        raise ValueError(f"{what}: window must be (left, right) with ints >= 0 or None, got {window!r}")


def agree(query, key, value, *, group, layout: str, is_causal: bool, window, scale, enable_gqa: bool,
          has_block_mask: bool, what: str) -> Agreed:
    """Check the call on this rank, then against every other rank; return what they agree on.

    Raises:
        ValueError: on every rank, naming the ranks and values, when the ranks' shards or mask
            arguments disagree, or their lengths are not a ``layout`` split of one sequence.
        RuntimeError: a rank did not answer within the group's timeout.
    """
    rank, world = group_info(group, what=what)
    check_layout(layout)
    _check_local(query, key, value, enable_gqa, window, what)
    left, right = window if window is not None else (None, None)
    flags = [int(bool(is_causal)), -1 if left is None else left, -1 if right is None else right,
             LAYOUTS.index(layout), int(bool(enable_gqa)), int(bool(has_block_mask)),
             -1 if scale is None else struct.unpack("<q", struct.pack("<d", float(scale)))[0]]
    row = describe(query) + describe(key) + describe(value) + flags
    rows = gather_rows(row, group, what=what)
    n = query.ndim  # the length sits at index n of each 10-wide description (2 + ndim - 2)

    def without_length(r):
        return [v for i, v in enumerate(r) if i not in (n, 10 + n, 20 + n)]

    if any(without_length(r) != without_length(rows[0]) for r in rows):
        shards = "; ".join(f"rank {i}: query {decode(r[:10])}, key {decode(r[10:20])}, value "
                           f"{decode(r[20:30])}, causal={bool(r[30])}, window={r[31:33]}, "
                           f"layout={LAYOUTS[r[33]] if 0 <= r[33] < len(LAYOUTS) else r[33]}, "
                           f"enable_gqa={bool(r[34])}, block_mask={bool(r[35])}, scale bits={r[36]}"
                           for i, r in enumerate(rows))
        raise ValueError(f"{what}: the ranks disagree on shapes, dtypes or mask arguments "
                         f"(only the length may differ): {shards}")
    lengths = [r[n] for r in rows]
    total = sum(lengths)
    expected = [shard_length(total, world, i, layout) for i in range(world)]
    if lengths != expected:
        raise ValueError(f"{what}: the ranks hold {lengths} tokens (total {total}), which is not the "
                         f"{layout!r} split of {total} tokens over {world} ranks {expected}; "
                         f"shard the sequence with qkv.distributed.shard(..., layout={layout!r})")
    d = query.shape[-1]
    scale = (1.0 / math.sqrt(d) if d else 1.0) if scale is None else float(scale)
    ranges = tuple(tuple(layout_ranges(total, world, i, layout)) for i in range(world))
    return Agreed(group, rank, world, layout, total, ranges, scale)
