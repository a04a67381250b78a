"""Score attribution (qkv.explain.score_attribution) against the model's own forward.

* one score: ``score_attribution(model, text, layer, head, token, key)`` against one untraced
  forward of the same text (median of ``--repeats`` paired rounds; ratio = attribution / forward),
  on MiniLM (post-norm, 6 × 12 heads: 80 components) and the shipped ``lm`` and ``reader``;
* a whole row of a long document: ``score_attribution(..., key=None)`` (every key the head scores,
  each split over the key-side components, in position chunks: O(N · C) memory) on the shipped
  ``reader`` (a Mistral: 4 layers × 4 heads, window 128) at ``--length`` tokens, against its
  forward; the growth of the peak RSS (ru_maxrss) during the row, over the forward's.

Goals (issue 29): one attribution ≤ 3× a forward; a row of a 16k document ≤ 10× its forward,
memory O(N).

    python benchmarks/why.py                       # --length 16384 --repeats 5
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


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--length", type=int, default=16384)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("one score attribution against one forward (median of paired rounds)")
    for name, text, where in (
            ("minilm", SENTENCE, dict(layer=3, head=1, token="it", key="pizza")),
            ("lm", LM_TEXT, dict(layer=1, head=0, token=7, key=4)),
            ("reader", PROSE, dict(layer=3, head=0, token=40, key=20))):
        model = qkv.load(name)
        t = len(model.tokenizer.encode(text).ids)
        f, a, r = paired(model, text, args.repeats, **where)
        print(f"  {name:7s} {t:3d} tokens: forward {f * 1e3:7.2f} ms, attribution {a * 1e3:7.2f} ms "
              f"→ {r:.2f}×")
    reader = qkv.load("reader")
    ids = reader.tokenizer.encode(PROSE * (args.length // 30)).ids[:args.length]
    text = reader.tokenizer.decode(ids)
    n = len(reader.tokenizer.encode(text).ids)
    tokens = torch.tensor([reader.tokenizer.encode(text).ids])
    with torch.no_grad():
        start = time.perf_counter()
        reader(tokens, torch.ones_like(tokens))
        forward = time.perf_counter() - start
        before = rss_mb()
        start = time.perf_counter()
        row = score_attribution(reader, text, layer=3, head=0, token=n - 1)
        spent = time.perf_counter() - start
    print(f"a whole row on reader at {n} tokens (layer 3 head 0, the last token; "
          f"{len(row.keys)} keys scored, {len(row.key_components)} components)")
    print(f"  forward {forward:.2f} s, row {spent:.2f} s → {spent / forward:.2f}×; peak RSS "
          f"{before:.0f} MiB after the forward, {rss_mb():.0f} MiB after the row; "
          f"max |Σ terms − score| {float((row.terms.sum(1) - row.scores).abs().max()):.2g} "
          f"≤ bound {row.bound:.2g}")


if __name__ == "__main__":
    main()
