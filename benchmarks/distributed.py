"""Sequence-parallel attention on this machine: P gloo processes × 1 thread against 1 process × P threads.

For causal attention (fp32, b = 1, H heads, d = 64) at each N:

* **time**: ``qkv.distributed.ring_attention`` (zigzag and contiguous) on P processes of one torch
  thread each, against single-process ``qkv.scaled_dot_product_attention(is_causal=True)`` (torch's
  flash kernel) with P threads — the same cores either way. Ratio = ring / single (≤ 1 is better).
  Forward, and forward + backward.
* **imbalance**: each rank's compute time (the chunk kernels only, timed inside the ring), as
  max / mean − 1, zigzag beside contiguous.
* **memory**: each process's peak RSS growth during the call (``ru_maxrss`` after − before; the
  shards are generated in place, the full sequence never exists on a rank).
* **communication**: bytes per step (one K/V shard), the gloo loopback bandwidth measured with a
  message of that size, and the overlap condition: compute per step ≥ transfer per step.

Each configuration runs in fresh processes (peak RSS is a high-water mark), after one small
warm-up call (first-call code loading is not measured), ``--rounds`` times
interleaved; the best wall time of each is kept. The machine may be
shared: compare only numbers from one run. ``--json`` writes every number for the scaling model
(``benchmarks/scaling_model.py --measured``).

    python benchmarks/distributed.py --sizes 16384 32768
    python benchmarks/distributed.py --sizes 4096 --procs 2 3 4 --json benchmarks/distributed.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import queue
import resource
import socket
import sys
import time

import torch
import torch.multiprocessing as mp


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _warm_up(attend) -> None:
    """One small forward and backward first, called as the measured ones are: the first call of a
    kernel, and the first ``backward(grad)`` (torch imports sympy for its shape checks), load code
    once per process (~0.4 s of CPU here), which is not what is being measured."""
    x = torch.randn(1, 1, 64, 16, requires_grad=True)
    o = attend(x)
    o.backward(torch.ones_like(o))


def _single(_rank, n, heads, dim, threads, backward, out):
    import qkv

    torch.set_num_threads(threads)
    _warm_up(lambda x: qkv.scaled_dot_product_attention(x, x, x, is_causal=True))
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, heads, n, dim, generator=gen) for _ in range(3))  # (b, h, N, d)
    for x in (q, k, v):
        x.requires_grad_(backward)
    before = _rss_mb()
    start, cpu = time.perf_counter(), time.process_time()
    o = qkv.scaled_dot_product_attention(q, k, v, is_causal=True)
    fwd, cpu = time.perf_counter() - start, time.process_time() - cpu  # CPU: all threads together
    bwd = bwd_cpu = None
    if backward:
        start, bwd_cpu = time.perf_counter(), time.process_time()
        o.backward(torch.ones_like(o))
        bwd, bwd_cpu = time.perf_counter() - start, time.process_time() - bwd_cpu
    out.put({"forward": fwd, "cpu": cpu, "backward": bwd, "backward_cpu": bwd_cpu, "peak_mb": _rss_mb() - before,
             "inputs_mb": 3 * q.numel() * 4 / 2**20})


def _ring(rank, world, port, n, heads, dim, layout, backward, out):
    import torch.distributed as dist

    import qkv.distributed.ring as ring
    from qkv.distributed import ring_attention, shard_length

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=600))
    compute = [0.0]
    kernel = ring.chunk_forward

    def timed(*a, **kw):  # the chunk kernels alone, in CPU seconds of this (only) thread: what
        t0 = time.thread_time()  # the rank computes, unaffected by waits or by other jobs' load
        r = kernel(*a, **kw)
        compute[0] += time.thread_time() - t0
        return r

    ring.chunk_forward = timed
    _warm_up(lambda x: ring_attention(x, x, x, is_causal=True, layout=layout))
    t = shard_length(n, world, rank, layout)
    gen = torch.Generator().manual_seed(rank)
    q, k, v = (torch.randn(1, heads, t, dim, generator=gen) for _ in range(3))  # this rank's shard
    for x in (q, k, v):
        x.requires_grad_(backward)
    # loopback bandwidth with one K/V shard per message, as a ring step sends it
    msg = torch.randn(2 * heads * t * dim)
    recv = torch.empty(2 * heads * shard_length(n, world, (rank - 1) % world, layout) * dim)
    best = float("inf")
    for _ in range(3):
        dist.barrier()
        t0 = time.perf_counter()
        ops = [dist.P2POp(dist.isend, msg, (rank + 1) % world), dist.P2POp(dist.irecv, recv, (rank - 1) % world)]
        for r in dist.batch_isend_irecv(ops):
            r.wait()
        best = min(best, time.perf_counter() - t0)
    dist.barrier()
    before = _rss_mb()
    t0, cpu = time.perf_counter(), time.process_time()
    o = ring_attention(q, k, v, is_causal=True, layout=layout)
    fwd, cpu = time.perf_counter() - t0, time.process_time() - cpu  # CPU: kernels, merges, gloo's threads
    fwd_compute = compute[0]
    bwd = bwd_cpu = None
    if backward:
        dist.barrier()
        t0, bwd_cpu = time.perf_counter(), time.process_time()
        o.backward(torch.ones_like(o))
        bwd, bwd_cpu = time.perf_counter() - t0, time.process_time() - bwd_cpu
    out.put({"rank": rank, "forward": fwd, "cpu": cpu, "compute": fwd_compute, "backward": bwd,
             "backward_cpu": bwd_cpu,
             "peak_mb": _rss_mb() - before, "inputs_mb": 3 * q.numel() * 4 / 2**20,
             "bytes_per_step": msg.numel() * 4,
             "exchange_s": best})
    dist.destroy_process_group()


def _launch(fn, world, args):
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=fn, args=(r, *args, q)) for r in range(world)]
    for p in procs:
        p.start()
    results = []
    while len(results) < world:
        try:
            results.append(q.get(timeout=5))
        except queue.Empty:
            if any(p.exitcode not in (None, 0) for p in procs):
                for p in procs:
                    p.kill()
                raise SystemExit(f"a rank failed (exit codes {[p.exitcode for p in procs]})")
    for p in procs:
        p.join()
    return sorted(results, key=lambda r: r.get("rank", 0))


def attention_flops(n: int, heads: int, dim: int, causal: bool = True) -> float:
    """Forward FLOPs: Q·Kᵀ and P·V, 2·N²·d each per head; causal keeps (N² + N)/2 pairs."""
    pairs = (n * n + n) / 2 if causal else n * n
    return 4 * pairs * dim * heads


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[16384, 32768])
    ap.add_argument("--procs", type=int, nargs="+", default=[2])
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--backward", action="store_true", help="also time the backward")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved repeats; the best wall time is kept")
    ap.add_argument("--json", help="write every number to this file")
    args = ap.parse_args(argv)
    cores = os.cpu_count()
    print(f"torch {torch.__version__}, {cores} cores, load average {os.getloadavg()[0]:.1f}; causal, fp32, "
          f"b=1, H={args.heads}, d={args.dim}")
    records = []
    for world in args.procs:
        for n in args.sizes:
            flops = attention_flops(n, args.heads, args.dim)
            runs = {"single": [], "zigzag": [], "contiguous": []}
            for _ in range(args.rounds):  # interleaved, so a burst of load hits every variant alike
                runs["single"].append(_launch(_single, 1, (n, args.heads, args.dim, world, args.backward))[0])
                for layout in ("zigzag", "contiguous"):
                    runs[layout].append(_launch(_ring, world, (world, _port(), n, args.heads, args.dim,
                                                               layout, args.backward)))
            single = min(runs["single"], key=lambda r: r["forward"])
            single_total = single["peak_mb"] + single["inputs_mb"]
            print(f"\nN = {n}, P = {world}: 1 process × {world} threads: forward {single['forward']:.2f} s "
                  f"(CPU {single['cpu']:.2f} s) "
                  f"({flops / single['forward'] / 1e9:.1f} GFLOP/s), memory: inputs {single['inputs_mb']:.0f} MB "
                  f"+ peak growth {single['peak_mb']:.0f} MB = {single_total:.0f} MB"
                  + (f", backward {single['backward']:.2f} s (CPU {single['backward_cpu']:.2f} s)"
                     if args.backward else ""))
            rec = {"n": n, "world": world, "heads": args.heads, "dim": args.dim, "single": single,
                   "load": os.getloadavg()[0]}
            for layout in ("zigzag", "contiguous"):
                ranks = min(runs[layout], key=lambda rs: max(r["forward"] for r in rs))
                wall = max(r["forward"] for r in ranks)
                comp = [r["compute"] for r in ranks]
                imbalance = max(comp) / (sum(comp) / world) - 1
                step_compute = sum(comp) / world / world
                step_bytes = ranks[0]["bytes_per_step"]
                xfer = max(r["exchange_s"] for r in ranks)
                bw = step_bytes / xfer
                total = max(r["peak_mb"] + r["inputs_mb"] for r in ranks)
                print(f"  ring {layout:10s} {world} × 1 thread: forward {wall:.2f} s = "
                      f"{wall / single['forward']:.2f}× single (CPU: Σ ranks {sum(r['cpu'] for r in ranks):.2f} s = "
                      f"{sum(r['cpu'] for r in ranks) / single['cpu']:.2f}× single's); compute (CPU s) per rank "
                      f"{', '.join(f'{c:.2f}' for c in comp)} (imbalance {100 * imbalance:.1f} %); memory/rank "
                      f"{ranks[0]['inputs_mb']:.0f} + {max(r['peak_mb'] for r in ranks):.0f} = {total:.0f} MB "
                      f"({total / single_total:.2f}× single)"
                      + (f"; backward {max(r['backward'] for r in ranks):.2f} s = "
                         f"{max(r['backward'] for r in ranks) / single['backward']:.2f}× single (CPU: Σ ranks "
                         f"{sum(r['backward_cpu'] for r in ranks):.2f} s = "
                         f"{sum(r['backward_cpu'] for r in ranks) / single['backward_cpu']:.2f}× single's)"
                         if args.backward else ""))
                print(f"    step: {step_bytes / 2**20:.1f} MiB K/V, transfer {1e3 * xfer:.1f} ms "
                      f"({bw / 1e9:.2f} GB/s loopback), compute {1e3 * step_compute:.0f} ms → overlap "
                      f"{'holds' if step_compute >= xfer else 'fails'} ({step_compute / xfer:.0f}× margin)")
                rec[layout] = {"ranks": ranks, "wall": wall, "imbalance": imbalance,
                               "bandwidth": bw, "step_compute": step_compute,
                               "all_walls": [max(r["forward"] for r in rs) for rs in runs[layout]]}
            rec["single_walls"] = [r["forward"] for r in runs["single"]]
            records.append(rec)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cores": cores, "records": records}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
