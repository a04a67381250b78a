"""The shipped reader on long English: one document at N tokens, and every head's sinks and spans.

For each length N (10k and 100k tokens by default) one child process (so each peak is its own):

* ``document(reader, text)``: the one recorded forward (time, and peak memory above the loaded
  model, ru_maxrss) — the reader's sliding window makes it O(N) in time and memory;
* ``head_spans(doc)``: every head's sink share and mean attention distance (one float64 sweep per
  layer, :mod:`qkv.explain.document_heads`).

The text is the held-out Python tutorial (``/usr/share/doc/python3.11/html/tutorial``, the pages
the reader never trained on) repeated to N tokens.

    python benchmarks/reader.py                      # 10k and 100k tokens, one thread
    python benchmarks/reader.py --lengths 10000,50000 --threads 2
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


def child(n: int, threads: int) -> dict:
    import torch

    torch.set_num_threads(threads)
    import qkv
    from qkv.explain.long.document import document
    from qkv.explain.long.document_heads import head_spans
    from pathlib import Path

    from qkv.reader.corpus import DEFAULT_DIR, HELD_OUT, page_text

    model = qkv.load("reader")
    pages = sorted((Path(DEFAULT_DIR) / HELD_OUT[0]).glob("*.html"))
    tutorial = "\n\n".join(page_text(p.read_text(encoding="utf-8")) for p in pages)
    per = len(model.tokenizer.encode(tutorial, max_length=sys.maxsize).ids)
    text = (tutorial + "\n\n") * (n // per + 1)
    ids = model.tokenizer.encode(text, max_length=sys.maxsize).ids
    text = model.tokenizer._tok.decode(ids[1:n])  # about n tokens
    base = _rss_mib()
    t0 = time.perf_counter()
    doc = document(model, text)
    t_doc = time.perf_counter() - t0
    t0 = time.perf_counter()
    spans = head_spans(doc)
    t_spans = time.perf_counter() - t0
    top_sink, top_dist = spans.ranked("sink")[0], spans.ranked("distance")[0]
    return {"tokens": len(doc), "document_s": round(t_doc, 2), "head_spans_s": round(t_spans, 2),
            "peak_above_model_mib": round(_rss_mib() - base, 1), "record_mib": round(doc.nbytes / 2**20, 1),
            "top_sink": top_sink, "top_distance": top_dist}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", default="10000,100000")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.child, args.threads)))
        return
    print(f"{'N':>8} {'document':>9} {'head_spans':>11} {'peak above model':>17} {'record':>8}  "
          f"top sink head · top distance head")
    for n in (int(x) for x in args.lengths.split(",")):
        out = subprocess.run([sys.executable, __file__, "--child", str(n), "--threads", str(args.threads)],
                             capture_output=True, text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        (sl, sh, sv), (dl, dh, dv) = r["top_sink"], r["top_distance"]
        print(f"{r['tokens']:>8,} {r['document_s']:>8.2f}s {r['head_spans_s']:>10.2f}s "
              f"{r['peak_above_model_mib']:>13.1f} MiB {r['record_mib']:>4.1f} MiB  "
              f"L{sl} H{sh} {sv:.3f} · L{dl} H{dh} {dv:.1f} tokens")


if __name__ == "__main__":
    main()
