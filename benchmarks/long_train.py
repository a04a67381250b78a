"""One fine-tuning step of a small Llama-architecture model with a long sliding window at N tokens:
``attn_implementation="qkv"`` (the spans path: a band's forward and backward, O(N) memory) against
transformers' ``"sdpa"`` (torch's SDPA given the dense (N × N) window mask).

The model is Mistral's (Llama's layers with a ``sliding_window``), random weights, fp32: hidden
256, 4 heads of 64 (4 key/value heads; ``--kv-heads 2`` for GQA), 2 layers, vocabulary 1,024.
A step is forward, loss, backward and an AdamW update. Each implementation runs in a fresh
subprocess: ``step s`` is the median of ``--rounds`` steps after one warm-up step, ``extra MB``
the peak RSS above what the process held before its first step (the AdamW state included).
Both runs start from the same weights and tokens; ``grad rel`` is the largest relative
difference of their first-step gradients (‖g_qkv − g_sdpa‖ / ‖g_sdpa‖ per parameter).

    python benchmarks/long_train.py --tokens 16384 --window 4096 --threads 2
    python benchmarks/long_train.py --tokens 2048 --window 512 --threads 1     # a quick check
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import torch


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def build(spec: dict):
    """The model (same weights for every run: seeded) and its tokens."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    import qkv.hf  # noqa: F401  (registers attn_implementation="qkv")
    config = transformers.MistralConfig(
        vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=spec["kv_heads"], head_dim=64,
        max_position_embeddings=spec["tokens"], sliding_window=spec["window"])
    torch.manual_seed(0)
    model = transformers.MistralForCausalLM(config)
    model.set_attn_implementation(spec["impl"]) if hasattr(model, "set_attn_implementation") \
        else setattr(model.config, "_attn_implementation", spec["impl"])
    tokens = torch.randint(0, 1024, (1, spec["tokens"]), generator=torch.Generator().manual_seed(1))
    return model, tokens


def one(spec: dict) -> dict:
    """One implementation's steps, in this process."""
    torch.set_num_threads(spec["threads"])
    model, tokens = build(spec)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    base = rss_mb()

    def step():
        loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()} if spec.get("save") else None
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss), grads

    t0 = time.perf_counter()
    loss, grads = step()
    first = time.perf_counter() - t0
    if grads is not None:
        from safetensors.torch import save_file
        save_file(grads, spec["save"])
    times = []
    for _ in range(spec["rounds"]):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return dict(spec, loss=loss, first_s=first, step_s=statistics.median(times) if times else first,
                extra_mb=peak_mb() - base, impl_seen=model.config._attn_implementation)


def run(spec: dict) -> dict | None:
    proc = subprocess.run([sys.executable, __file__, "--one", json.dumps(spec)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"  {spec['impl']}: failed ({proc.stderr.strip()[-300:]})", flush=True)
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


def grad_rel(a: str, b: str) -> float:
    from safetensors.torch import load_file
    ga, gb = load_file(a), load_file(b)
    return max(float((ga[n] - gb[n]).norm() / gb[n].norm().clamp_min(1e-30)) for n in gb)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--window", type=int, default=4096, help="the model's sliding_window")
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--threads", default="1", help="comma-separated thread counts")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--one", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.one:
        print(json.dumps(one(json.loads(a.one))))
        return
    sys.path.insert(0, os.path.dirname(__file__))
    from long import cpu_name
    print(f"{cpu_name()}; torch {torch.__version__}; N = {a.tokens}, window {a.window}, "
          f"{a.kv_heads} key/value heads")
    print(f"{'threads':>7} {'impl':6} {'step s':>8} {'first s':>8} {'extra MB':>9} {'loss':>8}")
    for threads in (int(x) for x in a.threads.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            res = {}
            for impl in ("qkv", "sdpa"):
                spec = dict(impl=impl, tokens=a.tokens, window=a.window, kv_heads=a.kv_heads,
                            threads=threads, rounds=a.rounds, save=os.path.join(tmp, f"{impl}.safetensors"))
                res[impl] = r = run(spec)
                if r is not None:
                    print(f"{threads:7} {impl:6} {r['step_s']:8.2f} {r['first_s']:8.2f} "
                          f"{r['extra_mb']:9.0f} {r['loss']:8.4f}", flush=True)
            if all(res.values()):
                q, s = res["qkv"], res["sdpa"]
                print(f"        sdpa / qkv step time {s['step_s'] / q['step_s']:.2f}×, memory "
                      f"{s['extra_mb'] / max(q['extra_mb'], 1):.1f}×; grad rel "
                      f"{grad_rel(q['save'], s['save']):.1e}", flush=True)


if __name__ == "__main__":
    main()
