"""qkv's attention backends against torch's own SDPA, measured in the same run.

For every dtype, length t (= s) and mask kind, each implementation is called with the same
(1, 8, t, 64) tensors; calls are interleaved round by round (torch, auto, fused, reference, then
the order rotated) so that a noisy neighbour slows all of them alike. Reported: the median ms of
the rounds, and the ratio ``torch_ms / backend_ms`` as the median over rounds of the ratio of the
two calls of the same round (paired, so a busy spell that hits both cancels out): above 1 the
backend is faster than torch's SDPA. The last column is auto's ratio of the two fastest calls.
"fused" calls the very kernel torch's column calls, so its spread around 1.00× shows the noise.

Mask kinds:
    none     no mask
    causal   is_causal=True (top-left, t = s)
    padding  a bool key mask (1, 1, 1, s), the last s/8 keys padded (True = takes part, in both)

The reference backend materialises several (b, h, t, s) fp32 tensors (8·t² floats each), so it is
skipped above t = 4096 (t = 8192 would need > 10 GiB).

    python benchmarks/attention.py               # the full table (many minutes on 2 CPU cores)
    python benchmarks/attention.py --quick       # t in (128, 512), shorter rounds
    python benchmarks/attention.py --threads 1   # on a busy machine (see --help)
    python benchmarks/attention.py --device cuda # on a GPU
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from typing import Callable

import torch
import torch.nn.functional as F

import qkv

LENGTHS = (128, 256, 512, 1024, 2048, 4096, 8192)
QUICK_LENGTHS = (128, 512)
MASKS = ("none", "causal", "padding")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
REFERENCE_MAX_T = 4096
BACKENDS = ("auto", "fused", "reference")


def make_case(dtype: torch.dtype, t: int, mask: str, device: str, *, b: int = 1, h: int = 8,
              d: int = 64):
    gen = torch.Generator().manual_seed(t)
    q, k, v = (torch.randn(b, h, t, d, generator=gen).to(device, dtype) for _ in range(3))
    kwargs: dict = {}  # (b, h, t, d) each
    if mask == "causal":
        kwargs["is_causal"] = True
    elif mask == "padding":
        keep = torch.ones(b, 1, 1, t, dtype=torch.bool, device=device)  # (b, 1, 1, s)
        keep[..., t - t // 8 :] = False
        kwargs["attn_mask"] = keep
    return (q, k, v), kwargs


def implementations(t: int) -> dict[str, Callable]:
    impls = {"torch": lambda q, k, v, **kw: F.scaled_dot_product_attention(q, k, v, **kw)}
    for name in BACKENDS:
        if name == "reference" and t > REFERENCE_MAX_T:
            continue
        impls[name] = (lambda backend: lambda q, k, v, **kw: qkv.scaled_dot_product_attention(
            q, k, v, backend=backend, **kw))(name)
    return impls


def time_interleaved(impls: dict[str, Callable], args, kwargs, *, budget_s: float,
                     min_rounds: int, max_rounds: int, sync: Callable[[], None]):
    """Per implementation the list of seconds per call, rounds interleaved (the order rotated
    every round) until ``budget_s`` is spent."""
    names = list(impls)
    for name in names:  # warm-up (allocator, thread pool, kernels' first-call set-up)
        impls[name](*args, **kwargs)
    sync()
    samples: dict[str, list[float]] = {name: [] for name in names}
    gc.disable()
    try:
        rounds, begin = 0, time.perf_counter()
        while rounds < min_rounds or (rounds < max_rounds
                                      and time.perf_counter() - begin < budget_s):
            for name in names[rounds % len(names):] + names[: rounds % len(names)]:
                start = time.perf_counter()
                impls[name](*args, **kwargs)
                sync()
                samples[name].append(time.perf_counter() - start)
            rounds += 1
    finally:
        gc.enable()
    return samples


def overhead_us(dtype: torch.dtype, mask: str, device: str, sync, *, calls: int = 2000,
                batches: int = 7) -> tuple[float, float]:
    """Per-call µs of torch's SDPA and of qkv's "auto" on tiny (1, 8, 16, 64) inputs, where the
    kernel costs little and what is left is each function's fixed cost: the fastest of several
    batches of back-to-back calls."""
    args, kwargs = make_case(dtype, 16, mask, device)
    impls = implementations(16)
    best = {}
    for name in ("torch", "auto"):
        for _ in range(100):
            impls[name](*args, **kwargs)
        times = []
        for _ in range(batches):
            sync()
            start = time.perf_counter()
            for _ in range(calls):
                impls[name](*args, **kwargs)
            sync()
            times.append((time.perf_counter() - start) / calls)
        best[name] = 1e6 * min(times)
    return best["torch"], best["auto"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="t in (128, 512), shorter rounds")
    parser.add_argument("--dtypes", nargs="+", choices=sorted(DTYPES), default=["fp32", "bf16"])
    parser.add_argument("--lengths", nargs="+", type=int, default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads (default: torch's). On a shared machine, 1 "
                             "thread avoids stalls where one thread waits for a descheduled other")
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds of timed rounds per case (default 2, quick 0.5)")
    args = parser.parse_args(argv)
    lengths = args.lengths or (QUICK_LENGTHS if args.quick else LENGTHS)
    budget = args.budget if args.budget is not None else (0.5 if args.quick else 2.0)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    cuda = args.device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    where = torch.cuda.get_device_name() if cuda else f"CPU, {torch.get_num_threads()} threads"

    print(f"torch {torch.__version__}, {where}, shape (1, 8, t, 64), t = s; median ms of "
          f"interleaved rounds; ratio = median of per-round torch_ms / backend_ms "
          f"(> 1: faster than torch)\n")
    print("| dtype | t | mask | rounds | torch ms | auto ms (ratio) | fused ms (ratio) "
          "| reference ms (ratio) | auto ratio, fastest calls |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|")
    below = []
    with torch.inference_mode():
        for dtype_name in args.dtypes:
            for t in lengths:
                for mask in MASKS:
                    case_args, kwargs = make_case(DTYPES[dtype_name], t, mask, args.device)
                    samples = time_interleaved(implementations(t), case_args, kwargs,
                                               budget_s=budget, min_rounds=3 if t >= 4096 else 7,
                                               max_rounds=500, sync=sync)
                    ms = {name: 1e3 * statistics.median(s) for name, s in samples.items()}
                    ratio = {name: statistics.median(a / b for a, b in zip(samples["torch"], s))
                             for name, s in samples.items()}
                    cells = [f"{ms[n]:.3f} ({ratio[n]:.2f}×)" if n in ms else "skipped"
                             for n in BACKENDS]
                    best = min(samples["torch"]) / min(samples["auto"])
                    if ratio["auto"] < 0.95:
                        below.append(f"  {dtype_name} t={t} {mask}: torch {ms['torch']:.3f} ms, "
                                     f"auto {ms['auto']:.3f} ms ({ratio['auto']:.2f}×; fastest "
                                     f"calls {best:.2f}×; fused {ratio['fused']:.2f}×)")
                    print(f"| {dtype_name} | {t} | {mask} | {len(samples['torch'])} "
                          f"| {ms['torch']:.3f} | " + " | ".join(cells) + f" | {best:.2f}× |",
                          flush=True)
    print("\nFixed cost per call on tiny inputs (1, 8, 16, 64), fastest of 7 batches of 2000 calls:\n")
    print("| dtype | mask | torch µs | auto µs | auto − torch µs |")
    print("|---|---|---:|---:|---:|")
    with torch.inference_mode():
        for dtype_name in args.dtypes:
            for mask in MASKS:
                torch_us, auto_us = overhead_us(DTYPES[dtype_name], mask, args.device, sync)
                print(f"| {dtype_name} | {mask} | {torch_us:.1f} | {auto_us:.1f} "
                      f"| {auto_us - torch_us:+.1f} |", flush=True)
    print("\nauto below 0.95× torch:\n" + "\n".join(below) if below
          else "\nauto is at least 0.95× torch's SDPA in every case.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
