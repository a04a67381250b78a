"""What each explanation costs on a billion-parameter model: time as a multiple of one forward,
peak memory above the weights (issue 42 item 3).

Set-up (nothing here downloads weights; the checkpoints are random, built by transformers):

    python benchmarks/scale.py make --shape tinyllama --out /tmp/qkv-scale/tinyllama   # 1.1B, bf16, ~2.2 GB
    python benchmarks/scale.py make --shape gpt2 --out /tmp/qkv-scale/gpt2             # GPT-2 small, fp32
    python benchmarks/scale.py make --shape llama200m --out /tmp/qkv-scale/llama200m   # 0.24B GQA, fp32
    python benchmarks/scale.py make --shape llama3b --out /tmp/qkv-scale/llama3b       # 3.2B, bf16, ~6.4 GB
    python benchmarks/scale.py run --model /tmp/qkv-scale/tinyllama --length 2048

Every cell runs in a fresh interpreter (``cell``): load the model (memory-mapped), fault every
weight in (so the weights are resident before the baseline), reset the peak resident set to the
current one (``/proc/self/clear_refs``: the loader's transient copies are not the task's), run
the task once, and report its CPU time (the process's: on a loaded machine wall time measures the
others' load; cells run one torch thread), its wall time, and the peak resident set (VmHWM) minus
the baseline.
``tracemalloc`` cannot see torch's allocations; the peak RSS can. The forward cell is ``model(ids)`` with nothing traced: the unit of time.

Tasks (one head = ``--layer``/``--head``, the token = the last):

* ``forward``   one untraced forward (the unit)
* ``map``       ``attention_map(model, text, layer, head)``: one head's (t, t) map
* ``layer``     ``attention_maps(model, text, layer=L)``: one layer's heads
* ``explain``   ``explain_head(model, text, layer, head, token)``: one head's steps, one token
* ``overview``  ``explain(model, text, token)``: every layer × head for one token
* ``why``       ``score_attribution(model, text, layer, head, token, key=0)``
* ``heads``     ``heads(model, text, source=<last>, target=<first>)``
* ``document``  ``document(model, text).weights(layer, head, every row)``
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

TASKS = ("forward", "map", "layer", "explain", "overview", "why", "heads", "document")
WORDS = ("baka bela dima fona kuru lipa moto nesa pilo rufa sato tiki vuna wela yoka zuri").split()


def make(shape: str, out: str) -> None:
    """A random checkpoint of ``shape`` saved by transformers (safetensors) with the shipped lm's
    tokenizer (a small word vocabulary: the text's length is what is measured, not its words)."""
    import shutil

    import torch
    import transformers

    torch.manual_seed(0)
    if shape == "gpt2":
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_positions=32768))
    elif shape == "tinyllama":  # TinyLlama-1.1B's shape, bf16
        cfg = transformers.LlamaConfig(hidden_size=2048, num_hidden_layers=22, num_attention_heads=32,
                                       num_key_value_heads=4, intermediate_size=5632, vocab_size=32000,
                                       max_position_embeddings=32768, torch_dtype="bfloat16")
        torch.set_default_dtype(torch.bfloat16)  # initialised in bf16: no 4.4 GB fp32 copy
        model = transformers.LlamaForCausalLM(cfg)
        torch.set_default_dtype(torch.float32)
    elif shape == "llama1b":  # Llama-3.2-1B's shape (vocab cut to 32000: the embedding is not measured)
        cfg = transformers.LlamaConfig(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32,
                                       num_key_value_heads=8, intermediate_size=8192, vocab_size=32000,
                                       max_position_embeddings=32768, rope_theta=500000.0)
        model = transformers.LlamaForCausalLM(cfg)
    elif shape == "llama3b":  # Llama-3.2-3B's shape (vocab cut to 32000, as llama1b's), bf16
        cfg = transformers.LlamaConfig(hidden_size=3072, num_hidden_layers=28, num_attention_heads=24,
                                       num_key_value_heads=8, intermediate_size=8192, vocab_size=32000,
                                       max_position_embeddings=32768, rope_theta=500000.0,
                                       tie_word_embeddings=True, torch_dtype="bfloat16")
        torch.set_default_dtype(torch.bfloat16)  # initialised in bf16: no 13 GB fp32 copy
        model = transformers.LlamaForCausalLM(cfg)
        torch.set_default_dtype(torch.float32)
    elif shape == "llama200m":  # TinyLlama's head layout (64-dim heads, 8 query heads per kv head)
        # at a quarter of its width: the GQA memory of `why` measured where a 2k forward is seconds
        cfg = transformers.LlamaConfig(hidden_size=1024, num_hidden_layers=16, num_attention_heads=16,
                                       num_key_value_heads=2, intermediate_size=2816, vocab_size=32000,
                                       max_position_embeddings=32768)
        model = transformers.LlamaForCausalLM(cfg)
    else:
        raise SystemExit(f"unknown shape {shape!r}: gpt2, tinyllama, llama1b, llama3b, llama200m")
    model.save_pretrained(out, safe_serialization=True)
    import qkv

    shutil.copy(os.path.join(os.path.dirname(qkv.__file__), "data", "lm", "tokenizer.json"), out)


def text_of(tokenizer, n: int) -> str:
    """A text of about ``n`` tokens (the shipped lm's words cycle; one token each)."""
    words = [WORDS[(i * 7 + i // 16) % len(WORDS)] for i in range(n)]
    lo, hi = 1, n
    while lo < hi:  # the most words whose encoding holds ≤ n tokens
        mid = (lo + hi + 1) // 2
        if len(tokenizer.encode(" ".join(words[:mid])).ids) <= n:
            lo = mid
        else:
            hi = mid - 1
    return " ".join(words[:lo])


def rss_now() -> int:
    """Bytes resident now (/proc/self/statm)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def reset_peak() -> int:
    """Reset this process's peak resident set to what is resident now (``clear_refs`` 5), so a
    loader's transient copies do not count as the task's; returns the resident bytes."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return rss_now()


def peak_rss() -> int:
    """The peak resident set since :func:`reset_peak` (VmHWM), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def cell(model_dir: str, task: str, n: int, layer: int, head: int, threads: int,
         dtype: str | None = None) -> dict:
    """One task in this (fresh) interpreter: {"time", "peak_above", "weights", "tokens"}."""
    import torch

    import qkv
    from qkv import explain as ex

    import qkv.hf.projections  # noqa: F401 (imported on first use by the circuits: seconds, once
    # per process — imports are outside every timed cell, as the peers' are)

    torch.set_num_threads(threads)
    model = qkv.load(model_dir, dtype=None if dtype is None else getattr(torch, dtype))
    text = text_of(model.tokenizer, n)
    ids = torch.tensor([model.tokenizer.encode(text).ids])  # (1, t)
    weights = 0
    with torch.no_grad():
        for p in model.parameters():  # fault the memory-mapped weights in
            weights += p.numel() * p.element_size()
            p.detach().sum()
    base = reset_peak()
    last = ids.shape[1] - 1
    run = {
        "forward": lambda: model(ids, torch.ones_like(ids)),
        "map": lambda: ex.attention_map(model, text, layer=layer, head=head),
        "layer": lambda: ex.attention_maps(model, text, layer=layer),
        "explain": lambda: ex.explain_head(model, text, layer=layer, head=head, token=last),
        "overview": lambda: ex.explain(model, text, token=last),
        "why": lambda: ex.score_attribution(model, text, layer=layer, head=head, token=last, key=0),
        "heads": lambda: ex.heads(model, text, source=last, target=0),
        "document": lambda: ex.document(model, text).weights(layer, head, torch.arange(ids.shape[1])),
    }[task]
    start, cpu = time.perf_counter(), time.process_time()
    with torch.no_grad():
        run()
    took, cpu = time.perf_counter() - start, time.process_time() - cpu
    peak = peak_rss()
    return {"task": task, "tokens": int(ids.shape[1]), "time": took, "cpu": cpu,
            "peak_above": max(0, peak - base), "weights": weights}


def run_cell(model_dir: str, task: str, n: int, layer: int, head: int, threads: int,
             timeout: float, dtype: str | None = None) -> dict:
    """:func:`cell` in a fresh interpreter; {"error": …} when it fails or runs out of time."""
    cmd = [sys.executable, __file__, "cell", "--model", model_dir, "--task", task, "--length", str(n),
           "--layer", str(layer), "--head", str(head), "--threads", str(threads)]
    cmd += ["--dtype", dtype] if dtype else []
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"task": task, "error": f"over {timeout:.0f} s"}
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["?"])[-1]
        return {"task": task, "error": f"exit {done.returncode}: {tail[:160]}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    mk = sub.add_parser("make")
    mk.add_argument("--shape", default="tinyllama")
    mk.add_argument("--out", required=True)
    for name in ("cell", "run"):
        c = sub.add_parser(name)
        c.add_argument("--model", required=True)
        c.add_argument("--length", type=int, default=2048)
        c.add_argument("--layer", type=int, default=None, help="default: the middle layer")
        c.add_argument("--head", type=int, default=3)
        c.add_argument("--threads", type=int, default=1)
        c.add_argument("--dtype", default=None, help="load as this dtype (float32, bfloat16); "
                       "default: as stored")
        if name == "cell":
            c.add_argument("--task", choices=TASKS, required=True)
        else:
            c.add_argument("--tasks", default=",".join(TASKS))
            c.add_argument("--timeout", type=float, default=1800)
    args = p.parse_args()
    if args.command == "make":
        make(args.shape, args.out)
        return
    if args.layer is None:
        with open(os.path.join(args.model, "config.json")) as f:
            cfg = json.load(f)
        args.layer = (cfg.get("num_hidden_layers") or cfg.get("n_layer")) // 2
    if args.command == "cell":
        print(json.dumps(cell(args.model, args.task, args.length, args.layer, args.head, args.threads,
                              args.dtype)))
        return
    print(f"{args.model} ({args.dtype or 'as stored'}): {args.length} tokens, layer {args.layer} head {args.head}, "
          f"{args.threads} thread(s), a fresh interpreter per cell")
    unit = None
    for task in args.tasks.split(","):
        r = run_cell(args.model, task, args.length, args.layer, args.head, args.threads, args.timeout,
                     args.dtype)
        if "error" in r:
            print(f"  {task:9s} {r['error']}")
            continue
        if task == "forward":
            unit = r["cpu"]
        ratio = f"{r['cpu'] / unit:5.2f}x" if unit else "   - "
        print(f"  {task:9s} cpu {r['cpu']:8.2f} s (wall {r['time']:8.2f} s)  {ratio} forward   peak "
              f"{r['peak_above'] / 2**20:8.0f} MiB above the weights ({r['weights'] / 2**30:.2f} GiB, "
              f"{r['tokens']} tokens)", flush=True)


if __name__ == "__main__":
    main()
