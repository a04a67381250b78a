"""qkv's attention on a CUDA GPU against torch's own: flash and memory-efficient SDPA, and
FlexAttention compiled (issue 42 item 4).

NOT RUN YET: written and syntax-checked on a machine without a GPU (no device was lent to the
session that wrote it); its masks and float64 reference were checked on the CPU against
qkv.scaled_dot_product_attention (N=256, causal / window 64 / four documents: max err ≤ 4.2e-7).
Its figures belong in benchmarks/RESULTS.md only once it has run on a GPU.

    python benchmarks/gpu.py                                   # causal and window 1024, fwd
    python benchmarks/gpu.py --lengths 4096,16384,65536 --dtype bfloat16 --backward

For each length, mask (causal; a sliding window; packed documents) and dtype, one (b=1, h, N, d)
problem, timed with CUDA events (median of ``--repeats`` after ``--warmup``), peak memory from
``torch.cuda.max_memory_allocated`` above the inputs, and the largest difference from a float64
reference computed in query blocks (the reference never holds N × N):

* ``sdpa-flash``      torch SDPA, ``SDPBackend.FLASH_ATTENTION`` (causal only: no window mask)
* ``sdpa-efficient``  torch SDPA, ``SDPBackend.EFFICIENT_ATTENTION`` (a window as a dense bool
  mask, so O(N²) memory — printed as such)
* ``flex``            ``torch.compile(flex_attention)`` with the matching ``BlockMask``
* ``qkv-auto``        ``qkv.scaled_dot_product_attention(..., mask=AttentionMask(...))`` —
  qkv's "auto" rule on CUDA
* ``qkv-blockwise``   ``backend="blockwise"`` (qkv's own online softmax, pure torch on CUDA)

A cell that runs out of memory prints ``OOM`` and the run goes on.
"""

from __future__ import annotations

import argparse
import statistics

import torch


def reference(q, k, v, allowed, block: int = 1024) -> torch.Tensor:
    """float64 attention, a block of query rows at a time: (b, h, N, d)."""
    out = torch.empty(q.shape, dtype=torch.float64, device=q.device)
    scale = q.shape[-1] ** -0.5
    for start in range(0, q.shape[-2], block):
        rows = torch.arange(start, min(start + block, q.shape[-2]), device=q.device)
        s = (q[..., rows, :].double() @ k.double().transpose(-1, -2)) * scale  # (b, h, r, N)
        keep = allowed(rows[:, None], torch.arange(k.shape[-2], device=q.device)[None, :])
        s = s.masked_fill(~keep, float("-inf"))
        out[..., rows, :] = torch.softmax(s, -1) @ v.double()
    return out


def masks(name: str, n: int, window: int, device):
    """(allowed(i, j) → bool tensor, a flex mask_mod, qkv's AttentionMask) for ``name``."""
    from qkv.attention import AttentionMask

    if name == "causal":
        def allowed(i, j):
            return j <= i
        return allowed, lambda b, h, i, j: j <= i, AttentionMask(causal=True)
    if name == "window":
        def allowed(i, j):
            return (j <= i) & (i - j < window)
        return allowed, lambda b, h, i, j: (j <= i) & (i - j < window), \
            AttentionMask(causal=True, window=(window - 1, 0))
    # four packed documents of equal length
    doc = torch.arange(n, device=device) * 4 // n

    def allowed(i, j):
        return doc[i] == doc[j]
    from qkv.attention import VarLen

    bounds = [n * d // 4 for d in range(5)]
    return allowed, lambda b, h, i, j: doc[i] == doc[j], \
        AttentionMask(varlen=VarLen.from_lengths([bounds[d + 1] - bounds[d] for d in range(4)], device=device))


def timed(fn, warmup: int, repeats: int) -> tuple[float, int]:
    """(median ms, peak bytes allocated above what was allocated before)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times), torch.cuda.max_memory_allocated() - base


def candidates(q, k, v, mask_name, allowed, mod, description, n, backward):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    import qkv

    flex = torch.compile(flex_attention)
    block = create_block_mask(mod, 1, 1, n, n, device=q.device)
    dense = None if mask_name == "causal" else \
        allowed(torch.arange(n, device=q.device)[:, None], torch.arange(n, device=q.device)[None, :])

    def sdpa(backend):
        def run():
            with sdpa_kernel(backend):
                if dense is None:
                    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=dense)
        return run

    out = {
        "sdpa-efficient": sdpa(SDPBackend.EFFICIENT_ATTENTION),
        "flex": lambda: flex(q, k, v, block_mask=block),
        "qkv-auto": lambda: qkv.scaled_dot_product_attention(q, k, v, mask=description),
        "qkv-blockwise": lambda: qkv.scaled_dot_product_attention(q, k, v, mask=description,
                                                                  backend="blockwise"),
    }
    if mask_name == "causal":
        out["sdpa-flash"] = sdpa(SDPBackend.FLASH_ATTENTION)
    if backward:
        def with_backward(fn):
            def run():
                fn().sum().backward()
            return run
        out = {name: with_backward(fn) for name, fn in out.items()}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", default="4096,16384")
    p.add_argument("--masks", default="causal,window,documents")
    p.add_argument("--window", type=int, default=1024)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--dtype", default="bfloat16", choices=("float16", "bfloat16", "float32"))
    p.add_argument("--backward", action="store_true")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=10)
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/gpu.py needs a CUDA device (torch.cuda.is_available() is False)")
    dtype = getattr(torch, args.dtype)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {args.dtype}, "
          f"h={args.heads} d={args.head_dim}, {'fwd+bwd' if args.backward else 'fwd'}")
    for n in map(int, args.lengths.split(",")):
        for mask_name in args.masks.split(","):
            torch.manual_seed(0)
            q, k, v = (torch.randn(1, args.heads, n, args.head_dim, device="cuda", dtype=dtype,
                                   requires_grad=args.backward) for _ in range(3))
            allowed, mod, description = masks(mask_name, n, args.window, q.device)
            want = None
            if not args.backward and n <= 32768:
                want = reference(q.detach(), k.detach(), v.detach(), allowed)
            for name, fn in candidates(q, k, v, mask_name, allowed, mod, description, n,
                                       args.backward).items():
                try:
                    ms, peak = timed(fn, args.warmup, args.repeats)
                    err = "" if want is None else \
                        f"max err {float((fn().double() - want).abs().max()):.1e}"
                    print(f"  N={n:6d} {mask_name:9s} {name:15s} {ms:9.2f} ms  peak "
                          f"{peak / 2**20:8.0f} MiB  {err}", flush=True)
                except torch.cuda.OutOfMemoryError:
                    print(f"  N={n:6d} {mask_name:9s} {name:15s} OOM", flush=True)
                    torch.cuda.empty_cache()
                except Exception as e:  # a backend that refuses this mask/dtype: named, not fatal
                    print(f"  N={n:6d} {mask_name:9s} {name:15s} failed: {type(e).__name__}: "
                          f"{str(e).splitlines()[0][:120]}", flush=True)


if __name__ == "__main__":
    main()
