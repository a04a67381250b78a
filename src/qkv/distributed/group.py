"""The process group a sequence-parallel call runs on, and the checks every rank makes first.

Every function in [`qkv.distributed`][qkv.distributed] starts here: `group_info` refuses an
uninitialised `torch.distributed` with a `ValueError` (on every rank, since every rank
checks locally), and `agree` gathers one small integer row per rank (shapes, dtype, mask
arguments) so that a mismatch between ranks is *detected* — each rank sees the same table and
raises the same error — instead of leaving a rank waiting forever for a message of the wrong size.
A rank that never arrives is caught by the group's timeout (`init_process_group(timeout=...)`),
re-raised as a `RuntimeError` that says so.
"""

from __future__ import annotations

import hashlib

import torch
import torch.distributed as dist

# dtypes a row can name; the index is what travels
DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def group_info(group, *, what: str) -> tuple[int, int]:
    """(rank, world size) of this process in `group` (None = the default group).

    Raises:
        ValueError: torch.distributed is not available or not initialised, or this process is
            not a member of `group`.
    """
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError(f"{what}: torch.distributed is not initialised; call "
                         f"torch.distributed.init_process_group(...) first (torchrun sets "
                         f"RANK/WORLD_SIZE/MASTER_ADDR for it)")
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError(f"{what}: this process (global rank {dist.get_rank()}) is not a member "
                         f"of the given process group")
    return rank, dist.get_world_size(group)


def encode_dtype(dtype: torch.dtype) -> int:
    return DTYPES.index(dtype) if dtype in DTYPES else -1


def gather_rows(row: list[int], group, *, what: str) -> list[list[int]]:
    """All ranks' `row` (equal lengths), in rank order; a timeout becomes a clear RuntimeError."""
    mine = torch.tensor(row, dtype=torch.int64)  # (n,)
    _, world = group_info(group, what=what)
    rows = [torch.empty_like(mine) for _ in range(world)]
    try:
        dist.all_gather(rows, mine, group=group)
    except RuntimeError as e:  # gloo: "Timed out waiting ..." / a peer that went away
        raise RuntimeError(f"{what}: rank {dist.get_rank(group)} got no answer from every rank of "
                           f"the group within its timeout (did every rank call {what}?): {e}") from e
    return [r.tolist() for r in rows]


WIDTH = 6
"""Integers in one `describe` row; the length axis (dim −2) sits at `LENGTH_AT`."""
LENGTH_AT = 4


def describe(x: torch.Tensor) -> list[int]:
    """A fixed-size integer summary of a tensor of any rank: dtype, rank, a digest of the leading
    dims (all but the last three) and the last three dims (−1 where the tensor has fewer).

    Fixed size whatever the rank, so every rank's row has the same length (gloo needs that for
    an all-gather; a row that grew with the rank would abort the group). Two tensors of one rank
    get equal rows exactly when their shapes are equal (up to a 63-bit digest collision);
    `gather_shapes` gives the shapes themselves, for messages.
    """
    shape = tuple(x.shape)
    lead, last = shape[:-3], shape[-3:]
    digest = int.from_bytes(hashlib.blake2b(repr(lead).encode(), digest_size=8).digest(), "little") >> 1
    return [encode_dtype(x.dtype), len(shape), digest, *([-1] * (3 - len(last))), *last]


def gather_shapes(tensors, width: int, group, *, what: str) -> list[list[tuple[int, ...]]]:
    """Every rank's shapes of `tensors`, in rank order, for messages (a second all-gather, made
    once the ranks already know they disagree). `width`: the largest rank any rank holds (from
    the `describe` rows), so the padded rows have one length on every rank."""
    row = [v for t in tensors for v in (*t.shape, *([-1] * (width - t.ndim)))]
    rows = gather_rows(row, group, what=what)
    return [[tuple(v for v in r[i * width:(i + 1) * width] if v >= 0) for i in range(len(tensors))]
            for r in rows]


def dtype_name(code: int) -> str:
    """The dtype a row names, in words."""
    return str(DTYPES[code]) if 0 <= code < len(DTYPES) else "another dtype"
