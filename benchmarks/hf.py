"""A transformers model through attn_implementation="qkv" vs "sdpa": whole-model forward.

A Mistral-shaped random model (4 layers, hidden 512, 8 query / 2 key-value heads, head dim 64,
fp32, batch 1), built from a config — nothing downloaded. Two cases:

    512     full causal attention, 512 tokens: qkv hands plain causality to torch's own causal
            kernel, so the goal is parity (≥ 0.95× sdpa's speed)
    window  16k tokens, sliding window 512 (every layer): transformers' sdpa draws the
            (N × N) mask and computes every score; qkv receives the window as structure and runs
            blockwise over the band (goal ≥ 5× faster, ≤ 1/10 the peak memory)

Each (case, implementation) runs in a fresh subprocess so its peak RSS is its own; ``extra MB`` is
that peak above the process's RSS after building the model and inputs. Times: median of
``--rounds`` forwards after one warm-up. The ratio is sdpa's median / qkv's (> 1: qkv faster).

    python benchmarks/hf.py --threads 1                  # both cases (a few minutes)
    python benchmarks/hf.py --threads 1 --long 8192      # a shorter long case
    python benchmarks/hf.py --threads 1 --explain 1024   # explain one token vs one forward only

``--explain N`` (issue 19's third goal, ≤ 1.5×): the same model saved with a word-level tokenizer
and loaded by ``qkv.load(dir, via="hf")`` (the transformers model behind qkv's protocol);
``qkv.explain.explain`` of the last token of an N-token text (one traced forward: that row of
every layer and head on the reference path, everything else on the kernel, plus the ranking)
against one plain forward of the transformers model on ``"qkv"`` (``logits_to_keep=1``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def one(case: str, impl: str, n: int, rounds: int, threads: int) -> dict:
    import transformers

    import qkv.hf  # noqa: F401 — registers "qkv"

    torch.set_num_threads(threads)
    window = 512 if case == "window" else None
    config = transformers.MistralConfig(
        vocab_size=1000, hidden_size=512, intermediate_size=1024, num_hidden_layers=4,
        num_attention_heads=8, num_key_value_heads=2, head_dim=64, sliding_window=window,
        max_position_embeddings=n)
    torch.manual_seed(0)
    model = transformers.MistralForCausalLM._from_config(config, attn_implementation=impl).eval()
    ids = torch.randint(0, 1000, (1, n))
    base = rss_mb()
    times = []
    with torch.no_grad():
        for r in range(rounds + 1):
            start = time.perf_counter()
            model(input_ids=ids, logits_to_keep=1)
            if r:
                times.append(time.perf_counter() - start)
    return dict(case=case, impl=impl, n=n, median_s=statistics.median(times),
                extra_mb=max(0.0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - base))


def explain_case(n: int, rounds: int, threads: int) -> dict:
    """Median seconds of explaining the last token of an n-token text vs one forward."""
    import tempfile

    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    import qkv
    import qkv.explain

    torch.set_num_threads(threads)
    config = transformers.MistralConfig(
        vocab_size=1000, hidden_size=512, intermediate_size=1024, num_hidden_layers=4,
        num_attention_heads=8, num_key_value_heads=2, head_dim=64, max_position_embeddings=n)
    torch.manual_seed(0)
    words = [f"w{i}" for i in range(999)]
    with tempfile.TemporaryDirectory() as d:
        transformers.MistralForCausalLM._from_config(config).save_pretrained(d)
        tok = Tokenizer(models.WordLevel({"[UNK]": 0} | {w: i + 1 for i, w in enumerate(words)},
                                         unk_token="[UNK]"))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        tok.save(os.path.join(d, "tokenizer.json"))
        model = qkv.load(d, via="hf")
    text = " ".join(words[int(i)] for i in torch.randint(0, 999, (n,)))
    ids = torch.tensor([model.tokenizer.encode(text).ids])
    timed = {"forward": lambda: model.hf(input_ids=ids, logits_to_keep=1),
             "explain": lambda: qkv.explain.explain(model, text, token=str(n - 1))}
    got = {}
    with torch.no_grad():
        for name, run in timed.items():
            times = []
            for r in range(rounds + 1):
                start = time.perf_counter()
                run()
                if r:
                    times.append(time.perf_counter() - start)
            got[name] = statistics.median(times)
    return dict(n=n, forward_s=got["forward"], explain_s=got["explain"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--long", type=int, default=16384, help="tokens of the sliding-window case")
    p.add_argument("--explain", type=int, default=1024,
                   help="tokens of the explain-one-token case (0: skip it)")
    p.add_argument("--only-explain", action="store_true", help="run only the explain case")
    p.add_argument("--one", nargs=3, help=argparse.SUPPRESS)  # case impl n: the child process
    a = p.parse_args()
    if a.one:
        case, impl, n = a.one
        print(json.dumps(one(case, impl, int(n), a.rounds, a.threads)))
        return
    print(f"torch {torch.__version__}, {a.threads} thread(s), Mistral-shaped 4 layers, fp32, batch 1")
    print(f"{'case':8} {'tokens':>7} {'impl':5} {'median s':>9} {'extra MB':>9}")
    for case, n in (() if a.only_explain else (("512", 512), ("window", a.long))):
        got = {}
        for impl in ("sdpa", "qkv"):
            out = subprocess.run([sys.executable, __file__, "--threads", str(a.threads), "--rounds",
                                  str(a.rounds), "--one", case, impl, str(n)],
                                 capture_output=True, text=True, check=True, timeout=3600)
            got[impl] = json.loads(out.stdout.strip().splitlines()[-1])
            r = got[impl]
            print(f"{case:8} {n:7} {impl:5} {r['median_s']:9.3f} {r['extra_mb']:9.0f}")
        speed = got["sdpa"]["median_s"] / got["qkv"]["median_s"]
        memory = got["qkv"]["extra_mb"] / max(got["sdpa"]["extra_mb"], 1e-9)
        print(f"{case:8} {n:7} ratio: qkv {speed:.2f}× sdpa's speed, {memory:.3f}× its extra peak memory")
    if a.explain:
        r = explain_case(a.explain, a.rounds, a.threads)
        print(f"explain  {r['n']:7} one forward {r['forward_s']:.3f} s, explain one token "
              f"{r['explain_s']:.3f} s: {r['explain_s'] / r['forward_s']:.2f}× a forward (goal ≤ 1.5×)")


if __name__ == "__main__":
    main()
