"""Sequence-parallel attention and a sequence-parallel GPT-2 forward, launched by torchrun.

One machine, 4 processes (one torch thread each — more threads than cores makes it ~10× slower):

    torchrun --nproc-per-node 4 examples/ring_attention.py --length 4096

Several machines (run the same command on each; node 0's address as the rendezvous endpoint):

    torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d \\
        --rdzv-endpoint node0.example:29500 --rdzv-id qkv-ring examples/ring_attention.py

Each rank draws the same full q, k, v (seeded; a real job would load only its shard), keeps its
zigzag shard, runs ring and Ulysses attention, and checks its shard against single-process
attention; then a tiny GPT-2 gives the same logits sharded as whole. Rank 0 prints.
"""

from __future__ import annotations

import argparse
import datetime
import os
import time

import torch
import torch.distributed as dist

import qkv
from qkv.distributed import SequenceParallel, ring_attention, shard, shard_positions, ulysses_attention
from qkv.models.gpt2 import GPT2Config, GPT2Model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--length", type=int, default=4096, help="tokens in the sequence")
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--layout", choices=("zigzag", "contiguous"), default="zigzag")
    args = ap.parse_args()

    # torchrun sets RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR/PORT
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // local))  # cores // P, never more
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))  # "nccl" on GPUs
    rank, world = dist.get_rank(), dist.get_world_size()

    gen = torch.Generator().manual_seed(0)
    Q, K, V = (torch.randn(1, args.heads, args.length, 64, generator=gen) for _ in range(3))
    q, k, v = (shard(x, layout=args.layout) for x in (Q, K, V))  # (1, h, N/P, 64)
    t0 = time.perf_counter()
    out = ring_attention(q, k, v, is_causal=True, layout=args.layout)
    ring_s = time.perf_counter() - t0
    ref = shard(qkv.scaled_dot_product_attention(Q, K, V, is_causal=True), layout=args.layout)
    err = torch.tensor([(out - ref).abs().max().item()])
    if args.heads % world == 0:
        u = ulysses_attention(q, k, v, is_causal=True, layout=args.layout)
        err = torch.maximum(err, torch.tensor([(u - ref).abs().max().item()]))
    dist.all_reduce(err, op=dist.ReduceOp.MAX)

    torch.manual_seed(0)  # the same weights on every rank
    model = GPT2Model(GPT2Config(vocab_size=100, n_positions=512, n_embd=64, n_layer=2, n_head=4)).eval()
    ids = torch.randint(0, 100, (1, 300), generator=gen)
    with torch.no_grad():
        whole = model(ids).logits  # (1, 300, V)
        SequenceParallel(layout=args.layout).apply(model)
        # this rank's tokens at their global positions: (1, 300/P) → logits (1, 300/P, V)
        mine = model(shard(ids, layout=args.layout, dim=1),
                     position_ids=shard_positions(300, layout=args.layout)).logits
    model_err = torch.tensor([(mine - shard(whole, layout=args.layout, dim=1)).abs().max().item()])
    dist.all_reduce(model_err, op=dist.ReduceOp.MAX)
    if rank == 0:
        print(f"{world} processes × {torch.get_num_threads()} threads, N = {args.length}, "
              f"layout {args.layout}: ring attention {ring_s:.2f} s; max |shard − single process| "
              f"{err.item():.2g}; GPT-2 logits {model_err.item():.2g}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
