"""Long texts explained at O(N) memory (qkv.explain.document) against an untraced forward and
transformers eager with ``output_attentions``.

Random-weight models (built by transformers, saved, loaded by ``qkv.load``; a byte-level BPE of
300 tokens trained here, so the vocabulary is small — attention does not depend on it):

* ``llama-4x256``: 4 layers, 8 heads, d_model 256 (head dim 32), MLP 1024;
* ``smollm-135m``: SmolLM-135M's shape — 30 layers, 9 heads, 3 key/value heads, d_model 576,
  MLP 1536.

For each length N (8k, 32k, and what ``--lengths`` adds) one child process per measurement:

* ``doc``: ``document(model, text)`` (first pass) and one untraced forward, paired in rounds
  (ratio = first pass / forward); then the token switch (``doc.explain(token=i)`` for 9 tokens
  spread over the text: median and max), ``doc.received`` and ``doc.block_map(block=128)`` of the
  last layer's head 0; peak memory above the loaded model (ru_maxrss);
* ``eager``: transformers eager with ``output_attentions=True`` (time, peak memory above the
  model), or why it cannot run (its L × h × N² attention tensors are estimated first).

Goals (issue 20): first pass ≤ 1.5× a forward, token switch ≤ 200 ms at 8k, received and
block_map ≤ 2 s at 8k, memory O(N).

    python benchmarks/long_explain.py                                   # llama-4x256 at 8k, 32k
    python benchmarks/long_explain.py --shapes llama-4x256,smollm-135m --lengths 8192,32768,65536
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

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch

SHAPES = {
    "llama-4x256": dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
                        num_attention_heads=8, num_key_value_heads=8),
    "smollm-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                        num_attention_heads=9, num_key_value_heads=3),
}
SENTENCES = ["The quick brown fox jumps over the lazy dog.", "Attention is all you need, said the paper.",
             "Queries, keys and values: the model attends to every earlier token.",
             "A long book has many chapters, and each chapter many words."]


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def available_mb() -> float:
    from qkv.explain.long.document import available_bytes

    return (available_bytes() or 0) / 2**20


def build(shape: str, directory: str, max_len: int) -> str:
    """A random-weight checkpoint of ``shape`` with a small BPE tokenizer, saved in ``directory``."""
    import transformers
    from tokenizers import ByteLevelBPETokenizer

    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(SENTENCES * 3, vocab_size=300, min_frequency=1, special_tokens=["<s>", "</s>"])
    tok.save(os.path.join(directory, "tokenizer.json"))
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=300, max_position_embeddings=max_len,
                                      bos_token_id=None, eos_token_id=None, pad_token_id=None,
                                      **SHAPES[shape])
    transformers.LlamaForCausalLM(config).save_pretrained(directory)
    return directory


def text_of(model, n: int) -> str:
    """A text of about ``n`` tokens (sentences repeated, then cut at a sentence)."""
    one = " ".join(SENTENCES) + " "
    per = len(model.tokenizer.encode(one).ids)
    text = one * (n // per)
    words = one.split()
    i = 0
    while len(model.tokenizer.encode(text + words[i % len(words)]).ids) <= n and i < 200:
        text += words[i % len(words)] + " "
        i += 1
    return text


def one_doc(spec: dict) -> dict:
    import qkv
    from qkv.explain.long.document import document

    torch.set_num_threads(spec["threads"])
    model = qkv.load(spec["dir"])
    text = text_of(model, spec["n"])
    ids = torch.tensor([model.tokenizer.encode(text).ids])
    base = rss_mb()
    firsts, forwards = [], []
    doc = None
    for _ in range(spec["rounds"]):
        doc = None
        t0 = time.perf_counter()
        doc = document(model, text)
        firsts.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        with torch.no_grad():
            model(ids, torch.ones_like(ids), logits_to_keep=1)
        forwards.append(time.perf_counter() - t0)
    n = len(doc)
    switches = []
    for i in range(1, 10):
        t0 = time.perf_counter()
        doc.explain(token=i * n // 10)
        switches.append(time.perf_counter() - t0)
    last = len(doc.layers) - 1
    t0 = time.perf_counter()
    doc.received(last, 0)
    received = time.perf_counter() - t0
    t0 = time.perf_counter()
    doc.block_map(last, 0, block=128)
    block_map = time.perf_counter() - t0
    return dict(n=n, first=statistics.median(firsts), forward=statistics.median(forwards),
                ratio=statistics.median(f / w for f, w in zip(firsts, forwards)),
                switch_median=statistics.median(switches), switch_max=max(switches),
                received=received, block_map=block_map, record_mb=doc.nbytes / 2**20,
                peak_mb=max(0.0, peak_mb() - base))


def one_eager(spec: dict) -> dict:
    import transformers

    import qkv

    torch.set_num_threads(spec["threads"])
    model = qkv.load(spec["dir"])
    ids = torch.tensor([model.tokenizer.encode(text_of(model, spec["n"])).ids])
    n = ids.shape[1]
    cfg = SHAPES[spec["shape"]]
    need = cfg["num_hidden_layers"] * cfg["num_attention_heads"] * n * n * 4 / 2**20
    # eager also holds the scores and the softmax of one layer beside the kept weights
    need += 2 * cfg["num_attention_heads"] * n * n * 4 / 2**20
    if need > 0.8 * available_mb():
        return dict(n=n, skipped=f"needs ~{need / 1024:.1f} GiB for its attention tensors, "
                                 f"{available_mb() / 1024:.1f} GiB available")
    del model
    hf = transformers.LlamaForCausalLM.from_pretrained(spec["dir"], attn_implementation="eager").eval()
    base = rss_mb()
    t0 = time.perf_counter()
    with torch.no_grad():
        hf(input_ids=ids, output_attentions=True, logits_to_keep=1)
    return dict(n=n, time=time.perf_counter() - t0, peak_mb=max(0.0, peak_mb() - base))


def run(spec: dict) -> dict | None:
    proc = subprocess.run([sys.executable, __file__, "--one", json.dumps(spec)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        return dict(failed=proc.stderr.strip()[-300:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--shapes", default="llama-4x256", help=f"comma-separated, of {list(SHAPES)}")
    p.add_argument("--lengths", default="8192,32768", help="comma-separated N")
    p.add_argument("--no-eager", action="store_true", help="skip transformers eager")
    p.add_argument("--one", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.one:
        spec = json.loads(a.one)
        print(json.dumps(one_doc(spec) if spec["impl"] == "doc" else one_eager(spec)))
        return
    lengths = [int(n) for n in a.lengths.split(",")]
    print(f"torch {torch.__version__}, {a.threads} thread(s), fp32")
    print(f"{'shape':12} {'N':>6} {'first s':>8} {'fwd s':>7} {'ratio':>6} {'switch med/max ms':>18} "
          f"{'received s':>10} {'map s':>6} {'record MB':>9} {'peak MB':>8} | eager")
    with tempfile.TemporaryDirectory() as tmp:
        for shape in a.shapes.split(","):
            directory = build(shape, tempfile.mkdtemp(dir=tmp), max(lengths) + 1024)
            for n in lengths:
                base = dict(shape=shape, dir=directory, n=n, threads=a.threads,
                            rounds=a.rounds if n <= 8192 else 1)
                d = run(dict(base, impl="doc"))
                e = dict(skipped="--no-eager") if a.no_eager else run(dict(base, impl="eager"))
                if "failed" in d:
                    print(f"{shape:12} {n:>6} document failed: {d['failed']}")
                    continue
                eager = (e.get("skipped") or e.get("failed") or
                         f"{e['time']:.2f} s, {e['peak_mb']:.0f} MB "
                         f"({e['time'] / d['first']:.1f}x the first pass' time, "
                         f"{e['peak_mb'] / max(d['peak_mb'], 1):.0f}x its memory)")
                print(f"{shape:12} {d['n']:>6} {d['first']:>8.2f} {d['forward']:>7.2f} {d['ratio']:>6.2f} "
                      f"{1e3 * d['switch_median']:>8.0f} / {1e3 * d['switch_max']:<7.0f} "
                      f"{d['received']:>10.2f} {d['block_map']:>6.2f} {d['record_mb']:>9.0f} "
                      f"{d['peak_mb']:>8.0f} | {eager}", flush=True)


if __name__ == "__main__":
    main()
