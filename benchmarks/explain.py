"""Cost of the contribution methods (qkv.explain.contributions) against today's overview.

One token (position 100) of a 128-token text on all-MiniLM-L6-v2, fp32: each method runs
through ``qkv.explain.explain(model, text, token=..., method=M)`` — the same call ``qkv explain
TEXT --token W --method M`` makes — and is timed against ``method="weight"`` (today's overview)
in the same round; rounds are interleaved (the order rotating) so a noisy neighbour slows all
alike. Reported: median seconds, and the median over rounds of the paired ratio
``method / overview``. ``value-zeroing`` is also compared with one plain (untraced) forward of a
batch of t + 1 copies of the text — the "t + 1 forwards, batched" it should not exceed.

Memory: the numbers each method keeps for the token (its scores), and what it holds at its
peak per layer (a per-token method: O(L·h·t); rollout / ALTI / value zeroing / grad: a (t × t)
matrix per layer, which they need because row i of R^ℓ reads all of R^{ℓ−1}).

Targets (issue 12): norm ≤ 1.3× the overview, rollout and alti ≤ 2×, value-zeroing ≤ the
batched t + 1 forwards.

    python benchmarks/explain.py                 # 7 rounds, 1 thread
    python benchmarks/explain.py --rounds 3 --threads 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch

from qkv.explain.contributions import METHODS as ALL_METHODS
from qkv.explain.contributions.flow import MAX_TOKENS as FLOW_MAX_TOKENS

WORDS = """the dog found some pizza next to the baby and ate it while a cat watched from the
window because nobody had fed her since the morning when the family left for the station and
the train was late so they waited in the rain with an old umbrella that did not open""".split()
TOKENS = 128
TOKEN = 100
TARGETS = {"norm": 1.3, "rollout": 2.0, "alti": 2.0}
# flow refuses texts over FLOW_MAX_TOKENS tokens; its cost is measured apart (RESULTS.md)
METHODS = tuple(m for m in ALL_METHODS if m != "flow" or TOKENS <= FLOW_MAX_TOKENS)


def text_of(model, n: int) -> str:
    """A text of exactly ``n`` tokens ([CLS] and [SEP] included)."""
    words = []
    while len(model.tokenizer.encode(" ".join(words)).ids) < n:
        words.append(WORDS[len(words) % len(WORDS)])
    while len(model.tokenizer.encode(" ".join(words)).ids) > n:
        words.pop()
    return " ".join(words)


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    import qkv
    from qkv.explain import explain
    from qkv.explain.contributions import scores

    model = qkv.load("minilm")
    text = text_of(model, TOKENS)
    ids = torch.tensor([model.tokenizer.encode(text).ids])
    t = ids.shape[1]
    token = str(TOKEN)
    target = "a dog ate the pizza"
    calls = {m: (lambda m=m: explain(model, text, token=token, method=m,
                                     target_text=target if m == "grad" else None))
             for m in METHODS}
    batch = ids.expand(t + 1, -1)

    def batched_forwards():
        with torch.no_grad():
            model(batch, torch.ones_like(batch))

    calls["t+1 forwards (one batch)"] = batched_forwards
    names = list(calls)
    for fn in calls.values():  # warm up
        fn()
    times = {n: [] for n in names}
    for r in range(args.rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        for n in order:
            times[n].append(timed(calls[n]))

    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); all-MiniLM-L6-v2, "
          f"t = {t} tokens, token {TOKEN}; {args.rounds} interleaved rounds; shared 2-core machine")
    print(f"{'method':<26}{'median s':>10}{'× overview':>12}   target")
    base = times["weight"]
    for n in names:
        ratio = statistics.median(a / b for a, b in zip(times[n], base))
        if n in TARGETS:
            goal = f"≤ {TARGETS[n]}×: {'met' if ratio <= TARGETS[n] else 'NOT met'}"
        elif n == "value-zeroing":
            vz = statistics.median(a / b for a, b in zip(times[n], times["t+1 forwards (one batch)"]))
            goal = f"≤ t+1 batched forwards: {vz:.2f}× of them, {'met' if vz <= 1 else 'NOT met'}"
        else:
            goal = ""
        print(f"{n:<26}{statistics.median(times[n]):>10.4f}{ratio:>12.2f}   {goal}")

    L, h = len(model.layers), model.layers[0].self_attn.num_heads
    E = model.layers[0].self_attn.embed_dim
    print("\nmemory (numbers kept for the token; peak per layer while computing)")
    for m in METHODS:
        with torch.no_grad() if m != "grad" else torch.enable_grad():
            s = scores(model, ids, torch.tensor([TOKEN]), method=m,
                       target_text=target if m == "grad" else None)
        kept = s.scores.numel() + (s.layer_scores.numel() if s.layer_scores is not None else 0)
        peak = {"weight": f"h·t = {h * t:,} weights per layer (the traced row)",
                "norm": f"h·t·E = {h * t * E:,} (f^h(h_j) for every key, one layer at a time)",
                "rollout": f"h·t² = {h * t * t:,} weights per layer, t² = {t * t:,} kept per layer",
                "alti": f"≤ 2**20 of the t²·E = {t * t * E:,} T_i(x_j) at a time (chunks of rows), t² kept per layer",
                "value-zeroing": f"(t+1)·t·E = {(t + 1) * t * E:,} per layer (one forward of t + 1 copies), t² kept",
                "grad": f"h·t² = {h * t * t:,} per layer (weights and ∂y/∂A), t² kept per layer"}[m]
        print(f"  {m:<14} kept {kept:>7,} = {tuple(s.scores.shape)}; peak {peak}")
    print(f"  (L = {L}, h = {h}, t = {t}, E = {E}: O(L·h·t) = {L * h * t:,}; O(L·h·t²) = {L * h * t * t:,})")


if __name__ == "__main__":
    main()
