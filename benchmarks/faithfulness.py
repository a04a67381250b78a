"""Cost of the causal ground truth (qkv.explain.head_effects, qkv.explain.faithfulness).

For each model and probe: ``head_effects`` (every head ablated alone, batched: one copy per head
of every probe sequence in a forward) against ``layers × heads`` *plain* forwards of the same
probe data (``model(ids)``, untraced, unablated) — what ablating the heads one forward at a time
would cost at least. Goal (issue 22): ``head_effects`` ≤ 2× those plain forwards. Rounds are
interleaved so a noisy neighbour slows both alike; reported: medians and the median of the
paired ratios. ``faithfulness`` (all methods + the effects) is timed once per model, for scale.

    python benchmarks/faithfulness.py                   # 5 rounds, 1 thread
    python benchmarks/faithfulness.py --rounds 3 --no-faithfulness
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch

CASES = (("lm", "induction"), ("lm", "previous-token"), ("minilm", "coref"))
SEQUENCES = 20  # the probes' default


def plain_forwards(model, task_, count: int) -> None:
    """``count`` unablated forwards of the probe's data, batched by length as head_effects is."""
    lengths = torch.tensor([ids.shape[1] for ids in task_.ids])
    groups = [torch.cat([task_.ids[int(i)] for i in (lengths == t).nonzero().flatten()])
              for t in lengths.unique().tolist()]
    with torch.no_grad():
        for _ in range(count):
            for ids in groups:
                model(ids, torch.ones_like(ids))


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--mode", default="zero", choices=("zero", "mean"))
    parser.add_argument("--no-faithfulness", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    import qkv
    from qkv.explain.faithfulness import faithfulness
    from qkv.explain.head_effects import head_effects, task

    print(f"threads {args.threads}, {args.rounds} rounds, {args.mode} ablation; goal: "
          f"head_effects ≤ 2.0× (layers × heads) plain forwards")
    print(f"{'model':8} {'probe':15} {'L×h':>4} {'effects s':>10} {'plain s':>9} {'ratio':>6}")
    for name, probe in CASES:
        model = qkv.load(name)
        heads = len(model.layers) * model.layers[0].self_attn.num_heads
        task_ = task(model, probe, sequences=SEQUENCES, length=None, seed=0)
        effects, plain, ratios = [], [], []
        for r in range(args.rounds):
            pair = [lambda: head_effects(model, probe, mode=args.mode, sequences=SEQUENCES),
                    lambda: plain_forwards(model, task_, heads)]
            a, b = (timed(f) for f in (pair if r % 2 == 0 else pair[::-1]))
            if r % 2:
                a, b = b, a
            effects.append(a)
            plain.append(b)
            ratios.append(a / b)
        print(f"{name:8} {probe:15} {heads:>4} {statistics.median(effects):>10.3f} "
              f"{statistics.median(plain):>9.3f} {statistics.median(ratios):>6.2f}")
        if not args.no_faithfulness:
            seconds = timed(lambda: faithfulness(model, probe, mode=args.mode))
            print(f"{'':8} {'faithfulness':15} {'':>4} {seconds:>10.1f} s (every method + effects)")


if __name__ == "__main__":
    main()
