"""The arguments of a sequence-parallel attention call, checked locally and then across ranks.

Local checks raise at once. The cross-rank check gathers one integer row per rank (dtype,
shapes, mask arguments, layout) and compares them, so a rank whose shard has another dtype, head
count or a length that does not fit the layout makes *every* rank raise the same
`ValueError` — rather than some ranks waiting for a message that never comes.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import torch

from qkv.attention.functional import check_flag, resolve_scale
from qkv.distributed.group import (LENGTH_AT, WIDTH, describe, dtype_name, gather_rows,
                                   gather_shapes, group_info)
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


def _bits(x: float) -> int:
    """A float as the int64 of its bits: compared exactly, and it travels in an integer row."""
    return struct.unpack("<q", struct.pack("<d", x))[0]


def _unbits(b: int) -> float:
    return struct.unpack("<d", struct.pack("<q", b))[0]


def agree(query, key, value, *, group, layout: str, is_causal: bool, window, scale, enable_gqa: bool,
          has_block_mask: bool, what: str) -> Agreed:
    """Check the call on this rank, then against every other rank; return what they agree on.

    Raises:
        ValueError: on every rank, naming the ranks and values, when the ranks' shards or mask
            arguments disagree, or their lengths are not a `layout` split of one sequence.
        RuntimeError: a rank did not answer within the group's timeout.
    """
    rank, world = group_info(group, what=what)
    check_layout(layout)
    try:  # the checks every backend makes: enable_gqa="no" is truthy and would mean True
        is_causal = check_flag("is_causal", is_causal)
        enable_gqa = check_flag("enable_gqa", enable_gqa)
    except ValueError as e:
        raise ValueError(f"{what}: {e}") from None
    _check_local(query, key, value, enable_gqa, window, what)
    try:
        scale = resolve_scale(scale, query.shape[-1])
    except ValueError as e:
        raise ValueError(f"{what}: {e}") from None
    left, right = window if window is not None else (None, None)
    flags = [int(is_causal), -1 if left is None else left, -1 if right is None else right,
             LAYOUTS.index(layout), int(enable_gqa), int(bool(has_block_mask)), _bits(scale)]
    tensors = (query, key, value)
    row = [v for x in tensors for v in describe(x)] + flags
    rows = gather_rows(row, group, what=what)
    length_at = [i * WIDTH + LENGTH_AT for i in range(len(tensors))]  # each tensor's dim −2

    def without_length(r):
        return [v for i, v in enumerate(r) if i not in length_at]

    if any(without_length(r) != without_length(rows[0]) for r in rows):
        # every rank takes this branch (they all hold the same rows), so the second gather is safe
        width = max(r[i * WIDTH + 1] for r in rows for i in range(len(tensors)))
        shapes = gather_shapes(tensors, width, group, what=what)
        f = 3 * WIDTH  # where the flags start
        shards = "; ".join(
            f"rank {i}: " + ", ".join(f"{name} {shape} {dtype_name(r[j * WIDTH])}" for j, (name, shape)
                                      in enumerate(zip(("query", "key", "value"), shapes[i])))
            + f", causal={bool(r[f])}, window={r[f + 1:f + 3]}, "
              f"layout={LAYOUTS[r[f + 3]] if 0 <= r[f + 3] < len(LAYOUTS) else r[f + 3]}, "
              f"enable_gqa={bool(r[f + 4])}, block_mask={bool(r[f + 5])}, scale={_unbits(r[f + 6])!r}"
            for i, r in enumerate(rows))
        raise ValueError(f"{what}: the ranks disagree on shapes, dtypes or mask arguments "
                         f"(only the length may differ): {shards}")
    lengths = [r[length_at[0]] for r in rows]
    total = sum(lengths)
    expected = [shard_length(total, world, i, layout) for i in range(world)]
    if lengths != expected:
        raise ValueError(f"{what}: the ranks hold {lengths} tokens (total {total}), which is not the "
                         f"{layout!r} split of {total} tokens over {world} ranks {expected}; "
                         f"shard the sequence with qkv.distributed.shard(..., layout={layout!r})")
    ranges = tuple(tuple(layout_ranges(total, world, i, layout)) for i in range(world))
    return Agreed(group, rank, world, layout, total, ranges, scale)
