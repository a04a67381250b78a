"""Cost of the causal ground truth (qkv.explain.head_effects, qkv.explain.faithfulness).

For each model and probe: ``head_effects`` (every head ablated alone, batched: one copy per head
of every probe sequence in a forward) against ``layers × heads`` *plain* forwards of the same
probe data (``model(ids)``, untraced, unablated) — what ablating the heads one forward at a time
would cost at least. Goal (issue 22): ``head_effects`` ≤ 2× those plain forwards. Rounds are
interleaved so a noisy neighbour slows both alike; reported: medians, the median of the paired
ratios and its interquartile range (how stable it is). A case runs at least ``--rounds`` rounds
and keeps going until ``--seconds`` have passed, so the ~15–30 ms ``lm`` cases get hundreds of
rounds and the ~10 s MiniLM case a few. ``faithfulness`` (every method + the effects, at its
own default of 8 sequences) is timed ``--faithfulness-rounds`` times against the same plain
forwards of *its* sequences, for scale (it has no goal: it runs every method too).

    python benchmarks/faithfulness.py                   # 1 thread
    python benchmarks/faithfulness.py --rounds 3 --seconds 0 --no-faithfulness
    python benchmarks/faithfulness.py --model minilm --rounds 9 --no-faithfulness
    python benchmarks/faithfulness.py --unbatched --no-faithfulness --cpu   # batched vs unbatched

``--unbatched`` adds a line per case: ``head_effects`` batched (one copy per head in a forward)
against the same function with one ablated copy per forward (``MAX_BATCH = 1``: each head's
ablation its own forward over the probe's sequences) — the speed-up of batching over heads.
``--cpu`` times by the process's CPU time instead of wall time (a loaded machine's wall time
measures the others' load).
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
SEQUENCES = 20  # head_effects' default
FAITHFULNESS_SEQUENCES = 8  # faithfulness' default


def plain_forwards(model, task_, count: int) -> None:
    """``count`` unablated forwards of the probe's data, batched by length as head_effects is."""
    lengths = torch.tensor([ids.shape[1] for ids in task_.ids])
    groups = [torch.cat([task_.ids[int(i)] for i in (lengths == t).nonzero().flatten()])
              for t in lengths.unique().tolist()]
    with torch.no_grad():
        for _ in range(count):
            for ids in groups:
                model(ids, torch.ones_like(ids))


CLOCK = time.perf_counter


def timed(fn) -> float:
    start = CLOCK()
    fn()
    return CLOCK() - start


def unbatched(fn):
    """``fn`` run with one ablated copy per forward (head_effects' ``MAX_BATCH`` = 1)."""
    from qkv.explain.causal import head_effects as module

    def run():
        kept, module.MAX_BATCH = module.MAX_BATCH, 1
        try:
            fn()
        finally:
            module.MAX_BATCH = kept
    return run


def paired(fa, fb, *, rounds: int, seconds: float) -> tuple[list[float], list[float]]:
    """Times of ``fa`` and ``fb``, interleaved (which runs first alternates), for at least
    ``rounds`` rounds and ``seconds`` seconds."""
    a_times, b_times = [], []
    start = time.perf_counter()
    while len(a_times) < rounds or time.perf_counter() - start < seconds:
        if len(a_times) % 2 == 0:
            a, b = timed(fa), timed(fb)
        else:
            b, a = timed(fb), timed(fa)
        a_times.append(a)
        b_times.append(b)
    return a_times, b_times


def quartiles(xs: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
    return q[0], statistics.median(xs), q[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="at least this many rounds a case")
    parser.add_argument("--seconds", type=float, default=20.0, help="and at least this long a case")
    parser.add_argument("--faithfulness-rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--mode", default="zero", choices=("zero", "mean"))
    parser.add_argument("--no-faithfulness", action="store_true")
    parser.add_argument("--unbatched", action="store_true",
                        help="also time head_effects with one ablated copy per forward")
    parser.add_argument("--cpu", action="store_true", help="CPU time of the process, not wall time")
    parser.add_argument("--model", choices=sorted({m for m, _ in CASES}), default=None,
                        help="only this model's cases")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    global CLOCK
    CLOCK = time.process_time if args.cpu else time.perf_counter

    import qkv
    from qkv.explain.causal.faithfulness import faithfulness
    from qkv.explain.causal.head_effects import head_effects, task

    print(f"threads {args.threads}, {args.rounds} rounds, {args.mode} ablation; goal: "
          f"head_effects ≤ 2.0× (layers × heads) plain forwards")
    print(f"{'model':8} {'probe':15} {'what':13} {'L×h':>4} {'rounds':>6} {'time s':>9} "
          f"{'plain s':>9} {'ratio':>6} {'ratio IQR':>12}   (vs unbatched: plain s = unbatched)")

    def line(name, probe, what, heads, a, b):
        lo, mid, hi = quartiles([x / y for x, y in zip(a, b)])
        print(f"{name:8} {probe:15} {what:13} {heads:>4} {len(a):>6} {statistics.median(a):>9.4f} "
              f"{statistics.median(b):>9.4f} {mid:>6.2f} {lo:>5.2f}–{hi:<5.2f}", flush=True)

    for name, probe in CASES:
        if args.model not in (None, name):
            continue
        model = qkv.load(name)
        heads = len(model.layers) * model.layers[0].self_attn.num_heads
        task_ = task(model, probe, sequences=SEQUENCES, length=None, seed=0)
        a, b = paired(lambda: head_effects(model, probe, mode=args.mode, sequences=SEQUENCES),
                      lambda: plain_forwards(model, task_, heads),
                      rounds=args.rounds, seconds=args.seconds)
        line(name, probe, "head_effects", heads, a, b)
        if args.unbatched:
            batched = lambda: head_effects(model, probe, mode=args.mode, sequences=SEQUENCES)  # noqa: E731
            a, b = paired(batched, unbatched(batched), rounds=args.rounds, seconds=args.seconds)
            line(name, probe, "vs unbatched", heads, a, b)
        if not args.no_faithfulness:
            own = task(model, probe, sequences=FAITHFULNESS_SEQUENCES, length=None, seed=0)
            a, b = paired(lambda: faithfulness(model, probe, mode=args.mode,
                                               sequences=FAITHFULNESS_SEQUENCES),
                          lambda: plain_forwards(model, own, heads),
                          rounds=args.faithfulness_rounds, seconds=0)
            line(name, probe, "faithfulness", heads, a, b)


if __name__ == "__main__":
    main()
