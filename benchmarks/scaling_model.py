"""A small performance model of sequence-parallel attention: ring vs all-to-all (Ulysses), P = 2 … 1024.

One causal attention layer's forward, per rank (the backward costs ~2.5× the compute and twice the
traffic plus the fp32 dK/dV accumulators; the same comparison holds). Symbols:

    N tokens, P ranks, H query heads, H_kv key/value heads, d head dim, e bytes per number
    F  attention FLOP rate of one rank (FLOP/s)        B  link bandwidth per direction (bytes/s)
    α  latency per message (s)

    work per rank      C = 4·d·H·(N² + N)/2 / P / F           (zigzag: equal on every rank)
    ring, per step     c = C / P    m = α + 2·(N/P)·d·H_kv·e / B   (one K/V shard)
    ring time          T = c + (P − 1)·max(c, m)               (double-buffered: a step waits only
                                                                when its transfer outlasts compute)
    ring overlap       holds when c ≥ m, i.e. (latency aside) when a shard is long enough:
                       N/P ≥ F·e·H_kv / (H·B)      — the per-row ratio c/m is printed
    Ulysses time       T = C + 2·(α·(P − 1) + (N/P)·d·(H + H_kv)·e·(P − 1)/P / B)
                       (all-to-all of q, k, v before and of the output after; not overlapped;
                       needs H divisible by P)
    memory per rank    ring:    (N/P)·d·e·(2H + 6·H_kv) + (N/P)·H·(d + 1)·4   (q, out, k/v and two
                                 receive buffers, fp32 accumulators)
                       Ulysses: (N/P)·d·e·(2H + 2H_kv)·2                     (shards + head shards)

A cluster is a list of (ranks per node, bandwidth inside a node, bandwidth between nodes): a ring
step crosses the slowest link it uses, so with more than one node the ring runs at the
between-node bandwidth; an all-to-all sends (P − p)/P of its bytes off the node.

``--measured benchmarks/distributed.json`` also prints the model beside this machine's
measurements (P = 2, 3, 4 processes on its cores), with F and B taken from the same run.

    python benchmarks/scaling_model.py
    python benchmarks/scaling_model.py --measured benchmarks/distributed.json
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Cluster:
    name: str
    flops: float  # F per rank, FLOP/s (attention forward, achieved)
    per_node: int  # ranks per node
    intra: float  # bytes/s per direction inside a node
    inter: float  # bytes/s per direction between nodes
    latency: float  # seconds per message
    bytes_per_number: int  # e
    memory: float  # bytes a rank may hold


# Sources for the figures (see docs/scaling.md):
#   H100 SXM NVLink 4: 900 GB/s total per GPU = 450 GB/s each direction (NVIDIA H100 datasheet).
#   InfiniBand NDR: 400 Gb/s = 50 GB/s per GPU, one ConnectX-7 per GPU in DGX H100 (NVIDIA DGX H100
#   user guide). FlashAttention-3 (Shah et al. 2024, arXiv:2407.08608): 740 TFLOP/s FP16 forward on
#   H100 SXM5 (75 % of 989); FlashAttention-2 ≈ 350 TFLOP/s there. We take 400 TFLOP/s.
#   CPU nodes: F from this machine's measurement × 32 cores; Ethernet at 10 and 100 Gb/s.
def clusters(core_flops: float) -> list[Cluster]:
    node = 32 * core_flops
    return [
        Cluster("CPU nodes (32 cores), 10 Gb/s Ethernet", node, 1, 1e12, 1.25e9, 50e-6, 4, 256e9),
        Cluster("CPU nodes (32 cores), 100 Gb/s Ethernet", node, 1, 1e12, 12.5e9, 20e-6, 4, 256e9),
        Cluster("H100 SXM, 8/node, NVLink 450 GB/s + IB NDR 50 GB/s", 400e12, 8, 450e9, 50e9, 5e-6, 2, 80e9),
    ]


def ring(n: int, p: int, h: int, hkv: int, d: int, cl: Cluster) -> dict:
    work = 4 * d * h * (n * n + n) / 2 / p / cl.flops
    bw = cl.intra if p <= cl.per_node else cl.inter
    step_c = work / p
    step_m = cl.latency + 2 * (n / p) * d * hkv * cl.bytes_per_number / bw
    time = step_c + (p - 1) * max(step_c, step_m) if p > 1 else work
    mem = (n / p) * d * cl.bytes_per_number * (2 * h + 6 * hkv) + (n / p) * h * (d + 1) * 4
    return {"time": time, "compute": work, "step_c": step_c, "step_m": step_m, "memory": mem}


def ulysses(n: int, p: int, h: int, hkv: int, d: int, cl: Cluster) -> dict | None:
    if h % p:
        return None
    work = 4 * d * h * (n * n + n) / 2 / p / cl.flops
    sent = (n / p) * d * (h + hkv) * cl.bytes_per_number * (p - 1) / p  # q, k, v out; output back
    off = max(0, p - cl.per_node) / p  # the share that leaves the node
    xfer = sent * ((1 - off) / cl.intra + off / cl.inter)
    comm = 2 * (cl.latency * (p - 1) + xfer)
    mem = (n / p) * d * cl.bytes_per_number * (2 * h + 2 * hkv) * 2
    return {"time": work + comm, "compute": work, "comm": comm, "memory": mem}


def fmt_time(s: float) -> str:
    for unit, scale in (("h", 3600), ("min", 60), ("s", 1), ("ms", 1e-3), ("µs", 1e-6)):
        if s >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s * 1e9:.3g} ns"


def fmt_bytes(b: float) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if b >= scale:
            return f"{b / scale:.3g} {unit}"
    return f"{b:.0f} B"


def table(cl: Cluster, sizes, procs, h, hkv, d) -> str:
    lines = [f"### {cl.name}", "",
             f"F = {cl.flops / 1e12:.3g} TFLOP/s per rank, e = {cl.bytes_per_number} bytes; "
             f"H = {h}, H_kv = {hkv}, d = {d}; one causal layer forward, time per rank", "",
             "| N | P | ring time | ring step compute / transfer | ring memory/rank | Ulysses time | Ulysses memory/rank |",
             "|---|---|---|---|---|---|---|"]
    for n in sizes:
        for p in procs:
            r = ring(n, p, h, hkv, d, cl)
            u = ulysses(n, p, h, hkv, d, cl)
            fits = "" if r["memory"] <= cl.memory else " (does not fit)"
            ratio = r["step_c"] / r["step_m"]
            over = "overlapped" if ratio >= 1 else "**comm-bound**"
            lines.append(f"| {n:,} | {p} | {fmt_time(r['time'])} | {ratio:.3g}× ({over}) | "
                         f"{fmt_bytes(r['memory'])}{fits} | "
                         + (f"{fmt_time(u['time'])} | {fmt_bytes(u['memory'])} |" if u else
                            f"n/a (H = {h} not divisible by {p}) | — |"))
    return "\n".join(lines)


def causal_pairs(q: tuple[int, int], k: tuple[int, int]) -> int:
    """How many (i, j) with j ≤ i in [qa, qb) × [ka, kb): the work of one chunk pair."""
    (qa, qb), (ka, kb) = q, k
    total = 0
    # for query i: keys ka … min(i, kb − 1)
    lo, hi = max(qa, ka), qb  # queries that see at least one key of the chunk
    if lo >= hi:
        return 0
    full_from = max(lo, kb - 1)  # queries at or after kb − 1 see the whole chunk
    # queries lo … full_from − 1 see i − ka + 1 keys
    a, b = lo, min(full_from, hi)
    if b > a:
        total += (a - ka + 1 + b - ka) * (b - a) // 2
    if hi > full_from:
        total += (hi - full_from) * (kb - ka)
    return total


def ring_work(n: int, p: int, layout: str) -> list[list[int]]:
    """work[r][step]: causal (q, k) pairs rank r computes at each ring step (exact, any layout)."""
    from qkv.distributed.shard import layout_ranges

    ranges = [layout_ranges(n, p, r, layout) for r in range(p)]
    return [[sum(causal_pairs(qr, kr) for qr in ranges[r] for kr in ranges[(r - step) % p])
             for step in range(p)] for r in range(p)]


def predict_here(n: int, p: int, h: int, d: int, layout: str, core_f: float, bw: float, cores: int,
                 share: float | None = None) -> dict:
    """The ring on this machine: P ranks sharing ``cores`` cores (or, given ``share``, each rank
    getting that fraction of a core), each step as slow as its slowest rank (neighbours wait for
    each other's messages) and never faster than the transfer."""
    work = ring_work(n, p, layout)
    f = core_f * (min(1.0, cores / p) if share is None else share)
    m = 2 * (n / p) * d * h * 4 / bw
    steps = [max(max(work[r][s] for r in range(p)) * 4 * d * h / f, m if s < p - 1 else 0.0)
             for s in range(p)]
    per_rank = [sum(w) * 4 * d * h / core_f for w in work]  # CPU seconds
    return {"time": sum(steps), "cpu": per_rank}


def measured_core_flops(data: dict) -> float:
    """F of one core: the P = 2 zigzag run's causal pairs × 4·d·H over its kernels' CPU seconds."""
    base = next(r for r in data["records"] if r["world"] == 2)
    n, h, d = base["n"], base["heads"], base["dim"]
    work = sum(sum(w) for w in ring_work(n, 2, "zigzag"))
    return 4 * d * h * work / sum(r["compute"] for r in base["zigzag"]["ranks"])


def check(measured: str) -> str:
    """Model vs measurement on this machine: F of one core and B from the P = 2 zigzag run."""
    with open(measured) as f:
        data = json.load(f)
    cores = data["cores"]
    base = next(r for r in data["records"] if r["world"] == 2)
    z = base["zigzag"]
    h, d = base["heads"], base["dim"]
    core_f = measured_core_flops(data)
    bw = z["bandwidth"]
    lines = [f"F = {core_f / 1e9:.1f} GFLOP/s per core (CPU time of the chunk kernels, P = 2 zigzag run), "
             f"B = {bw / 1e9:.2f} GB/s (gloo loopback, same run); {cores} cores.", "",
             "| N | P | layout | predicted CPU s per rank (max / min) | measured | predicted wall, idle cores "
             "| core share the ranks got | predicted wall at that share | measured wall |",
             "|---|---|---|---|---|---|---|---|---|"]
    for rec in data["records"]:
        n, p = rec["n"], rec["world"]
        for layout in ("zigzag", "contiguous"):
            pred = predict_here(n, p, h, d, layout, core_f, bw, cores)
            ranks = rec[layout]["ranks"]
            got = [r["compute"] for r in ranks]
            # other jobs on the machine: the CPU a rank got during the call over its wall time
            share = sum(r["cpu"] / r["forward"] for r in ranks) / p
            loaded = predict_here(n, p, h, d, layout, core_f, bw, cores, share=share)
            lines.append(f"| {n:,} | {p} | {layout} | {max(pred['cpu']):.3f} / {min(pred['cpu']):.3f} | "
                         f"{max(got):.3f} / {min(got):.3f} | {fmt_time(pred['time'])} | {share:.2f} | "
                         f"{fmt_time(loaded['time'])} | {fmt_time(rec[layout]['wall'])} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--core-gflops", type=float, default=50.0,
                    help="attention GFLOP/s of one CPU core, when no --measured file gives it")
    ap.add_argument("--measured", help="benchmarks/distributed.py --json output, to check the model")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--dim", type=int, default=128)
    args = ap.parse_args(argv)
    sizes = [131072, 1048576, 10485760]
    procs = [2, 8, 32, 128, 1024]
    core_f = args.core_gflops * 1e9
    if args.measured:
        with open(args.measured) as f:
            core_f = measured_core_flops(json.load(f))
        print(f"CPU core rate from {args.measured}: {core_f / 1e9:.1f} GFLOP/s\n")
    for cl in clusters(core_f):
        print(table(cl, sizes, procs, args.heads, args.kv_heads, args.dim), end="\n\n")
    if args.measured:
        print("### Model against measurement (this machine)\n")
        print(check(args.measured))
    return 0


if __name__ == "__main__":
    sys.exit(main())
