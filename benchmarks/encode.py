"""Sentence embeddings: ``qkv.models.load("minilm").embed`` against sentence-transformers.

Both encode the same sentences (mixed lengths, 5–120 words, generated deterministically from a
word list) with all-MiniLM-L6-v2, batch size 32, fp32, default torch threads, in the same
process. Calls are interleaved round by round (the order alternating) so that a noisy
neighbour slows both alike; reported are the median seconds, sentences per second, and the
speed-up as the median over rounds of the paired ratio ``st_seconds / qkv_seconds``.

Also reported:
* the largest absolute difference between the two sets of embeddings (they must agree to 1e-5);
* a bf16 row: both libraries with bf16 weights, and their difference from qkv's fp32 result;
* peak memory (VmHWM) of a fresh process per implementation — after loading, and after
  encoding — since tracemalloc does not see torch's allocations;
* with ``--ablation``: qkv's ordinary padded forward on the same length-sorted batches,
  mean-pooled (``qkv-padded``), to show what packing brings.

    python benchmarks/encode.py                    # 512 sentences (several minutes on 2 cores)
    python benchmarks/encode.py --quick            # 128 sentences, 2 rounds, no memory/bf16
    python benchmarks/encode.py --write-results    # also update benchmarks/RESULTS.md
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch

WORDS = """the of and to in is was that for it with as on be at by this had not are but from
or have an they which one you were all we her she there would their will when who him been has
more if no out do so can what up said about other into than its time only could new them man
some these then two first may any like now my such make over our even most me state after also
made many did must before back see through way where get much go well your know should down work
year because come people just say each those take day good how long little use very great still
own found between life being under three never know last might while house part around world
attention query key value token layer head model weight softmax vector matrix sentence embedding
transformer language meaning number explain compute scale mask position encoder decoder river
mountain garden kitchen window doctor teacher student library morning evening weather journey
quickly slowly carefully happily suddenly beautiful ancient curious gentle enormous fragile""".split()

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "RESULTS.md")
SECTION = "## benchmarks/encode.py"
READING = """Reading: the goal was 1.5x sentence-transformers' speed; on this 2-core AVX2 machine it
is not reached, and the floor above says why. Both libraries spend most of the time (~75-80 % in
torch's profiler) in the same MKL fp32 GEMMs of the linear layers, and sentence-transformers
already sorts the texts by length, so its batches carry little padding. qkv packs the real
tokens (no padding at all in the linear layers and feed-forward, which gains most on short
lists whose batches span wide lengths); what is left is the arithmetic itself, identical in
both. bf16 helps nothing on a CPU without bf16 instructions (this one is AVX2 only): its GEMMs
are emulated."""
MEMORY_SENTENCES = 128  # bf16 is slow on CPUs without bf16 instructions: keep these runs short


def make_sentences(n: int, *, seed: int = 0, lo: int = 5, hi: int = 120) -> list[str]:
    """n sentences of lo..hi words drawn from WORDS, the same for every run."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(lo, hi))]
        out.append(" ".join(words).capitalize() + ".")
    return out


# -- implementations: name → (load, encode) ------------------------------------------------------
def load_impl(name: str):
    """Load one implementation; return ``encode(sentences) -> (n, 384) fp32 tensor``."""
    from qkv.models import load
    from qkv.models.loading import minilm_dir

    if name in ("qkv", "qkv-bf16"):
        model = load("minilm", dtype=torch.bfloat16 if name == "qkv-bf16" else torch.float32)
        return lambda s: model.embed(s, batch_size=32).float()
    if name in ("st", "st-bf16"):
        from sentence_transformers import SentenceTransformer

        st = SentenceTransformer(minilm_dir(), device="cpu")
        if name == "st-bf16":
            st = st.to(torch.bfloat16)
        return lambda s: st.encode(s, batch_size=32, convert_to_tensor=True).float()
    if name == "qkv-padded":
        return _qkv_padded(load("minilm"))
    raise SystemExit(f"unknown implementation {name!r}")


def _qkv_padded(model):
    """The ordinary padded forward on length-sorted batches, mean-pooled over real tokens."""

    @torch.inference_mode()
    def encode(sentences):
        lengths = [len(e) for e in model.tokenizer.encode_batch(sentences, max_length=256).encodings]
        order = sorted(range(len(sentences)), key=lambda i: -lengths[i])  # as embed sorts
        out = torch.empty(len(sentences), 384)
        for start in range(0, len(order), 32):
            chunk = order[start : start + 32]
            batch = model.tokenizer.encode_batch([sentences[i] for i in chunk], max_length=256)
            x = model(batch.input_ids, batch.attention_mask).last_hidden_state  # (b, t, E)
            m = batch.attention_mask[..., None].float()
            out[chunk] = (x * m).sum(1) / m.sum(1)
        return torch.nn.functional.normalize(out, dim=-1)

    return encode


# -- measurements ----------------------------------------------------------------------------------
def timed(fn, sentences):
    start = time.perf_counter()
    out = fn(sentences)
    return time.perf_counter() - start, out


def race(fns: dict, sentences: list[str], rounds: int, *, lists: int = 1, between=None) -> dict:
    """Interleaved rounds, the order alternating; each round encodes one of ``lists`` equal
    slices of ``sentences`` (all of them when 1), then calls ``between()`` if given. Returns per
    name its seconds and last embeddings (of the whole list when ``lists`` is 1)."""
    size = len(sentences) // lists
    seconds = {name: [] for name in fns}
    embeddings = {}
    for r in range(rounds):
        part = sentences[(r % lists) * size:(r % lists + 1) * size]
        for name in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
            s, embeddings[name] = timed(fns[name], part)
            seconds[name].append(s)
            print(f"  round {r + 1}: {name:12s} {s:7.2f} s", flush=True)
        if between is not None:
            between()
    return {"seconds": seconds, "embeddings": embeddings}


def loaded(names: list[str], warm: list[str]) -> dict:
    fns = {name: load_impl(name) for name in names}
    for fn in fns.values():  # warm-up: first-call allocations, thread pools, lazy inits
        fn(warm)
    return fns


def table(sec: dict, n: int) -> list[str]:
    lines = ["| implementation | median s | sentences/s | speed-up vs st (paired median) |",
             "|---|---:|---:|---:|"]
    for name in sec:
        med = statistics.median(sec[name])
        ratio = statistics.median(a / b for a, b in zip(sec["st"], sec[name]))
        lines.append(f"| {name} | {med:.2f} | {n / med:.1f} | {ratio:.2f}x |")
    return lines


def gemm_rate(E: int = 384, F: int = 1536) -> float:
    """GFLOP/s of one MiniLM layer's four GEMMs (q/k/v fused, out, fc1, fc2) on a typical batch of
    2304 tokens: the best of 20 calls (a floor must assume the best rate the machine reaches)."""
    x, h = torch.randn(2304, E), torch.randn(2304, F)
    shapes = [(x, torch.randn(3 * E, E)), (x, torch.randn(E, E)), (x, torch.randn(F, E)), (h, torch.randn(E, F))]
    with torch.inference_mode():
        runs = []
        for _ in range(23):
            start = time.perf_counter()
            for inp, w in shapes:
                torch.nn.functional.linear(inp, w, w[:, 0])
            runs.append(time.perf_counter() - start)
    return 2 * 2304 * (4 * E * E + 2 * E * F) / min(runs[3:]) / 1e9


def gemm_floor(sentences: list[str], st_seconds: float, gflops: float) -> list[str]:
    """How fast could any fp32 implementation be? The linear layers' FLOPs at the best GEMM
    speed measured during the run, for the real tokens and for the tokens
    sentence-transformers pads to."""
    from qkv.models import load

    model = load("minilm")
    c = model.config
    lengths = [len(e) for e in model.tokenizer.encode_batch(sentences, max_length=256).encodings]
    real = sum(lengths)
    # sentence-transformers sorts by characters, then pads each batch of 32 to its longest
    order = sorted(range(len(sentences)), key=lambda i: -len(sentences[i]))
    padded = sum(max(lengths[i] for i in order[k:k + 32]) * len(order[k:k + 32])
                 for k in range(0, len(order), 32))
    E, F = c.hidden_size, c.intermediate_size
    flop_per_token = 2 * c.num_hidden_layers * (4 * E * E + 2 * E * F)  # q, k, v, out, fc1, fc2
    floor_real, floor_padded = real * flop_per_token / gflops / 1e9, padded * flop_per_token / gflops / 1e9
    return [
        f"Where the time goes: the {len(sentences)} sentences are {real} tokens; "
        f"sentence-transformers' batches (sorted by characters, padded to the longest of 32) hold "
        f"{padded} ({padded / real - 1:+.1%}). The linear layers cost {flop_per_token / 1e6:.1f} MFLOP "
        f"per token; this machine's fp32 GEMMs reach {gflops:.0f} GFLOP/s (best of 20 calls of one "
        f"layer's four linear maps on 2304 tokens, measured after every round), so the GEMMs alone "
        f"take >= {floor_real:.2f} s for the real tokens and >= {floor_padded:.2f} s for "
        f"sentence-transformers' padded ones, out of its {st_seconds:.2f} s. No fp32 implementation "
        f"that computes the same numbers can beat sentence-transformers by more than about "
        f"{st_seconds / floor_real:.2f}x here.",
    ]


def peak_rss_mb() -> float:
    """This process's peak resident memory. VmHWM, not ru_maxrss: Linux carries ru_maxrss over
    fork + exec, so a child of a big parent would report the parent's size."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # not Linux


def child(name: str, n: int) -> None:
    """Run in a fresh process: peak RSS after loading, and after encoding n sentences."""
    sentences = make_sentences(n)
    fn = load_impl(name)
    loaded = peak_rss_mb()
    seconds, _ = timed(fn, sentences)
    print(json.dumps({"name": name, "loaded_mb": loaded, "peak_mb": peak_rss_mb(), "seconds": seconds}))


def memory(name: str, n: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", name, "--n", str(n)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=512, help="number of sentences")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="128 sentences, 2 rounds, no memory/bf16")
    parser.add_argument("--ablation", action="store_true", help="also time qkv-padded")
    parser.add_argument("--write-results", action="store_true", help=f"update {RESULTS}")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child, args.n)
    if args.quick:
        args.n, args.rounds = 128, 2
    sentences = make_sentences(args.n)
    words = [len(s.split()) for s in sentences]
    lines = [f"{args.n} sentences of {min(words)}–{max(words)} words, batch 32, fp32, "
             f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
             f"load average before: {os.getloadavg()[0]:.1f}", ""]

    names = ["qkv", "st"] + (["qkv-padded"] if args.ablation else [])
    fns = loaded(names, sentences[:32])
    rates = []  # the GEMM speed, sampled after every round: the best sample sets the floor
    sample = lambda: rates.append(gemm_rate())
    result = race(fns, sentences, args.rounds, between=sample)
    sec, emb = result["seconds"], result["embeddings"]
    lines += table(sec, args.n)
    lines += ["", "max abs diff of the embeddings from sentence-transformers': " + ", ".join(
        f"{name} {(emb[name] - emb['st']).abs().max().item():.1e}" for name in names if name != "st")]
    short = None
    if args.n >= 256:
        lists = args.n // 128
        short = race(fns, sentences, 2 * lists, lists=lists, between=sample)
    lines += [""] + gemm_floor(sentences, statistics.median(sec["st"]), max(rates))
    if short is not None:
        lines += ["", f"Shorter lists: {lists} disjoint lists of 128 of the same sentences, each "
                      f"encoded twice (batches of 32 then span wider lengths, so padding costs more):", ""]
        lines += table(short["seconds"], 128)
    if not args.quick:
        bf = race(loaded(["qkv-bf16", "st-bf16"], sentences[:32]), sentences, 1)
        lines += ["", "bf16 weights (one round each):", "",
                  "| implementation | s | sentences/s | max abs diff vs qkv fp32 | min cosine vs fp32 |",
                  "|---|---:|---:|---:|---:|"]
        for name in ("qkv-bf16", "st-bf16"):
            s, e = bf["seconds"][name][0], bf["embeddings"][name]
            diff = (e - emb["qkv"]).abs().max().item()
            cos = (e * emb["qkv"]).sum(-1).min().item()
            lines.append(f"| {name} | {s:.2f} | {args.n / s:.1f} | {diff:.1e} | {cos:.5f} |")
        n_mem = min(args.n, MEMORY_SENTENCES)
        lines += ["", f"Peak memory (VmHWM) of a fresh process per implementation, encoding the first "
                      f"{n_mem} sentences (the peak is set by the longest batch; these reach "
                      f"{max(words[:n_mem])} words):", "",
                  "| implementation | after load MB | after encoding MB | encoding adds MB |",
                  "|---|---:|---:|---:|"]
        for name in ("qkv", "st", "qkv-bf16", "st-bf16"):
            m = memory(name, n_mem)
            lines.append(f"| {name} | {m['loaded_mb']:.0f} | {m['peak_mb']:.0f} | "
                         f"{m['peak_mb'] - m['loaded_mb']:.0f} |")
    lines.append(f"\nload average after: {os.getloadavg()[0]:.1f}")
    text = "\n".join(lines)
    print("\n" + text)
    if args.write_results:
        command = "python benchmarks/encode.py " + " ".join(a for a in sys.argv[1:])
        write_section(text, command.strip())


def write_section(text: str, command: str) -> None:
    """Replace (or append) this benchmark's section of RESULTS.md, leaving the others alone."""
    body = f"{SECTION}\n\nCommand: `{command}`\n\n{text}\n\n{READING}\n"
    old = open(RESULTS, encoding="utf-8").read() if os.path.exists(RESULTS) else "# Benchmark results\n"
    start = old.find(SECTION + "\n")
    if start < 0:
        new = old.rstrip("\n") + "\n\n" + body
    else:
        end = old.find("\n## ", start + len(SECTION))
        new = old[:start] + body + ("\n" + old[end + 1:] if end >= 0 else "")
    with open(RESULTS, "w", encoding="utf-8") as f:
        f.write(new)


if __name__ == "__main__":
    main()
