"""Counting memory, not timing it: the peak of torch's CPU allocations while a function runs
(shared by tests/attention and benchmarks/long.py)."""

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
