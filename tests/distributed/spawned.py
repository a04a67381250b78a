"""Run a function on P gloo processes (torch.multiprocessing, one torch thread each), with deadlines.

``run(P, fn, *args)`` spawns P processes; each joins a gloo group on a free localhost port with a
short collective timeout (``COLLECTIVE_TIMEOUT``), calls ``fn(rank, P, *args)`` and returns what
it returned (pickled through a queue). A process that raises fails the test with its traceback;
if the processes are not all done by ``deadline`` seconds they are killed and the test fails —
nothing here can hang the suite.
"""

from __future__ import annotations

import datetime
import os
import queue
import socket
import time
import traceback

import torch
import torch.multiprocessing as mp

COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=10)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, world, port, fn, args, results, timeout_s, init):
    torch.set_num_threads(1)
    try:
        if init:
            import torch.distributed as dist

            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                    world_size=world,
                                    timeout=datetime.timedelta(seconds=timeout_s))
        results.put((rank, "ok", fn(rank, world, *args)))
    except BaseException:  # noqa: BLE001 — reported to the parent, which fails the test
        results.put((rank, "error", traceback.format_exc()))
    finally:
        if init:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()


def run(world: int, fn, *args, deadline: float = 60.0, timeout_s: float | None = None,
        init: bool = True) -> list:
    """``[fn(0, P, *args), …, fn(P−1, P, *args)]``, each run in its own gloo process."""
    ctx = mp.get_context("fork")  # the children inherit torch and qkv already imported: no 2-s start each
    results = ctx.Queue()
    port = free_port()
    timeout_s = COLLECTIVE_TIMEOUT.total_seconds() if timeout_s is None else timeout_s
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    procs = [ctx.Process(target=_entry, args=(r, world, port, fn, args, results, timeout_s, init),
                         daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    got, errors, end = {}, {}, time.monotonic() + deadline
    try:
        while len(got) + len(errors) < world:
            left = end - time.monotonic()
            if left <= 0:
                raise AssertionError(f"distributed test: ranks {sorted(set(range(world)) - set(got) - set(errors))} "
                                     f"not done after {deadline} s (killed)")
            try:
                rank, status, value = results.get(timeout=min(left, 1.0))
            except queue.Empty:
                if all(not p.is_alive() for p in procs) and results.empty():
                    raise AssertionError("distributed test: a rank died without reporting")
                continue
            (got if status == "ok" else errors)[rank] = value
    finally:  # 5 s in all for the ranks to exit; a rank still alive is killed and reaped
        stop = time.monotonic() + 5
        for p in procs:
            p.join(timeout=max(0.0, stop - time.monotonic()))
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        results.close()
    if errors:
        raise AssertionError("\n".join(f"rank {r} raised:\n{tb}" for r, tb in sorted(errors.items())))
    return [got[r] for r in range(world)]
