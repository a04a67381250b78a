"""The head atlas over a long English corpus: time and peak memory at N tokens (O(N) memory).

For each length N (10k and 100k tokens by default) one child process (so each peak is its own)
runs ``atlas(model, text)`` (:mod:`qkv.explain.atlas`: windows of 512 tokens, every head's
induction, previous-token, entropy, sink share, mean distance, retrieval, top contexts) and
reports the wall time and the peak memory above the loaded model and text (ru_maxrss). The text
is the held-out Python tutorial (``/usr/share/doc/python3.11/html/tutorial``, pages the reader
never trained on) repeated to N tokens; the model is the shipped reader (``lm`` if it is absent).

    python benchmarks/atlas.py                       # 10k and 100k tokens, one thread
    python benchmarks/atlas.py --lengths 10000,50000 --threads 2
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _text(model, n: int) -> str:
    """About ``n`` tokens of English the model never trained on (lm: its own words)."""
    try:
        from qkv.reader.corpus import DEFAULT_DIR, read_corpus

        base = "\n\n".join(read_corpus(DEFAULT_DIR).heldout)
    except Exception:  # noqa: BLE001 — no Python docs here: lm's words
        base = "baka bela dima fona gisa doma feta " * 100
    per = len(model.tokenizer.encode(base, max_length=sys.maxsize).ids)
    text = (base + "\n\n") * (n // per + 1)
    enc = model.tokenizer.encode(text, max_length=sys.maxsize)
    return text[:enc.offsets[min(n, len(enc.ids)) - 1][1]]


def child(n: int, threads: int, model_name: str) -> dict:
    import torch

    torch.set_num_threads(threads)
    import qkv
    from qkv.explain.probes.atlas import atlas

    model = qkv.load(model_name)
    text = _text(model, n)
    base = _rss_mib()
    t0 = time.perf_counter()
    a = atlas(model, text)
    seconds = time.perf_counter() - t0
    best = {m: divmod(int(v.flatten().argmax()), v.shape[1]) + (float(v.max()),)
            for m, v in a.metrics.items()}
    return {"model": a.model, "tokens": a.tokens, "windows": a.windows, "window": a.window,
            "seconds": round(seconds, 1), "peak_above_model_mib": round(_rss_mib() - base, 1),
            "best": best}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", default="10000,100000")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--model", default=None, help="default: reader, else lm")
    p.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.model is None:
        from qkv.models.registry import data_dir

        args.model = "reader" if os.path.isfile(os.path.join(data_dir("reader"), "config.json")) else "lm"
    if args.child is not None:
        print(json.dumps(child(args.child, args.threads, args.model)))
        return
    print(f"{'model':>8} {'N':>8} {'windows':>8} {'time':>8} {'peak above model':>17}  best head per metric")
    for n in (int(x) for x in args.lengths.split(",")):
        out = subprocess.run([sys.executable, __file__, "--child", str(n), "--threads",
                              str(args.threads), "--model", args.model],
                             capture_output=True, text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        best = " · ".join(f"{m} L{l} H{h} {v:.3g}" for m, (l, h, v) in r["best"].items())
        print(f"{r['model']:>8} {r['tokens']:>8,} {r['windows']:>8} {r['seconds']:>7.1f}s "
              f"{r['peak_above_model_mib']:>13.1f} MiB  {best}")


if __name__ == "__main__":
    main()
