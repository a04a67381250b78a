"""Ulysses attention (qkv.distributed.ulysses) on gloo processes against one process: ranks that
hold no tokens, and its arguments checked as every backend checks them.

(Its agreement with one process on longer sequences and every mask is
tests/distributed/test_ring.py: test_ulysses_attention_equals_single_process.)
"""

from __future__ import annotations

import pytest
import torch

import spawned
from tolerance import FUSED_FACTOR, agree_bound, max_err


def _grads(inputs, dO, causal, enable_gqa, dtype=torch.float64):
    import qkv

    q, k, v = (x.detach().to(dtype).requires_grad_() for x in inputs)
    out, lse = qkv.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=enable_gqa,
                                                return_lse=True)
    out.backward(dO.to(dtype))
    return out.detach(), lse.detach(), q.grad, k.grad, v.grad


def _few_tokens(rank, world):
    """Every N from 0 to 2P − 1: under zigzag some rank holds a run (or both) of no tokens."""
    import torch.distributed as dist

    from qkv.distributed import shard, ulysses_attention

    report = []
    for n in range(0, 2 * world):
        for layout in ("zigzag", "contiguous"):
            for causal in (False, True):
                for h_kv in (2, 1):  # h_kv = 1 < P: key/value heads repeated before the exchange
                    gen = torch.Generator().manual_seed(n)
                    Q, dO = (torch.randn(2, 2, n, 4, generator=gen, dtype=torch.float64) for _ in range(2))
                    K, V = (torch.randn(2, h_kv, n, 4, generator=gen, dtype=torch.float64) for _ in range(2))
                    for x in (Q, K, V, dO):
                        dist.broadcast(x, src=0)
                    gqa = h_kv != 2
                    ref = _grads((Q, K, V), dO, causal, gqa)
                    low = _grads((Q, K, V), dO, causal, gqa, torch.float32)
                    q, k, v = (shard(x, layout=layout).requires_grad_() for x in (Q, K, V))
                    out, lse = ulysses_attention(q, k, v, is_causal=causal, layout=layout,
                                                 enable_gqa=gqa, return_lse=True)
                    out.backward(shard(dO, layout=layout))
                    case = (n, layout, causal, h_kv)
                    for what, g, r, p in zip(("out", "lse", "dq", "dk", "dv"),
                                             (out, lse, q.grad, k.grad, v.grad), ref, low):
                        if what == "lse":  # (b, h, N): shard the token axis, dim −1 here
                            r, p = (shard(x.unsqueeze(-1), layout=layout).squeeze(-1) for x in (r, p))
                        else:
                            r, p = shard(r, layout=layout), shard(p, layout=layout)
                        finite = torch.isfinite(r)  # lse: −inf nowhere here (every row has a key)
                        tol = agree_bound(r[finite], p[finite], dtype=torch.float64, factor=FUSED_FACTOR)
                        shape_ok = g is not None and g.shape == r.shape
                        err = max_err(g[finite], r[finite]) if shape_ok and finite.any() else 0.0
                        report.append((*case, what, shape_ok, err, tol))
    return report


@pytest.mark.parametrize("world", [2])
def test_ranks_without_tokens_take_part(world):
    """Issue 23, 13 for Ulysses: N = 0 … 2P − 1 equal one process (out, lse and gradients, an
    empty (b, h, 0, ·) result on a rank without tokens); the all-to-all carries empty shards."""
    for rank, report in enumerate(spawned.run(world, _few_tokens, deadline=120)):
        bad = [row for row in report if not (row[5] and row[6] <= row[7])]
        assert not bad, f"rank {rank}: " + "; ".join(
            f"N={n} {layout} causal={c} h_kv={hkv} {what}: shape ok={ok}, error {e:.3g} > {tol:.3g}"
            for n, layout, c, hkv, what, ok, e, tol in bad)
        assert len(report) == 2 * world * 2 * 2 * 2 * 5


def _flags(rank, world):
    from qkv.distributed import ring_attention, ulysses_attention

    x = torch.randn(1, 2, 3, 4)
    got = {}
    for fn in (ring_attention, ulysses_attention):
        for name, kwargs in (("enable_gqa", dict(enable_gqa="no")), ("is_causal", dict(is_causal="yes")),
                             ("is_causal", dict(is_causal=torch.tensor(True)))):
            try:
                fn(x, x, x, **kwargs)
                got[(fn.__name__, name, repr(kwargs[name]))] = None
            except ValueError as e:
                got[(fn.__name__, name, repr(kwargs[name]))] = str(e)
    got["still works"] = tuple(ulysses_attention(x, x, x, enable_gqa=0, is_causal=1).shape)
    return got


def test_flags_are_true_or_false_on_every_rank():
    """enable_gqa="no" is truthy: a plain bool() made it mean True. Both sequence-parallel
    functions check their flags as every backend does (attention/functional.py: check_flag)."""
    results = spawned.run(2, _flags, deadline=60)
    for got in results:
        for key, message in got.items():
            if key == "still works":
                assert message == (1, 2, 3, 4)
                continue
            fn, name, value = key
            assert message == f"{fn}: {name} must be True or False, got {value}", (key, message)
    assert results[0] == results[1]
