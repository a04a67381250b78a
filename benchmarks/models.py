"""Llama-family decoders: qkv against ``transformers``, same random weights, same process.

Two random Llama-architecture models are built by ``transformers``, saved with
``save_pretrained`` (safetensors) and loaded by both libraries:

* ``smollm-135m``: SmolLM-135M's shape — 30 layers, E = 576, 9 heads, 3 key/value heads
  (GQA), SwiGLU width 1536, vocabulary 49152, tied output head;
* ``gpt2-small``: GPT-2 small's shape as a Llama — 12 layers, E = 768, 12 heads (no GQA),
  width 3072, vocabulary 50257.

Measured, interleaved round by round (the order alternating, so a noisy neighbour slows both
alike), median seconds and the median of the paired ratios ``transformers / qkv``:

* **prompt**: one forward over a batch of 8 × 256 random tokens (logits for every position),
  transformers with ``attn_implementation="sdpa"``;
* **generate**: greedy generation of 128 tokens at batch 1 from a 16-token prompt —
  ``model.generate`` (KV cache) against ``transformers`` ``generate`` (its cache); tokens/s,
  and whether both produced the same tokens.

Speed-ups are given by wall time and by this process's CPU time (``time.process_time``; one
torch thread, so CPU time is the work done, and it does not count the time other jobs on a
shared machine held the core — the steadier of the two there).

fp32 rows, and bf16 rows beside them (both libraries with bf16 weights; the bf16 logits'
largest difference from qkv's fp32 logits is printed).

    python benchmarks/models.py                  # both shapes, 3 rounds, 1 thread
    python benchmarks/models.py --quick          # smaller: batch 2 × 128, 32 new tokens, 2 rounds
    python benchmarks/models.py --write-results  # also update benchmarks/RESULTS.md
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "RESULTS.md")
SECTION = "## benchmarks/models.py"

SHAPES = {
    "smollm-135m": dict(num_hidden_layers=30, hidden_size=576, num_attention_heads=9,
                        num_key_value_heads=3, intermediate_size=1536, vocab_size=49152,
                        tie_word_embeddings=True),
    "gpt2-small": dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12,
                       num_key_value_heads=12, intermediate_size=3072, vocab_size=50257,
                       tie_word_embeddings=False),
}


def save_random_llama(path: str, shape: dict) -> None:
    import transformers
    from tokenizers import ByteLevelBPETokenizer

    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(["a tiny tokenizer for the benchmark"], vocab_size=300,
                            special_tokens=["<s>", "</s>"])
    tok.save(os.path.join(path, "tokenizer.json"))
    torch.manual_seed(0)
    config = transformers.LlamaConfig(max_position_embeddings=2048, rope_theta=10000.0,
                                      initializer_range=0.02, bos_token_id=None,
                                      eos_token_id=None, pad_token_id=None, **shape)
    transformers.LlamaForCausalLM(config).save_pretrained(path)


def timed(fn) -> tuple[tuple[float, float], object]:
    """((wall seconds, this process's CPU seconds), result)."""
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return (time.perf_counter() - wall, time.process_time() - cpu), out


def paired(a_fn, b_fn, rounds: int):
    """Interleaved timings of two callables (order alternating each round):
    (a's (wall, cpu) per round, b's, a's last result, b's last result)."""
    a_times, b_times, a_out, b_out = [], [], None, None
    for r in range(rounds):
        order = [("a", a_fn), ("b", b_fn)] if r % 2 == 0 else [("b", b_fn), ("a", a_fn)]
        for which, fn in order:
            t, out = timed(fn)
            if which == "a":
                a_times.append(t)
                a_out = out
            else:
                b_times.append(t)
                b_out = out
    return a_times, b_times, a_out, b_out


def cells(q_t, h_t, work: float, unit: str) -> str:
    """Table cells: median wall seconds (and work/s) per library, then the medians of the
    paired ratios transformers/qkv by wall time and by CPU time."""
    def one(times):
        wall = statistics.median(w for w, _ in times)
        return f"{wall:.3f} s ({work / wall:.1f} {unit})"

    wall_ratio = statistics.median(h[0] / q[0] for h, q in zip(h_t, q_t))
    cpu_ratio = statistics.median(h[1] / q[1] for h, q in zip(h_t, q_t))
    return f"{one(q_t)} | {one(h_t)} | **{wall_ratio:.2f}×** | **{cpu_ratio:.2f}×**"


def bench_shape(name: str, shape: dict, args, lines: list[str]) -> None:
    import transformers

    import qkv

    with tempfile.TemporaryDirectory() as path:
        save_random_llama(path, shape)
        for dtype in (torch.float32, torch.bfloat16):
            ours = qkv.load(path, dtype=dtype)
            hf = transformers.LlamaForCausalLM.from_pretrained(
                path, attn_implementation="sdpa", dtype=dtype).eval()
            dname = str(dtype).removeprefix("torch.")
            rounds = args.rounds
            g = torch.Generator().manual_seed(1)
            ids = torch.randint(0, shape["vocab_size"], (args.batch, args.length), generator=g)

            def q_prompt():
                with torch.inference_mode():
                    return ours(ids).logits

            def h_prompt():
                with torch.inference_mode():
                    return hf(input_ids=ids, use_cache=False).logits

            q_t, h_t, q_logits, h_logits = paired(q_prompt, h_prompt, rounds)
            diff = float((q_logits.float() - h_logits.float()).abs().max())
            if dtype == torch.float32:
                fp32_logits = q_logits
                extra = f"max |qkv − transformers| logits {diff:.2e}"
            else:
                extra = (f"max |qkv − transformers| {diff:.2e}; bf16 vs qkv fp32: "
                         f"{float((q_logits.float() - fp32_logits.float()).abs().max()):.2e}")
            lines.append(f"| {name} | {dname} | prompt {args.batch}×{args.length} | "
                         f"{cells(q_t, h_t, args.batch * args.length, 'tok/s')} | {extra} |")
            print(lines[-1], flush=True)

            prompt = torch.randint(0, shape["vocab_size"], (1, 16), generator=g)
            n = args.new_tokens

            def q_gen():
                return ours.generate(prompt, n)

            def h_gen():
                with torch.inference_mode():
                    return hf.generate(prompt, attention_mask=torch.ones_like(prompt),
                                       max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                       pad_token_id=0)

            q_t, h_t, q_ids, h_ids = paired(q_gen, h_gen, rounds)
            same = q_ids.tolist() == h_ids.tolist()
            agree = sum(a == b for a, b in zip(q_ids[0, 16:].tolist(), h_ids[0, 16:].tolist()))
            lines.append(f"| {name} | {dname} | greedy {n} tokens, batch 1 | "
                         f"{cells(q_t, h_t, n, 'tok/s')} | "
                         f"same tokens: {'yes' if same else f'no ({agree}/{n} equal)'} |")
            print(lines[-1], flush=True)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="batch 2 × 128, 32 new tokens, 2 rounds")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated: " + ", ".join(SHAPES))
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (default 1: on a shared machine more threads mostly wait)")
    p.add_argument("--write-results", action="store_true")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    args.batch, args.length, args.new_tokens = (2, 128, 32) if args.quick else (8, 256, 128)
    if args.quick:
        args.rounds = 2
    for s in args.shapes.split(","):
        if s not in SHAPES:
            p.error(f"unknown shape {s!r}; choose from {', '.join(SHAPES)}")
    header = [f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
              f"{os.cpu_count()} CPUs; rounds {args.rounds}", "",
              "| model | dtype | work | qkv (median wall) | transformers (median wall) | "
              "speed-up, wall | speed-up, CPU time | check |",
              "|---|---|---|---|---|---|---|---|"]
    print("\n".join(header), flush=True)
    lines: list[str] = []
    for s in args.shapes.split(","):
        bench_shape(s, SHAPES[s], args, lines)
    if args.write_results:
        write_results("\n".join(header + lines), " ".join(sys.argv[1:]))


def write_results(table: str, flags: str) -> None:
    with open(RESULTS, encoding="utf-8") as f:
        text = f.read()
    body = (f"{SECTION}\n\nCommand: `python benchmarks/models.py {flags}`. The machine (2 cores) was "
            f"shared with other jobs while this ran: times are noisy, ratios are paired per round.\n\n"
            f"{table}\n")
    if SECTION in text:
        start = text.index(SECTION)
        nxt = text.find("\n## ", start + len(SECTION))
        text = text[:start] + body + ("" if nxt < 0 else text[nxt:])
    else:
        text = text.rstrip("\n") + "\n\n" + body
    with open(RESULTS, "w", encoding="utf-8") as f:
        f.write(text)


if __name__ == "__main__":
    main()
