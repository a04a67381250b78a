"""Bad input to sequence-parallel attention: a clear error on every rank, never a hang.

One spawn of 3 gloo processes runs every bad call in turn (the group stays usable after each,
since the check itself completed on every rank); a second one with a 2-s collective timeout
shows that a rank that never calls makes the others fail within the timeout.
"""

from __future__ import annotations

import time

import pytest
import torch

import spawned


def _try(fn):
    try:
        fn()
    except (ValueError, RuntimeError) as e:
        return type(e).__name__, str(e)
    return None, None


def _bad_calls(rank, world):
    from qkv.distributed import ring_attention, ulysses_attention

    x = lambda h=4, t=4, d=8, dtype=torch.float32: torch.randn(1, h, t, d, dtype=dtype)  # (b, h, t, d)
    out = {}
    out["ulysses heads"] = _try(lambda: ulysses_attention(x(), x(), x()))  # 4 heads over 3 ranks
    t = 6 if rank == 0 else 4  # 14 tokens: the zigzag split would be 5, 5, 4
    out["lengths"] = _try(lambda: ring_attention(x(t=t), x(t=t), x(t=t)))
    dtype = torch.float64 if rank == 1 else torch.float32
    out["dtype"] = _try(lambda: ring_attention(x(dtype=dtype), x(dtype=dtype), x(dtype=dtype)))
    d = 16 if rank == 2 else 8
    out["shape"] = _try(lambda: ring_attention(x(d=d), x(d=d), x(d=d)))
    out["mask args"] = _try(lambda: ring_attention(x(), x(), x(), is_causal=rank == 0))
    out["layout"] = _try(lambda: ring_attention(x(), x(), x(), layout="zigzag" if rank else "contiguous"))
    out["still works"] = _try(lambda: ring_attention(x(), x(), x(), is_causal=True))
    return out


def test_bad_input_is_an_error_on_every_rank():
    results = spawned.run(3, _bad_calls, deadline=60)
    expect = {"ulysses heads": "4 query heads must be divisible by the group size 3",
              "lengths": "hold [6, 4, 4] tokens (total 14)",
              "dtype": "torch.float64",
              "shape": "(1, 4, 4, 16)",
              "mask args": "causal=True",
              "layout": "layout=contiguous"}
    for case, words in expect.items():
        for rank, got in enumerate(results):
            kind, message = got[case]
            assert kind == "ValueError" and words in message, (case, rank, kind, message)
        assert len({r[case][1] for r in results}) == 1, f"{case}: ranks say different things"
    assert all(r["still works"] == (None, None) for r in results)


def _absent_rank(rank, world):
    from qkv.distributed import ring_attention

    if rank == 0:  # never calls; stays alive past the others' timeout
        time.sleep(4)
        return None
    start = time.monotonic()
    kind, message = _try(lambda: ring_attention(*(torch.randn(1, 2, 4, 8) for _ in range(3))))
    return kind, message, time.monotonic() - start


def test_a_missing_rank_times_out_instead_of_hanging():
    results = spawned.run(3, _absent_rank, deadline=40, timeout_s=2)
    for kind, message, took in results[1:]:
        assert kind == "RuntimeError" and "did every rank call ring_attention" in message, message
        assert took < 2 + 5, f"waited {took:.1f} s with a 2-s timeout"


def test_uninitialised_group_is_a_clear_error():
    import torch.distributed as dist

    from qkv.distributed import ring_attention, shard, ulysses_attention

    assert not dist.is_initialized()
    x = torch.randn(1, 2, 4, 8)
    for call in (lambda: ring_attention(x, x, x), lambda: ulysses_attention(x, x, x),
                 lambda: shard(x)):
        with pytest.raises(ValueError, match="torch.distributed is not initialised"):
            call()


def _count_messages(rank, world):
    import torch.distributed as dist

    from qkv.distributed import ring_attention

    sent = []
    real = dist.batch_isend_irecv

    def counting(ops):  # every exchange the ring posts, as torch sees it
        sends = [op for op in ops if op.op is dist.isend]
        sent.append((len(sends), sum(op.tensor.numel() * op.tensor.element_size() for op in sends)))
        return real(ops)

    import qkv.distributed.ring as ring

    kinds, attend = [], ring._Ring.attend

    def counting_attend(self, q, k, v, kind, *where):  # every chunk pair computed
        kinds.append(kind)
        return attend(self, q, k, v, kind, *where)

    dist.batch_isend_irecv, ring._Ring.attend = counting, counting_attend
    try:
        q, k, v = (torch.randn(1, 2, 6, 8, requires_grad=True) for _ in range(3))  # 6 tokens a rank
        out = ring_attention(q, k, v, is_causal=True)
        forward = list(sent)
        out.sum().backward()
    finally:
        dist.batch_isend_irecv, ring._Ring.attend = real, attend
    return forward, sent[len(forward):], kinds


@pytest.mark.parametrize("world", [2, 4])
def test_each_rank_sends_p_minus_1_messages_forward_and_skips_empty_chunks(world):
    kv_bytes = 2 * (1 * 2 * 6 * 8) * 4  # K and V of one shard, float32
    for forward, backward, kinds in spawned.run(world, _count_messages):
        assert forward == [(2, kv_bytes)] * (world - 1)
        # zigzag, causal: of the 4 pairs of chunks a step could compute, step 0 computes the two
        # diagonals and one full pair, every other step two full pairs; the rest are skipped
        assert sorted(kinds) == sorted(["causal"] * 2 + ["full"] * (1 + 2 * (world - 1)))
        # backward: K/V again (P − 1 steps) and the dK/dV accumulators (P steps, home included)
        assert sorted(backward) == sorted([(2, kv_bytes)] * (world - 1) + [(2, kv_bytes)] * world)


def _many_dims(rank, world):
    """Issue 23, 7: inputs of any rank — the cross-rank description has a fixed size whatever the
    number of dims (gloo aborts on rows of different lengths), and describes every dim."""
    import torch.distributed as dist

    from qkv.distributed import ring_attention, shard

    out = {}
    for nd in (3, 8, 9, 10, 12):  # 8: the old description's limit; 9, 10: what broke it
        lead = (2, *([1] * (nd - 5)), 3)[: nd - 3] if nd > 3 else ()
        X = torch.randn(*lead, 2, 7, 8, dtype=torch.float64)  # (..., h, N, d)
        dist.broadcast(X, src=0)
        got = ring_attention(*(shard(X) for _ in range(3)), is_causal=True)
        # the batch dims are flattened into one: the same kernels on the same numbers as a 4-D
        # call (whose agreement with one process tests/distributed/test_ring.py checks)
        flat = X.reshape(-1, 2, 7, 8)  # (B, h, N, d)
        ref = ring_attention(*(shard(flat) for _ in range(3)), is_causal=True).reshape(got.shape)
        out[f"{nd}-D"] = (tuple(got.shape) == (*lead, 2, shard(X).shape[-2], 8), torch.equal(got, ref))
    shapes = {"rank count": [(1,) * 6 + (2, 4, 8), (1,) * 7 + (2, 4, 8)],  # 9-D and 10-D ranks
              "batch dims swapped": [(2, 3, 2, 4, 8), (3, 2, 2, 4, 8)],
              "first of 12 dims": [(2,) + (1,) * 8 + (2, 4, 8), (3,) + (1,) * 8 + (2, 4, 8)]}
    for case, (mine, other) in shapes.items():
        y = torch.randn(mine if rank == 0 else other)
        out[case] = _try(lambda: ring_attention(y, y, y))
    out["still works"] = _try(lambda: ring_attention(*(torch.randn(1, 2, 4, 8) for _ in range(3))))
    return out


@pytest.mark.parametrize("world", [2, 3])
def test_any_number_of_dims_fails_or_works_on_every_rank(world):
    results = spawned.run(world, _many_dims, deadline=60)
    for rank, got in enumerate(results):
        for nd in (3, 8, 9, 10, 12):
            assert got[f"{nd}-D"] == (True, True), (rank, nd, got[f"{nd}-D"])
        for case, (mine, other) in {"rank count": ("(1, 1, 1, 1, 1, 1, 2, 4, 8)", "(1, 1, 1, 1, 1, 1, 1, 2, 4, 8)"),
                                    "batch dims swapped": ("(2, 3, 2, 4, 8)", "(3, 2, 2, 4, 8)"),
                                    "first of 12 dims": ("(2, 1, 1", "(3, 1, 1")}.items():
            kind, message = got[case]
            assert kind == "ValueError" and "the ranks disagree on shapes" in message, (case, rank, message)
            assert f"rank 0: query {mine}" in message and f"rank 1: query {other}" in message, message
        assert got["still works"] == (None, None)
    for case in ("rank count", "batch dims swapped", "first of 12 dims"):
        assert len({r[case] for r in results}) == 1, f"{case}: ranks say different things"
