"""Fuzz the checkpoint reader on the transformers path (issue 31, items 1-4 and 11): mutated model
directories through ``qkv explain``.

A tiny random checkpoint of each architecture is saved by ``transformers``; each case copies it and
changes one thing — a config.json field set to a value of another type, out of range, removed or
unknown; an index naming a shard outside the directory, a list, an empty weight map; only a pickle
(``pytorch_model.bin``); a truncated, missing, linked-out, FIFO or directory shard; a corrupt
tokenizer — and runs ``qkv explain "the cat sat" --model DIR`` in a fresh process. The contract:

* exit 0 and output on stdout, or exit 2 with exactly one line on stderr and nothing on stdout;
* never a traceback, never another exit code, never past ``--timeout`` seconds (a huge layer count
  must be refused from the headers, not built).

Run (about 4 s a case on a 2-core machine)::

    python benchmarks/fuzz_checkpoints.py --examples 60 --seed 1
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ARCHS = ("llama", "olmo2", "gpt2", "bert")

# config.json values to try in place of a field's own: other types, out of range, absurd
WEIRD = ["12", -1, 0, 10**9, 1.5, None, [1], {"a": 1}, True, "nan", 1e999]


def build(arch: str, out: Path) -> None:
    """A tiny random ``arch`` checkpoint with a tokenizer, saved by transformers."""
    import torch
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    torch.manual_seed(0)
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "the", "cat", "sat", "on", "mat"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    small = dict(vocab_size=len(words), hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                 intermediate_size=32, max_position_embeddings=64)
    if arch == "llama":
        cfg = transformers.LlamaConfig(**small, num_key_value_heads=2)
        model = transformers.LlamaForCausalLM(cfg)
    elif arch == "olmo2":
        cfg = transformers.Olmo2Config(**small, num_key_value_heads=2)
        model = transformers.Olmo2ForCausalLM(cfg)
    elif arch == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=len(words), n_embd=16, n_layer=2, n_head=2, n_positions=64)
        model = transformers.GPT2LMHeadModel(cfg)
    else:
        cfg = transformers.BertConfig(**small)
        model = transformers.BertModel(cfg)
    model.save_pretrained(out, max_shard_size="20KB")  # several shards and an index
    tok.save(str(out / "tokenizer.json"))


def mutate(rng: random.Random, d: Path) -> str:
    """Change one thing in the checkpoint directory ``d``; say what."""
    cfg_path = d / "config.json"
    cfg = json.loads(cfg_path.read_text())
    shards = sorted(p.name for p in d.glob("*.safetensors"))
    kind = rng.choice(["field", "field", "field", "drop", "index", "shard", "pickle", "tokenizer"])
    if kind == "field":
        key = rng.choice(sorted(cfg))
        cfg[key] = rng.choice(WEIRD)
        cfg_path.write_text(json.dumps(cfg))
        return f"config.json {key} = {cfg[key]!r}"
    if kind == "drop":
        key = rng.choice(sorted(cfg))
        del cfg[key]
        cfg_path.write_text(json.dumps(cfg))
        return f"config.json without {key}"
    index = d / "model.safetensors.index.json"
    if kind == "index" and index.exists():
        doc = json.loads(index.read_text())
        what = rng.choice(["outside", "absolute", "list", "empty"])
        if what == "outside":
            name = next(iter(doc["weight_map"]))
            shutil.copy(d / doc["weight_map"][name], d.parent / "OUTSIDE.safetensors")
            doc["weight_map"][name] = "../OUTSIDE.safetensors"
        elif what == "absolute":
            name = next(iter(doc["weight_map"]))
            doc["weight_map"][name] = str((d / doc["weight_map"][name]).resolve())
        elif what == "list":
            doc = list(doc["weight_map"])
        else:
            doc["weight_map"] = {}
        index.write_text(json.dumps(doc))
        return f"index: {what}"
    if kind in ("shard", "index") and shards:
        shard = d / rng.choice(shards)
        what = rng.choice(["truncate", "delete", "link out", "fifo", "directory"])
        if what == "truncate":
            data = shard.read_bytes()
            shard.write_bytes(data[: rng.randrange(len(data))])
        elif what == "delete":
            shard.unlink()
        elif what == "link out":
            target = d.parent / f"elsewhere-{shard.name}"
            shutil.move(shard, target)
            shard.symlink_to(target)
        elif what == "fifo":
            shard.unlink()
            os.mkfifo(shard)
        else:
            shard.unlink()
            shard.mkdir()
        return f"shard {shard.name}: {what}"
    if kind == "pickle":
        for p in d.glob("*.safetensors*"):
            p.unlink()
        (d / "pytorch_model.bin").write_bytes(b"\x80\x04not really a pickle")
        return "only pytorch_model.bin"
    tok = d / "tokenizer.json"
    what = rng.choice(["list", "empty", "fifo"])
    tok.unlink()
    if what == "list":
        tok.write_text("[]")
    elif what == "empty":
        tok.write_text("")
    else:
        os.mkfifo(tok)
    return f"tokenizer.json: {what}"


def run_case(qkv: str, d: Path, timeout: float) -> tuple[str, str]:
    """(verdict, detail): 'ok' (answered), 'refused' (one line, exit 2) or what broke the contract."""
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    try:
        p = subprocess.run([qkv, "explain", "the cat sat", "--model", str(d)], capture_output=True,
                           text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return "TIMEOUT", f"past {timeout:.0f} s"
    err = [line for line in p.stderr.splitlines() if line.strip()]
    if "Traceback" in p.stderr:
        return "TRACEBACK", err[-1] if err else ""
    if p.returncode == 0 and p.stdout.strip():
        return "ok", ""
    if p.returncode == 2 and len(err) == 1 and not p.stdout.strip():
        return "refused", err[0]
    return "BROKEN", f"exit {p.returncode}, {len(err)} stderr lines: {' | '.join(err[-3:])}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=40, help="mutated directories to try")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds a case may take")
    args = ap.parse_args()
    qkv = shutil.which("qkv") or str(Path(sys.executable).with_name("qkv"))
    rng = random.Random(args.seed)
    counts: dict[str, int] = {}
    broken = []
    with tempfile.TemporaryDirectory() as tmp:
        bases = {}
        for arch in ARCHS:
            bases[arch] = Path(tmp) / "base" / arch
            build(arch, bases[arch])
        for i in range(args.examples):
            arch = rng.choice(ARCHS)
            case = Path(tmp) / f"case{i}" / arch
            shutil.copytree(bases[arch], case)
            what = mutate(rng, case)
            t0 = time.perf_counter()
            verdict, detail = run_case(qkv, case, args.timeout)
            counts[verdict] = counts.get(verdict, 0) + 1
            print(f"{i:3d} {arch:6s} {what:45s} {verdict:9s} {time.perf_counter() - t0:5.1f}s {detail[:110]}",
                  flush=True)
            if verdict not in ("ok", "refused"):
                broken.append((arch, what, verdict, detail))
            shutil.rmtree(case.parent, ignore_errors=True)
    print(f"\n{args.examples} cases: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    for b in broken:
        print("CONTRACT BROKEN:", *b)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
