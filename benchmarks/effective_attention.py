"""One exact effective-attention row of a linear / state-space layer against a forward of that layer.

For a Gated DeltaNet layer (transformers' ``Qwen3NextGatedDeltaNet``), a KDA layer
(``KimiLinearDeltaAttention``) and a Mamba-2 mixer (``Mamba2Mixer``), random weights, float32,
one child process per measurement (peak memory = ru_maxrss above the built layer and its input):

* ``forward``: the layer on N tokens, no cache (transformers' torch kernels: no fla / mamba_ssm);
* ``read``: ``qkv.explain.mixers.<kind>.read`` — the same forward with its kernel call recorded
  and the record kept in float64 (every head);
* ``row``: ``record.row(head=0, query=N−1)``, the last token's row: the chunked backward sweep
  (delta rule, O(N·c) per chunk of 64) or the decayed products (Mamba-2, O(N·n)).

Shapes: Gated DeltaNet hidden 512, 2 key heads × 128 serving 4 value heads × 128, conv 4;
KDA hidden 512, 4 heads × 128; Mamba-2 hidden 512, 8 heads × 128, 1 group, state 128, chunks of 128.

    python benchmarks/effective_attention.py                          # N = 16k, 64k, one thread
    python benchmarks/effective_attention.py --lengths 16384 --kinds gated_deltanet
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import torch

KINDS = ("gated_deltanet", "kda", "mamba2")


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def build(kind: str):
    torch.manual_seed(0)
    none = {"pad_token_id": None, "bos_token_id": None, "eos_token_id": None}
    if kind == "gated_deltanet":
        from transformers import Qwen3NextConfig
        from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet

        cfg = Qwen3NextConfig(hidden_size=512, num_hidden_layers=2, linear_num_key_heads=2, linear_num_value_heads=4,
                              linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
                              layer_types=["linear_attention", "full_attention"], **none)
        return Qwen3NextGatedDeltaNet(cfg, 0).eval()
    if kind == "kda":
        from transformers import KimiLinearConfig
        from transformers.models.kimi_linear.modeling_kimi_linear import KimiLinearDeltaAttention

        cfg = KimiLinearConfig(hidden_size=512, num_hidden_layers=2, linear_attn_config={
            "head_dim": 128, "num_heads": 4, "short_conv_kernel_size": 4, "kda_layers": [1], "full_attn_layers": [2]},
            **none)
        layer = KimiLinearDeltaAttention(cfg, 0).eval()
        with torch.no_grad():
            layer.forget_gate.A_log.copy_(torch.log(torch.empty_like(layer.forget_gate.A_log).uniform_(1, 16)))
            layer.forget_gate.dt_bias.normal_(0, 1)
        return layer
    from transformers import Mamba2Config
    from transformers.models.mamba2.modeling_mamba2 import Mamba2Mixer

    cfg = Mamba2Config(hidden_size=512, num_hidden_layers=2, num_heads=8, head_dim=128, n_groups=1, state_size=128,
                       expand=2, chunk_size=128, conv_kernel=4, **none)
    return Mamba2Mixer(cfg, 0).eval()


def one(spec: dict) -> dict:
    import importlib

    torch.set_num_threads(spec["threads"])
    layer = build(spec["kind"])
    read = importlib.import_module(f"qkv.explain.mixers.{spec['kind']}").read  # imported before the clock
    x = torch.randn(1, spec["n"], 512)
    base = peak_mb()
    t0 = time.perf_counter()
    if spec["what"] == "forward":
        with torch.no_grad():
            layer(x)
        return dict(time=time.perf_counter() - t0, peak_mb=max(0.0, peak_mb() - base))
    record = read(layer, x)
    t_read = time.perf_counter() - t0
    t1 = time.perf_counter()
    row = record.row(0, spec["n"] - 1)
    t_row = time.perf_counter() - t1
    assert torch.isfinite(row).all()
    return dict(read=t_read, row=t_row, peak_mb=max(0.0, peak_mb() - base), row_sum=float(row.sum()))


def run(spec: dict) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--one", json.dumps(spec)], capture_output=True, text=True)
    if proc.returncode != 0:
        return dict(failed=proc.stderr.strip()[-300:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--lengths", default="16384,65536", help="comma-separated N")
    p.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated, of {list(KINDS)}")
    p.add_argument("--one", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.one:
        print(json.dumps(one(json.loads(a.one))))
        return
    print(f"torch {torch.__version__}, {a.threads} thread(s), layer in fp32, record in fp64")
    print(f"{'kind':15} {'N':>6} | {'forward s':>9} {'peak MB':>8} | {'read s':>7} {'row s':>7} {'peak MB':>8}")
    for kind in a.kinds.split(","):
        for n in (int(v) for v in a.lengths.split(",")):
            spec = dict(kind=kind, n=n, threads=a.threads)
            f, r = run(dict(spec, what="forward")), run(dict(spec, what="row"))
            if "failed" in f or "failed" in r:
                print(f"{kind:15} {n:>6} failed: {f.get('failed') or r.get('failed')}")
                continue
            print(f"{kind:15} {n:>6} | {f['time']:>9.2f} {f['peak_mb']:>8.0f} | {r['read']:>7.2f} {r['row']:>7.3f} "
                  f"{r['peak_mb']:>8.0f}", flush=True)


if __name__ == "__main__":
    main()
