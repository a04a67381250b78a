"""Split a sequence across the ranks of a process group, and put it back together.

Two layouts of N tokens over P ranks:

```text
"contiguous"  rank r holds one run of N/P tokens    P = 2:  [ 0 0 0 0 | 1 1 1 1 ]
"zigzag"      N is cut into 2P chunks; rank r holds  P = 2:  [ 0 0 | 1 1 | 1 1 | 0 0 ]
              chunks r and 2P−1−r
```

Under a causal mask a query at position i has i + 1 keys, so contiguous shards give the last
rank ~(2P−1)× the work of the first; zigzag pairs an early chunk with a late one and every rank
gets the same amount. Lengths need not divide: the chunks are `torch.tensor_split`'s (the
first N mod 2P chunks are one token longer), so shards differ by at most two tokens and every
rank can compute where every other rank's tokens sit from N alone
([`layout_ranges`][qkv.distributed.shard.layout_ranges]).

Positions must stay global (RoPE, learned position tables, masks):
[`shard_positions`][qkv.distributed.shard.shard_positions] gives the global position of every local
token, sharded exactly like the tokens.

Example (inside a process group of 2):

```text
x = torch.arange(8)[None, :, None]              # (1, 8, 1), tokens 0..7
local = qkv.distributed.shard(x, dim=1)         # rank 0: 0 1 6 7   rank 1: 2 3 4 5
qkv.distributed.unshard(local, dim=1)           # every rank: 0..7 again
```
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from qkv.distributed.group import gather_rows, group_info

LAYOUTS = ("zigzag", "contiguous")


def check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")


def chunk_bounds(length: int, pieces: int) -> list[tuple[int, int]]:
    """[start, end) of `pieces` near-equal chunks of `length` (`torch.tensor_split`'s cut)."""
    base, extra = divmod(length, pieces)
    bounds, start = [], 0
    for i in range(pieces):
        end = start + base + (1 if i < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


def layout_ranges(length: int, world: int, rank: int, layout: str = "zigzag") -> list[tuple[int, int]]:
    """The global [start, end) runs that `rank` holds, in the order they sit in its shard.

    Examples:
        >>> layout_ranges(10, 2, 0), layout_ranges(10, 2, 1)
        ([(0, 3), (8, 10)], [(3, 6), (6, 8)])
        >>> layout_ranges(10, 2, 1, "contiguous")
        [(5, 10)]
    """
    check_layout(layout)
    if layout == "contiguous":
        return [chunk_bounds(length, world)[rank]]
    chunks = chunk_bounds(length, 2 * world)
    return [chunks[rank], chunks[2 * world - 1 - rank]]


def shard_length(length: int, world: int, rank: int, layout: str = "zigzag") -> int:
    """How many of `length` tokens `rank` holds."""
    return sum(e - s for s, e in layout_ranges(length, world, rank, layout))


def _positions(length: int, world: int, rank: int, layout: str, device=None) -> torch.Tensor:
    return torch.cat([torch.arange(s, e, device=device)
                      for s, e in layout_ranges(length, world, rank, layout)])  # (t_r,)


def shard_positions(length: int, group=None, layout: str = "zigzag", *,
                    device: torch.device | str | None = None) -> torch.Tensor:
    """(t_r,) int64: the global position of each token this rank holds after `shard`.

    Pass them to position embeddings (RoPE, learned tables) so they see global positions.
    """
    rank, world = group_info(group, what="shard_positions")
    return _positions(length, world, rank, layout, device)


def shard(x: torch.Tensor, group=None, layout: str = "zigzag", dim: int = -2) -> torch.Tensor:
    """This rank's part of the full sequence `x` along `dim` (every rank passes all of `x`).

    No communication: every rank holds the whole `x` and keeps its own runs (a copy).

    Args:
        x: (..., N, ...) the full sequence; `dim` is its length axis (default −2, the `t` of
            (b, h, t, d); use `dim=1` for (b, t, E) hidden states).
        group: the process group (None = the default group).
        layout: `"zigzag"` (balanced under causal masks) or `"contiguous"`.

    Returns:
        (..., t_r, ...) with t_r = [`shard_length`][qkv.distributed.shard.shard_length] (N, P, r).
    """
    rank, world = group_info(group, what="shard")
    check_layout(layout)
    if not isinstance(x, torch.Tensor) or x.ndim == 0:
        raise ValueError(f"shard: x must be a tensor with a length axis, got {getattr(x, 'shape', x)}")
    n = x.shape[dim]
    return torch.cat([x.narrow(dim, s, e - s) for s, e in layout_ranges(n, world, rank, layout)], dim=dim)


def unshard(x: torch.Tensor, group=None, layout: str = "zigzag", dim: int = -2) -> torch.Tensor:
    """The full sequence from every rank's shard `x` (an all-gather), in global order.

    Every rank must call it with its shard of one sequence (shapes equal except along `dim`,
    where they must be what `shard` gives); every rank gets the whole sequence back.
    Differentiable: the gradient of the full sequence is sharded back.
    """
    rank, world = group_info(group, what="unshard")
    check_layout(layout)
    dim = dim % x.ndim
    rows = gather_rows([x.ndim, *x.shape[:dim], *x.shape[dim + 1:], x.shape[dim]], group, what="unshard")
    if any(r[:-1] != rows[0][:-1] for r in rows):
        raise ValueError(f"unshard: shards must agree on every axis but dim {dim}; ranks hold "
                         f"{[tuple(r[1:-1]) for r in rows]}")
    lengths = [r[-1] for r in rows]
    n = sum(lengths)
    expected = [shard_length(n, world, i, layout) for i in range(world)]
    if lengths != expected:
        raise ValueError(f"unshard: shard lengths {lengths} are not a {layout!r} split of "
                         f"{n} tokens over {world} ranks ({expected})")
    return _Unshard.apply(x, group, layout, dim, lengths)


class _Unshard(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, layout, dim, lengths):
        rank, world = group_info(group, what="unshard")
        ctx.group, ctx.layout, ctx.dim, ctx.rank, ctx.world = group, layout, dim, rank, world
        top = max(lengths)
        moved = x.movedim(dim, 0).contiguous()  # (t_r, ...)
        padded = moved.new_zeros((top, *moved.shape[1:]))
        padded[: moved.shape[0]] = moved
        parts = [torch.empty_like(padded) for _ in range(world)]
        dist.all_gather(parts, padded, group=group)  # gloo needs equal sizes: pad to the longest
        n = sum(lengths)
        full = moved.new_empty((n, *moved.shape[1:]))  # (N, ...)
        for i, part in enumerate(parts):
            full[_positions(n, world, i, layout)] = part[: lengths[i]]
        return full.movedim(0, dim)

    @staticmethod
    def backward(ctx, grad):
        n = grad.shape[ctx.dim]
        keep = _positions(n, ctx.world, ctx.rank, ctx.layout, grad.device)
        return grad.index_select(ctx.dim, keep), None, None, None, None
