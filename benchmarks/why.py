"""Score attribution (qkv.explain.score_attribution) against the model's own forward.

* one score: ``score_attribution(model, text, layer, head, token, key)`` against one untraced
  forward of the same text (median of ``--repeats`` paired rounds; ratio = attribution / forward),
  on MiniLM (post-norm, 6 × 12 heads: 80 components) and the shipped ``lm`` and ``reader``;
* a whole row of a long document: ``score_attribution(..., key=None)`` (every key the head scores,
  each split over the key-side components, in position chunks: O(N · C) memory) on the shipped
  ``reader`` (a Mistral: 4 layers × 4 heads, window 128) at ``--length`` tokens, and on a
  random-weight causal Llama with no window (4 layers × 8 heads, d_model 256, the lm's byte
  tokenizer) so the last token's row holds every key, each against its forward; the growth of the
  peak RSS (ru_maxrss) during the row, over the forward's.

Goals (issue 29): one attribution ≤ 3× a forward; a row of a 16k document ≤ 10× its forward,
memory O(N).

    python benchmarks/why.py                       # --length 16384 --repeats 5
    python benchmarks/why.py --cpu-min             # issue 42: CPU-time minima, one thread

``--phases``: each one-score attribution split by phase (the forward through the asked layer,
the stream, the query and key, tokenising, the checks), CPU-time minima and ATen operations.

``--cpu-min`` (issue 42, goal ≤ 2× a forward on every shipped model): the one-score rows only,
each as the minimum of ``--calls`` calls' CPU time (``time.process_time``, one torch thread),
forward and attribution in rounds of 5 — a minimum is what a loaded machine distorts least
(wall-time medians swing 2–25× there) — and the number of ATen operations each runs (no load
distorts it: the fixed per-call work of a small model is mostly their count).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time

import torch

import qkv
from qkv.explain import score_attribution

SENTENCE = "The dog found some pizza next to the baby and ate it"
LM_TEXT = "baka bela dima fona baka bela dima fona"
PROSE = ("The interpreter reads a module once, compiles it to bytecode and keeps the result in a "
         "cache so that the next import is faster. A function is an object like any other: it "
         "can be passed to another function, returned from one, and stored in a list. ")


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def paired(model, text: str, repeats: int, **where) -> tuple[float, float, float]:
    ids = torch.tensor([model.tokenizer.encode(text).ids])
    forward = lambda: model(ids, torch.ones_like(ids))  # noqa: E731
    attribution = lambda: score_attribution(model, text, **where)  # noqa: E731
    with torch.no_grad():
        forward(), attribution()  # warm
        ratios, fs, as_ = [], [], []
        for _ in range(repeats):
            f, a = timed(forward, 1), timed(attribution, 1)
            fs.append(f), as_.append(a), ratios.append(a / f)
    return statistics.median(fs), statistics.median(as_), statistics.median(ratios)


ONE_SCORE = (("minilm", SENTENCE, dict(layer=3, head=1, token="it", key="pizza")),
             ("lm", LM_TEXT, dict(layer=1, head=0, token=7, key=4)),
             ("reader", PROSE, dict(layer=3, head=0, token=40, key=20)))


def cpu_min(fn, calls: int) -> float:
    """The least CPU time (s) of `calls` calls of `fn`."""
    best = float("inf")
    for _ in range(calls):
        start = time.process_time()
        fn()
        best = min(best, time.process_time() - start)
    return best


class OpCount:
    """Counts the ATen operations run inside it (a load-independent measure of per-call work)."""

    def __enter__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        counter = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                counter.ops += 1
                return func(*args, **(kwargs or {}))

        self.ops, self.mode = 0, Mode()
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        self.mode.__exit__(*exc)


def ops_of(fn) -> int:
    with OpCount() as count:
        fn()
    return count.ops


def cpu_minima(calls: int) -> None:
    """One attribution against one forward on each shipped model: CPU-time minima."""
    print(f"one score attribution against one forward (CPU-time minima of {calls} calls each)")
    for name, text, where in ONE_SCORE:
        model = qkv.load(name)
        ids = torch.tensor([model.tokenizer.encode(text).ids])
        forward = lambda: model(ids, torch.ones_like(ids))  # noqa: E731
        attribution = lambda: score_attribution(model, text, **where)  # noqa: E731
        with torch.no_grad():
            forward(), attribution()  # warm: the float64 weights are converted once
            rounds = max(1, calls // 5)
            f = min(cpu_min(forward, 5) for _ in range(rounds))
            a = min(cpu_min(attribution, 5) for _ in range(rounds))
            nf, na = ops_of(forward), ops_of(attribution)
        print(f"  {name:7s} {ids.shape[1]:3d} tokens: forward {f * 1e3:7.2f} ms, attribution "
              f"{a * 1e3:7.2f} ms → {a / f:.2f}×; torch ops {nf} and {na} → {na / nf:.2f}×", flush=True)


# score_attribution's phases, as `--phases` times and counts them: the names `qkv.explain.circuits.
# score` calls, each wrapped where it is looked up (the rest — argument checks, picking the token
# and key, the terms and the bound — is the total less these)
PHASES = ("_forward", "stream", "_query_and_key", "encode", "_checked", "_pair_bound")


def phases(calls: int) -> None:
    """Each shipped model's attribution by phase: the least CPU time of each over `calls` calls,
    and the ATen operations it runs."""
    import qkv.explain.circuits.score as score

    spent: dict[str, float] = {}
    counting: list[OpCount | None] = [None]

    def timed_phase(name, fn):
        def phase(*args, **kwargs):
            if counting[0] is not None:  # count this phase's operations apart from the rest
                counting[0].mode.__exit__(None, None, None)
                with OpCount() as inner:
                    out = fn(*args, **kwargs)
                counting[0].mode.__enter__()
                counts[name] = counts.get(name, 0) + inner.ops
                return out
            start = time.process_time()
            out = fn(*args, **kwargs)
            spent[name] = spent.get(name, 0.0) + time.process_time() - start
            return out
        return phase

    originals = {name: getattr(score, name) for name in PHASES}
    for name, fn in originals.items():
        setattr(score, name, timed_phase(name, fn))
    try:
        for model_name, text, where in ONE_SCORE:
            model = qkv.load(model_name)
            best, total, counts = {name: float("inf") for name in PHASES}, float("inf"), {}
            with torch.no_grad():
                score_attribution(model, text, **where)  # warm
                for _ in range(calls):
                    spent.clear()
                    start = time.process_time()
                    score_attribution(model, text, **where)
                    total = min(total, time.process_time() - start)
                    for name in PHASES:
                        best[name] = min(best[name], spent.get(name, 0.0))
                with OpCount() as whole:
                    counting[0] = whole
                    score_attribution(model, text, **where)
                counting[0] = None
            rest_ops = whole.ops
            print(f"  {model_name}: attribution {total * 1e3:.2f} ms (least of {calls}), "
                  f"{whole.ops + sum(counts.values())} ops")
            for name in PHASES:
                print(f"    {name:15s} {best[name] * 1e3:6.3f} ms  {counts.get(name, 0):4d} ops")
            print(f"    {'the rest':15s} {(total - sum(best.values())) * 1e3:6.3f} ms  {rest_ops:4d} ops")
    finally:
        for name, fn in originals.items():
            setattr(score, name, fn)


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--length", type=int, default=16384)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--cpu-min", action="store_true",
                   help="only the one-score rows, as CPU-time minima (issue 42)")
    p.add_argument("--calls", type=int, default=20, help="calls per minimum with --cpu-min")
    p.add_argument("--phases", action="store_true",
                   help="each one-score attribution by phase: CPU-time minima and ATen operations")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    if args.cpu_min:
        cpu_minima(args.calls)
        return
    if args.phases:
        phases(args.calls)
        return
    print("one score attribution against one forward (median of paired rounds)")
    for name, text, where in ONE_SCORE:
        model = qkv.load(name)
        t = len(model.tokenizer.encode(text).ids)
        f, a, r = paired(model, text, args.repeats, **where)
        print(f"  {name:7s} {t:3d} tokens: forward {f * 1e3:7.2f} ms, attribution {a * 1e3:7.2f} ms "
              f"→ {r:.2f}×")
    reader = qkv.load("reader")
    row(reader, "reader", PROSE, args.length)
    from qkv.models.llama import LlamaConfig, LlamaModel

    lm = qkv.load("lm")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=lm.config.vocab_size, hidden_size=256, intermediate_size=1024,
                         num_hidden_layers=4, num_attention_heads=8,
                         max_position_embeddings=args.length + 8)
    from qkv.models.tokenizer import Tokenizer

    tokenizer = Tokenizer(lm.tokenizer._tok, name="llama-4x256", max_length=args.length + 8)
    causal = LlamaModel(config, tokenizer=tokenizer, name="llama-4x256 (random)").eval()
    row(causal, "llama-4x256 (random, causal)", LM_TEXT + " ", args.length)


def row(model, name: str, unit: str, length: int) -> None:
    """The last token's whole row at ``length`` tokens against one forward of the same text."""
    per = len(model.tokenizer.encode(unit).ids)
    ids = model.tokenizer.encode(unit * (length // per + 2)).ids
    text = model.tokenizer.decode(ids[:length])
    tokens = torch.tensor([model.tokenizer.encode(text).ids[:length]])
    text = model.tokenizer.decode(tokens[0].tolist())
    tokens = torch.tensor([model.tokenizer.encode(text).ids])
    n = tokens.shape[1]
    layer = len(model.layers) - 1
    with torch.no_grad():
        start = time.perf_counter()
        model(tokens, torch.ones_like(tokens))
        forward = time.perf_counter() - start
        before = rss_mb()
        start = time.perf_counter()
        r = score_attribution(model, text, layer=layer, head=0, token=n - 1)
        spent = time.perf_counter() - start
    print(f"a whole row on {name} at {n} tokens (layer {layer} head 0, the last token; "
          f"{len(r.keys)} keys scored, {len(r.key_components)} components)")
    print(f"  forward {forward:.2f} s, row {spent:.2f} s → {spent / forward:.2f}×; peak RSS "
          f"{before:.0f} MiB after the forward, {rss_mb():.0f} MiB after the row; "
          f"max |Σ terms − score| {float((r.terms.sum(1) - r.scores).abs().max()):.2g} "
          f"≤ bound {r.bound:.2g}")

if __name__ == "__main__":
    main()
