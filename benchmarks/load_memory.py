"""Peak memory while loading a checkpoint: ``qkv.load`` against ``transformers``' ``from_pretrained``.

Random models of three real shapes are built by ``transformers`` and saved with
``save_pretrained`` (one ``model.safetensors``), stored in float32 and in bfloat16:

* ``smollm-135m``  — a Llama of SmolLM-135M's shape (30 layers, E = 576, 9 heads / 3 kv heads,
  tied head): every tensor is used as stored;
* ``gpt2-small``   — GPT-2 small (12 layers, E = 768): ``Conv1D`` weights stored (in, out),
  q/k/v fused — qkv transposes each into a copy (``gpt2_convert``) and splits ``c_attn`` in three;
* ``pythia-160m``  — a GPT-NeoX of Pythia-160m's shape (12 layers, E = 768, untied head): the
  per-head fused ``query_key_value`` is split into three copies.

Each load runs in a fresh process: RSS is read after the imports (and after the one-time import
of torch's meta-tensor machinery, which both libraries use), then the model is loaded and
every parameter read once (so the pages of the file that the model uses are resident, as they
are after a first forward), and the growth of the peak RSS (``VmHWM``) and of the RSS after
loading (``VmRSS``) are reported as multiples of the checkpoint file's size. A memory-mapped
weight counts in RSS when it has been read (the page cache's pages, shared with other
processes), so 1.0× is what holding the weights once costs. Each bfloat16 file is also loaded
with ``dtype=torch.float32``, which converts (the model alone is then 2× the file).

    python benchmarks/load_memory.py               # all shapes, fp32 and bf16 files
    python benchmarks/load_memory.py --quick       # smollm-135m only
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SHAPES = {
    "smollm-135m": ("LlamaConfig", "LlamaForCausalLM", dict(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
        num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048,
        tie_word_embeddings=True)),
    "gpt2-small": ("GPT2Config", "GPT2LMHeadModel", dict(
        vocab_size=50257, n_embd=768, n_layer=12, n_head=12, n_positions=1024)),
    "pythia-160m": ("GPTNeoXConfig", "GPTNeoXForCausalLM", dict(
        vocab_size=50304, hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
        num_attention_heads=12, rotary_pct=0.25, max_position_embeddings=2048,
        use_parallel_residual=True, tie_word_embeddings=False)),
}

MEASURE = r"""
import json, sys
import torch
torch.set_num_threads(1)
which, path, dtype = sys.argv[1], sys.argv[2], sys.argv[3]
dtype = None if dtype == "stored" else getattr(torch, dtype)
if which == "qkv":
    import qkv
    load = lambda: qkv.load(path, dtype=dtype)
else:
    import transformers
    load = lambda: transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype or "auto")
def status(key):  # VmRSS: now; VmHWM: this process's peak (ru_maxrss would include the parent's)
    line = next(l for l in open("/proc/self/status") if l.startswith(key + ":"))
    return int(line.split()[1]) * 1024
# Both libraries build the model's modules on the meta device; the first random init of a meta
# tensor imports torch's meta-op machinery (~75 MB of Python modules, once per process). Paid
# here, before measuring, so the figures are what loading costs per checkpoint.
torch.empty(1, device="meta").normal_()
before = status("VmRSS")
model = load()
with torch.no_grad():
    total = sum(float(p.sum()) for p in model.parameters())  # touch every weight, no copies
params = sum(p.numel() * p.element_size() for p in model.parameters())
print(json.dumps({"peak": status("VmHWM") - before, "after": status("VmRSS") - before, "params": params,
                  "dtype": str(next(model.parameters()).dtype)}))
"""


def save_checkpoint(root: str, name: str, dtype: str) -> str:
    import torch
    import transformers
    from tokenizers import ByteLevelBPETokenizer

    path = os.path.join(root, f"{name}-{dtype}")
    os.makedirs(path)
    config_class, model_class, kw = SHAPES[name]
    torch.manual_seed(0)
    model = getattr(transformers, model_class)(getattr(transformers, config_class)(**kw))
    model.to(getattr(torch, dtype)).save_pretrained(path, max_shard_size="10GB")
    del model
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(["the quick brown fox jumps over the lazy dog"] * 4, vocab_size=300,
                            min_frequency=1)
    tok.save(os.path.join(path, "tokenizer.json"))
    return path


def measure(which: str, path: str, dtype: str = "stored") -> dict:
    out = subprocess.run([sys.executable, "-c", MEASURE, which, path, dtype], check=True,
                         capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smollm-135m only")
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), help="these shapes only")
    args = parser.parse_args()
    names = ["smollm-135m"] if args.quick else args.shapes or list(SHAPES)
    rows = []
    with tempfile.TemporaryDirectory() as root:
        for name in names:
            for stored in ("float32", "bfloat16"):
                path = save_checkpoint(root, name, stored)
                size = os.path.getsize(os.path.join(path, "model.safetensors"))
                asked = ["stored"] + (["float32"] if stored == "bfloat16" else [])
                for dtype in asked:
                    q, t = measure("qkv", path, dtype), measure("transformers", path, dtype)
                    rows.append((name, stored, dtype, size, q, t))
                    print(f"{name:12s} file {stored:8s} {size / 2**20:7.1f} MiB  load as {dtype:8s}  "
                          f"qkv peak {q['peak'] / size:4.2f}× after {q['after'] / size:4.2f}×  |  "
                          f"transformers peak {t['peak'] / size:4.2f}× after {t['after'] / size:4.2f}×  "
                          f"(model {q['params'] / size:4.2f}×, {q['dtype']})", flush=True)
                for f in os.listdir(path):
                    os.remove(os.path.join(path, f))
    print("\n| shape | file dtype | loaded as | file MiB | qkv peak / file | qkv after / file "
          "| transformers peak / file | transformers after / file | model / file |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    for name, stored, dtype, size, q, t in rows:
        print(f"| {name} | {stored} | {dtype} | {size / 2**20:.0f} | {q['peak'] / size:.2f} | "
              f"{q['after'] / size:.2f} | {t['peak'] / size:.2f} | {t['after'] / size:.2f} | "
              f"{q['params'] / size:.2f} |")


if __name__ == "__main__":
    main()
