"""Sharding layouts: every token exactly once, zigzag balanced under causal masks, and
shard → unshard round trips on gloo processes (odd lengths included)."""

from __future__ import annotations

import pytest
import torch

import spawned
from qkv.distributed.shard import chunk_bounds, layout_ranges, shard_length


@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
@pytest.mark.parametrize("n", [1, 7, 8, 37, 1000])
@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
def test_layouts_cover_every_token_once(layout, n, world):
    held = [i for r in range(world) for s, e in layout_ranges(n, world, r, layout) for i in range(s, e)]
    assert sorted(held) == list(range(n))
    lengths = [shard_length(n, world, r, layout) for r in range(world)]
    assert max(lengths) - min(lengths) <= 2


def test_chunk_bounds_are_tensor_split():
    for n, p in ((10, 4), (37, 6), (3, 5)):
        sizes = [e - s for s, e in chunk_bounds(n, p)]
        assert sizes == [len(c) for c in torch.arange(n).tensor_split(p)]


@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_zigzag_balances_causal_work(world):
    """Causal work of a rank = Σ over its queries of (position + 1) keys; zigzag within 1 %."""
    n = 16384
    work = {lay: [sum((s + e + 1) * (e - s) // 2 for s, e in layout_ranges(n, world, r, lay))
                  for r in range(world)] for lay in ("zigzag", "contiguous")}
    zig, cont = work["zigzag"], work["contiguous"]
    assert max(zig) / (sum(zig) / world) - 1 < 0.01
    assert max(cont) / min(cont) > 2 * world - 2  # the last rank does ~(2P − 1)× the first's


def _round_trip(rank, world):
    from qkv.distributed import shard, shard_positions, unshard

    out = {}
    for layout in ("zigzag", "contiguous"):
        x = torch.arange(2 * 37 * 3, dtype=torch.float64).view(2, 37, 3)  # (b, N, E)
        local = shard(x, layout=layout, dim=1)
        pos = shard_positions(37, layout=layout)
        x.requires_grad_()
        full = unshard(shard(x, layout=layout, dim=1), layout=layout, dim=1)
        full.sum().backward()
        out[layout] = (torch.equal(local, x.detach()[:, pos]), torch.equal(full.detach(), x.detach()),
                       local.shape[1])
    return out


def test_shard_unshard_round_trip():
    results = spawned.run(3, _round_trip)
    for layout in ("zigzag", "contiguous"):
        assert all(r[layout][0] and r[layout][1] for r in results)
        assert [r[layout][2] for r in results] == [shard_length(37, 3, i, layout) for i in range(3)]
