"""Counting memory, not timing it: the peak of torch's CPU allocations while a function runs
(shared by tests/attention and benchmarks/long.py), and the backward-memory tests' inputs."""

from __future__ import annotations


def allocated_peak(fn) -> int:
    """The peak of torch's CPU allocations while ``fn`` runs (bytes above what was held before,
    what it returns included): the profiler's allocation events summed in order — counted, not timed."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        kept = fn()  # noqa: F841 (held until the profile ends, as a caller would hold it)
    events = []

    def walk(node):
        if node.name == "[memory]":
            events.append((node.start_time_ns, node.extra_fields.alloc_size))
        for child in node.children:
            walk(child)

    for root in prof.profiler.kineto_results.experimental_event_tree():
        walk(root)
    held = peak = 0
    for _, size in sorted(events, key=lambda e: e[0]):
        held += size
        peak = max(peak, held)
    return peak


def backward_extra(forward, backward, n: int, *, h: int = 4, d: int = 64, window: int = 256) -> int:
    """Bytes a backward allocates beyond dq, dk, dv (:func:`allocated_peak`) on a causal sliding
    window of N = ``n`` tokens, its q, k, v and dout in a model's layout ((1, n, h, d) seen as
    (1, h, n, d)): ``forward(q, k, v, bm, scale=…)`` → (out, lse), then ``backward(q, k, v, out,
    dout, lse, bm, scale=…)`` — the call measured."""
    import torch

    import qkv
    from qkv.masks import sliding_window

    g = torch.Generator().manual_seed(n)
    q, k, v, dout = (torch.randn(1, n, h, d, generator=g).transpose(1, 2) for _ in range(4))  # (1, h, n, d)
    bm = qkv.create_block_mask(sliding_window(window, 0), None, None, n, n, block_size=64)
    out, lse = forward(q, k, v, bm, scale=d ** -0.5)
    peak = allocated_peak(lambda: backward(q, k, v, out, dout, lse, bm, scale=d ** -0.5))
    return peak - 3 * q.numel() * 4  # above dq, dk, dv (float32)
