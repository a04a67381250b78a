"""The ceiling BLAS sets on a tiled attention forward: sgemm's rate on the kernel's tile shapes.

qkv's C++ kernel (``src/qkv/attention/kernels/intervals.cpp``) runs each query tile of 64 rows as
two products through BLAS's sgemm: S = Q_tile · K_spanᵀ (64 × n × d) and O += P · V_span
(64 × d × n), n the tile's keys (a window of 512: 576 keys, of which 513 per row take part on
average; documents of 2,048: 2,048 keys in two chunks of 1,024). Whatever the softmax costs,
the forward cannot beat these products' rate, and its "% of the matmul rate"
(``benchmarks/long.py``: useful FLOPs over the 2048³ rate) cannot beat

    ceiling = (useful keys / computed keys) × (tile rate / 2048³ rate)

This script measures both rates through torch (the same MKL sgemm the kernel calls), each the
best of ``--rounds`` runs of back-to-back products on the same operands — an upper bound: the
kernel's operands are not always in cache. A tile's products run on one thread, as in the
kernel (its threads take whole tiles, BLAS runs on the calling thread), so with T threads the
tiles' rate is T × the one-thread rate against the 2048³ product on T threads.

    python benchmarks/gemm_tiles.py --threads 1,2
"""

from __future__ import annotations

import argparse
import time

import torch

D = 64  # head size of benchmarks/long.py
TILE = 64  # the kernel's BLOCK_Q


def rate(fn, flops: float, rounds: int, reps: int) -> float:
    """Best GFLOP/s of ``rounds`` runs of ``reps`` calls."""
    fn()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        best = min(best, (time.perf_counter() - t0) / reps)
    return flops / best / 1e9


def tile_rate(keys: int, rounds: int) -> float:
    """One-thread GFLOP/s of a tile's two products over ``keys`` keys (S = Q Kᵀ, then O += P V)."""
    q, k, v = torch.randn(TILE, D), torch.randn(keys, D), torch.randn(keys, D)
    s, o = torch.empty(TILE, keys), torch.zeros(TILE, D)

    def tile():
        torch.mm(q, k.t(), out=s)  # (64, keys)
        o.addmm_(s, v)  # (64, d)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return rate(tile, 4 * TILE * keys * D, rounds, reps=200)
    finally:
        torch.set_num_threads(threads)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", default="1", help="comma-separated torch thread counts")
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args()
    from long import cpu_name  # benchmarks/long.py: the CPU named once

    print(f"{cpu_name()}; torch {torch.__version__}; fp32, tile of {TILE} query rows, d = {D}\n")
    print("| threads | 2048³ GFLOP/s | case | keys a tile | useful / computed | tiles GFLOP/s | tiles / 2048³ | ceiling |")
    print("|---|---|---|---|---|---|---|---|")
    cases = [("window 512", 512 + TILE, 512.5 / (512 + TILE)), ("documents 2,048 (chunks of 1,024)", 1024, 1.0)]
    one = {name: tile_rate(keys, args.rounds) for name, keys, _ in cases}  # one thread, measured once
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
        big = rate(lambda: a @ b, 2 * 2048**3, args.rounds, reps=1)
        for name, keys, useful in cases:
            r = threads * one[name]  # T tiles at once, one thread each
            print(f"| {threads} | {big:.1f} | {name} | {keys} | {useful:.3f} | {r:.1f} | {r / big:.2f} | "
                  f"{100 * useful * r / big:.0f} % |")


if __name__ == "__main__":
    main()
