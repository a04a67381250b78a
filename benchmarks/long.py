"""Long sequences: qkv's blockwise backend (spans) against its pure-torch path, torch's SDPA and FlexAttention.

fp32, B = 1, H = 4 (H = 1 too for causal), d = 64. Every measurement runs in a fresh subprocess
so that its peak RSS is its own: ``extra MB`` is the peak resident memory above what the inputs
and the output hold. Times are the median of ``--rounds`` calls after one warm-up call; ratios
are taken between medians of the same run (the machine is shared, so the absolute times drift
from run to run, the ratios much less).

Cases:
    window     a causal sliding window of 512 (qkv: ``window=(512, 0), is_causal=True``)
    document   packed documents of 2,048 tokens (bidirectional within each document)
    causal     plain causal attention, H = 4 and H = 1 (torch: its ``is_causal`` kernel; qkv:
               ``is_causal=True`` under "auto", and the spans path forced by a block mask)
    decode     one query row against a 64k cache, window 512 / documents of 2,048
               (qkv: a block mask; peer: SDPA with the dense (1, s) mask row)

Implementations: ``spans`` is the blockwise backend as a user calls it (torch's fused kernel per
span, :mod:`qkv.attention.spans`; for a window qkv's C++ kernel where it is built), ``torch_blockwise`` its pure-torch reference path
(:func:`qkv.attention.blockwise.blockwise_attention`), ``spans fwd+bwd`` forward + backward as the
backend runs them (the backward by qkv's C++ kernel where built, for windows and documents): its
speed-up column is (forward + backward) / forward, and ``bwd MB`` the backward's peak of torch's
allocations beyond dq, dk, dv (the profiler's allocation events summed in order: counted, not
timed; what issue 33 asks ≤ 64 MB at 64k), dout held by the caller as the inputs are.

``kernel`` is the forward by qkv's C++ kernel (:mod:`qkv.attention.kernels`, built by ``make
setup``; the blockwise backend runs it for a window), ``spans_torch`` the forward by torch's
fused kernel per span (:func:`qkv.attention.spans.spans_forward`): the pure-torch spans path the
kernel is compared with, for windows and documents alike. ``backward`` times, interleaved in one
process on one forward's (out, lse), the backend's forward, the C++ backward
(:func:`qkv.attention.kernels.kernel_backward`, what the backend runs for both cases) and the
spans backward (:func:`qkv.attention.spans.spans_backward`): (forward + each backward) / forward,
and each backward's peak allocation beyond dq, dk, dv.

Peers: ``sdpa+mask`` is torch's SDPA given the materialised (N, N) mask (what ``"fused"`` does
for a window; skipped above 16k, where the mask alone is ≥ 1 GiB); ``flex`` is FlexAttention
compiled (``torch.compile``), its compile time reported apart (``--flex``; minutes on 2 cores).
"Useful GFLOP/s" counts 4·N·w·d·H per forward (w = keys per row that take part), against the
fp32 matmul rate measured in the same run at the same thread count.

    python benchmarks/long.py --threads 1,2 --lengths 16384,65536 --flex --markdown   # issue 21's table
    python benchmarks/long.py --threads 1                  # every length (a few minutes)
    python benchmarks/long.py --threads 1 --quick          # N = 4k, 8k only
    python benchmarks/long.py --threads 1,2 --lengths 16384,65536 --cases window,document \
        --impls blockwise,blockwise+backward                # training: fwd+bwd / fwd, bwd MB
    python benchmarks/long.py --threads 1 --lengths 16384 --cases window,document \
        --impls backward                                    # the C++ backward vs the spans backward

The header names the CPU (``/proc/cpuinfo``'s model name): ratios differ between CPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

H, D = 4, 64


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    except OSError:
        names = []
    import platform
    return (names[0] if names else platform.processor() or platform.machine()) + f", {os.cpu_count()} CPUs"


def allocated_peak_bytes(fn) -> int:
    """The peak of torch's CPU allocations while ``fn`` runs, above what was held before
    (tests/memory.py's count, the one the spans tests assert)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from memory import allocated_peak

    return allocated_peak(fn)


def matmul_gflops() -> float:
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    a @ b
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    return 2 * 2048**3 / min(times) / 1e9


def keys_per_row(case: str, n: int) -> float:
    if case == "window":
        return 512.5  # rows past the first 512 see 513 keys
    if case == "document":
        return 2048
    return (n + 1) / 2


def one(spec: dict) -> dict:
    """Run one (case, N, heads, impl) in this process; return its times and memory."""
    import qkv
    torch.set_num_threads(spec["threads"])
    case, n, h, impl = spec["case"], spec["n"], spec["h"], spec["impl"]
    small = torch.randn(1, h, 256, D)  # libraries' one-time buffers, before the baseline
    qkv.scaled_dot_product_attention(small, small, small, window=(8, 0), is_causal=True)
    qkv.scaled_dot_product_attention(small, small, small, is_causal=True, backend="blockwise")
    torch.nn.functional.scaled_dot_product_attention(small, small, small, is_causal=True)
    q, k, v = (torch.randn(1, h, n, D) for _ in range(3))
    base = rss_mb() + q.numel() * 4 / 2**20  # inputs held, plus the output to come
    build = None
    if case == "window":
        mod = qkv.masks.sliding_window(512, 0)
        kwargs = dict(window=(512, 0), is_causal=True)
    elif case == "document":
        mod = qkv.masks.document(torch.arange(n) // 2048)
        varlen = qkv.VarLen.from_lengths([2048] * (n // 2048))
        kwargs = dict(attn_mask=None)  # the (N, N) block diagonal, built inside the timed call
        if impl == "sdpa+grid":  # qkv's packed-sequence path: each document its own batch row
            impl, kwargs = "sdpa+mask", dict(mask=qkv.AttentionMask(varlen=varlen))
    else:
        mod = qkv.masks.causal()
        kwargs = dict(is_causal=True)
    # the tiles "auto" gives the case's description (block_mask_for: 64 rows for a window, else 128)
    tile = 64 if case == "window" else 128
    if case == "decode":
        return decode(spec)
    if impl == "torch_blockwise":
        from qkv.attention.blockwise import blockwise_attention
        bm = qkv.create_block_mask(mod, None, None, n, n, block_size=tile)
        call = lambda: blockwise_attention(q, k, v, bm, scale=D ** -0.5)  # noqa: E731
    elif impl == "auto":  # plain causal as a user writes it
        chosen = qkv.attention.backends.choose_backend(q, k, qkv.AttentionMask(causal=True))
        spec["chose"] = chosen
        call = lambda: qkv.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    elif impl == "blockwise":
        t0 = time.perf_counter()
        bm = qkv.create_block_mask(mod, None, None, n, n, block_size=tile)
        build = time.perf_counter() - t0
        call = lambda: qkv.scaled_dot_product_attention(q, k, v, block_mask=bm)  # noqa: E731
        if case == "window":  # what a user writes: "auto" routes it blockwise, building bm's twin per call
            assert qkv.attention.backends.choose_backend(q, k, qkv.AttentionMask(causal=True, window=(512, 0))) \
                == "blockwise"
            assert qkv.attention.spans.supports(q, k, v)
            call = lambda: qkv.scaled_dot_product_attention(q, k, v, **kwargs)  # noqa: E731
    elif impl in ("kernel", "spans_torch"):  # the forward by qkv's C++ kernel / by torch's kernel per span
        from qkv.attention import kernels
        from qkv.attention.spans import spans_forward
        bm = qkv.create_block_mask(mod, None, None, n, n, block_size=tile)
        if impl == "kernel" and not kernels.can_run(q, k, v, bm):
            raise SystemExit("qkv's C++ kernel is not built here (python -m qkv.attention.kernels.build)")
        fwd = kernels.kernel_forward if impl == "kernel" else spans_forward
        call = lambda: fwd(q, k, v, bm, scale=D ** -0.5)  # noqa: E731
    elif impl == "blockwise+backward":
        bm = qkv.create_block_mask(mod, None, None, n, n, block_size=tile)
        q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
        dout = torch.ones(1, h, n, D)  # the gradient arriving, held by the caller

        def call():
            out = qkv.scaled_dot_product_attention(q, k, v, block_mask=bm)
            out.backward(dout)
            q.grad = k.grad = v.grad = None
        base += 4 * q.numel() * 4 / 2**20  # dout and the three gradients

        def backward_only():  # the backward alone, on a forward run outside the count
            out = qkv.scaled_dot_product_attention(q, k, v, block_mask=bm)
            spec["bwd_mb"] = (allocated_peak_bytes(lambda: out.backward(dout)) - 3 * q.numel() * 4) / 2**20
            q.grad = k.grad = v.grad = None
    elif impl == "backward":
        return backwards(spec, q, k, v, qkv.create_block_mask(mod, None, None, n, n, block_size=tile))
    elif impl == "sdpa+mask":  # qkv's "fused": torch's SDPA with the materialised (N, N) mask
        def call():
            extra = dict(attn_mask=varlen.block_diagonal()) if kwargs.get("attn_mask", 1) is None else kwargs
            return qkv.scaled_dot_product_attention(q, k, v, backend="fused", **extra)
    elif impl == "torch_causal":
        call = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    elif impl == "flex":
        from torch.nn.attention import flex_attention as fa
        t0 = time.perf_counter()
        if case == "window":
            def flex_mod(b, hh, i, j):
                return (j <= i) & (i - j <= 512)
        elif case == "document":
            docs = torch.arange(n) // 2048

            def flex_mod(b, hh, i, j):
                return docs[i] == docs[j]
        else:
            def flex_mod(b, hh, i, j):
                return j <= i
        fbm = fa.create_block_mask(flex_mod, None, None, n, n, device="cpu")
        build = time.perf_counter() - t0
        compiled = torch.compile(fa.flex_attention)
        t0 = time.perf_counter()
        compiled(q, k, v, block_mask=fbm)
        spec["compile_s"] = time.perf_counter() - t0
        call = lambda: compiled(q, k, v, block_mask=fbm)  # noqa: E731
    else:
        raise SystemExit(f"unknown impl {impl}")
    if n <= 16384 or impl in ("blockwise", "blockwise+backward"):
        # warm-up (above 16k a call takes seconds, but a cold first call's page faults are not
        # noise under every kernel: a VM's cost 2-6× the backward's time; the spans pair always)
        call()
    times = []
    for _ in range(spec["rounds"]):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    extra_mb = max(0.0, peak_mb() - base)
    if impl == "blockwise+backward":
        backward_only()
    return dict(spec, time_s=statistics.median(times), build_s=build, extra_mb=extra_mb)


def backwards(spec: dict, q, k, v, bm) -> dict:
    """The backend's forward, the C++ backward and the spans backward on that forward's (out, lse),
    rounds interleaved (the machine's load drifts alike for all three); the backwards' peak
    allocations beyond dq, dk, dv."""
    from qkv.attention import kernels
    from qkv.attention.spans import spans_backward, spans_forward
    if not kernels.can_run(q, k, v, bm):
        raise SystemExit("qkv's C++ kernel is not built here (python -m qkv.attention.kernels.build)")
    scale = D ** -0.5
    forward = kernels.kernel_forward if kernels.supports(q, k, v, bm) else spans_forward  # the backend's
    out, lse = forward(q, k, v, bm, scale=scale)
    dout = torch.randn_like(out)
    calls = {"fwd": lambda: forward(q, k, v, bm, scale=scale),
             "kernel": lambda: kernels.kernel_backward(q, k, v, out, dout, lse, bm, scale=scale),
             "spans": lambda: spans_backward(q, k, v, out, dout, lse, bm, scale=scale)}
    times = {name: [] for name in calls}
    for name, call in calls.items():
        call()  # warm-up
        spec[f"{name}_mb"] = (allocated_peak_bytes(call) - 3 * q.numel() * 4) / 2**20
    for _ in range(spec["rounds"]):
        for name, call in calls.items():
            t0 = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - t0)
    for name in calls:
        spec[f"{name}_s"] = statistics.median(times[name])
    return dict(spec, time_s=spec["fwd_s"], build_s=None, extra_mb=0.0)


def decode(spec: dict) -> dict:
    """One query row (the last of ``n``) against an ``n``-key cache: qkv's block mask vs SDPA with
    the dense mask row (what the fused backend draws for it)."""
    import qkv
    n, h, impl = spec["n"], spec["h"], spec["impl"]
    kind = spec["mask"]
    q = torch.randn(1, h, 1, D)
    k, v = torch.randn(1, h, n, D), torch.randn(1, h, n, D)
    base = rss_mb()
    if kind == "window":
        mod = qkv.masks.sliding_window(512, 0)
    else:
        mod = qkv.masks.document(torch.arange(n) // 2048)
    bm = qkv.create_block_mask(mod, None, None, 1, n, block_size=128, q_offset=n - 1)
    if impl == "blockwise":
        call = lambda: qkv.scaled_dot_product_attention(q, k, v, block_mask=bm)  # noqa: E731
    else:
        row = bm.rows_mask(torch.tensor([0]))[0, 0]  # (1, n) bool
        call = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=row)  # noqa: E731
    call()
    times = []
    for _ in range(max(spec["rounds"], 20)):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return dict(spec, time_s=statistics.median(times), build_s=None, extra_mb=max(0.0, peak_mb() - base))


def run(spec: dict) -> dict | None:
    proc = subprocess.run([sys.executable, __file__, "--one", json.dumps(spec)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"  {spec['case']} N={spec['n']} {spec['impl']}: failed ({proc.stderr.strip()[-200:]})")
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", default="1", help="comma-separated thread counts, each its own table")
    p.add_argument("--markdown", action="store_true", help="also print a markdown table to paste")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--flex", action="store_true")
    p.add_argument("--full", action="store_true", help="also causal H = 4 at N = 64k")
    p.add_argument("--lengths", help="comma-separated N (default 4k … 64k)")
    p.add_argument("--cases", default="window,document,causal", help="comma-separated cases")
    p.add_argument("--impls", help="comma-separated implementations to keep (default: every one "
                   "the case runs), e.g. blockwise,blockwise+backward")
    p.add_argument("--one", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.one:
        print(json.dumps(one(json.loads(a.one))))
        return
    rows = []
    for threads in (int(x) for x in a.threads.split(",")):
        rows += table(a, threads)
    if a.markdown:
        print(f"\n{cpu_name()}, torch {torch.__version__}")
        print("\n| threads | case | N | impl | ms | extra MB | useful GF/s | % matmul | peer / spans | build ms |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            print("| " + " | ".join(r) + " |")
    if a.lengths:
        return
    # a custom mask_mod, evaluated block row by block row (target: <= 1 s at N = 16k)
    import qkv
    t0 = time.perf_counter()
    qkv.create_block_mask(lambda b, h, i, j: (i - j).abs() <= 512, None, None, 16384, 16384)
    print(f"custom mask_mod block mask at N=16384: {(time.perf_counter() - t0) * 1e3:.0f} ms")


def table(a, threads: int) -> list[list[str]]:
    """One thread count's runs, printed as they come; returns the markdown rows."""
    torch.set_num_threads(threads)
    peak = matmul_gflops()
    md = []
    lengths = (4096, 8192) if a.quick else (4096, 8192, 16384, 32768, 65536)
    if a.lengths:
        lengths = tuple(int(n) for n in a.lengths.split(","))
    cases = a.cases.split(",")
    print(f"{cpu_name()}; torch {torch.__version__}, {threads} thread(s), fp32 matmul (2048³): "
          f"{peak:.1f} GFLOP/s")
    print(f"{'case':10} {'N':>6} {'impl':20} {'ms':>9} {'extra MB':>9} {'useful GF/s':>11} "
          f"{'% matmul':>8} {'speed-up':>9} {'build ms':>9}")
    for case, heads in (("window", H), ("document", H), ("causal", H), ("causal", 1), ("decode", H)):
        if case not in cases:
            continue
        if case == "decode":
            for kind in ("window", "document"):
                base = dict(case=case, n=65536, h=heads, threads=threads, rounds=a.rounds, mask=kind)
                res = {impl: run(dict(base, impl=impl)) for impl in ("blockwise", "sdpa+mask")}
                if None in res.values():
                    continue
                ours, peer = res["blockwise"]["time_s"], res["sdpa+mask"]["time_s"]
                print(f"decode/{kind:9} 65536 spans {ours * 1e3:9.3f} ms  sdpa+mask row {peer * 1e3:9.3f} ms "
                      f"= {peer / ours:.1f}×", flush=True)
                md.append([str(threads), f"decode, {kind}", "64k", "spans", f"{ours * 1e3:.3f}",
                           f"{res['blockwise']['extra_mb']:.0f}", "", "", "", ""])
                md.append([str(threads), f"decode, {kind}", "64k", "SDPA + mask row", f"{peer * 1e3:.3f}",
                           f"{res['sdpa+mask']['extra_mb']:.0f}", "", "", f"**{peer / ours:.1f}×**", ""])
            continue
        for n in lengths:
            if case == "causal" and heads > 1 and n > 32768 and not a.full:
                continue  # minutes per call on one busy core: H = 1 stands for 64k (--full)
            rounds = a.rounds if n <= 16384 else 1
            base = dict(case=case, n=n, h=heads, threads=threads, rounds=rounds)
            impls = ["blockwise", "torch_blockwise"] if case != "causal" or n <= 16384 else ["blockwise"]
            if case != "causal":
                impls += ["kernel", "spans_torch"]
            if case == "causal":
                impls += ["auto", "torch_causal"]
            elif n <= 16384:
                impls.append("sdpa+mask")
            if case == "document":
                impls.append("sdpa+grid")
            if a.flex and case != "causal" and n in (4096, 16384):
                impls.append("flex")
            if case in ("window", "document") and n in (16384, 65536) or case == "causal" and n == 16384 and heads == 4:
                impls.append("blockwise+backward")
            if case in ("window", "document") and n in (16384, 65536):
                impls.append("backward")
            if a.impls:
                impls = [i for i in impls if i in a.impls.split(",")]
            res = {impl: run(dict(base, impl=impl)) for impl in impls}
            ours = res.get("blockwise")
            for impl, r in res.items():
                if r is None:
                    continue
                if impl == "backward":
                    md += print_backwards(r, threads)
                    continue
                flops = 4 * n * keys_per_row(case, n) * D * heads
                gf = (flops / r["time_s"] / 1e9
                      if impl in ("blockwise", "flex", "torch_causal", "auto", "torch_blockwise", "kernel",
                                  "spans_torch") else None)
                ratio = (r["time_s"] / ours["time_s"]) if ours and impl != "blockwise" else None
                extra = f" compile {r['compile_s']:.1f} s" if "compile_s" in r else ""
                extra += f" (auto chose {r['chose']})" if "chose" in r else ""
                extra += f" bwd {r['bwd_mb']:.1f} MB" if "bwd_mb" in r else ""
                print(f"{case + ('/H1' if heads == 1 else ''):10} {n:6} {impl:20} {r['time_s'] * 1e3:9.1f} "
                      f"{r['extra_mb']:9.1f} {gf if gf else float('nan'):11.1f} "
                      f"{100 * gf / peak if gf else float('nan'):8.0f} "
                      f"{ratio if ratio else float('nan'):8.2f}× "
                      f"{r['build_s'] * 1e3 if r.get('build_s') is not None else float('nan'):9.1f}{extra}",
                      flush=True)
                name = NAMES.get(impl, impl) + (f" ({r['chose']})" if "chose" in r else "")
                md.append([str(threads), f"{case}{' H=1' if heads == 1 else ''}", f"{n // 1024}k", name,
                           f"{r['time_s'] * 1e3:.1f}",
                           f"{r['extra_mb']:.0f}" + (f" (bwd {r['bwd_mb']:.1f})" if "bwd_mb" in r else ""),
                           f"{gf:.1f}" if gf else "", f"{100 * gf / peak:.0f} %" if gf else "",
                           f"{ratio:.2f}×" if ratio else "",
                           (f"{r['build_s'] * 1e3:.0f}" if r.get("build_s") is not None else "")
                           + (f" + compile {r['compile_s']:.1f} s" if "compile_s" in r else "")])
    print("speed-up = peer's time / spans forward time (spans+backward: fwd+bwd / fwd)")
    return md


def print_backwards(r: dict, threads: int) -> list[list[str]]:
    """The ``backward`` run's line and its markdown rows: each backward's (fwd + bwd) / fwd."""
    fwd = r["fwd_s"]
    print(f"{r['case']:10} {r['n']:6} backward: forward {fwd * 1e3:.1f} ms; " + "; ".join(
        f"{name} bwd {r[f'{name}_s'] * 1e3:.1f} ms = fwd+bwd {(fwd + r[f'{name}_s']) / fwd:.2f}× fwd, "
        f"{r[f'{name}_mb']:.1f} MB" for name in ("kernel", "spans")), flush=True)
    return [[str(threads), r["case"], f"{r['n'] // 1024}k", f"{label} (fwd {fwd * 1e3:.1f})",
             f"{r[f'{name}_s'] * 1e3:.1f}", f"bwd {r[f'{name}_mb']:.1f}", "", "",
             f"{(fwd + r[f'{name}_s']) / fwd:.2f}×", ""]
            for name, label in (("kernel", "C++ backward"), ("spans", "spans backward"))]


NAMES = {"blockwise": "spans", "torch_blockwise": "pure-torch blockwise", "sdpa+mask": "SDPA + mask",
         "sdpa+grid": "packed grid", "flex": "FlexAttention (compiled)", "torch_causal": "torch is_causal",
         "blockwise+backward": "spans fwd+bwd", "auto": "qkv auto", "kernel": "C++ kernel fwd",
         "spans_torch": "spans by torch's kernel fwd"}


if __name__ == "__main__":
    main()
