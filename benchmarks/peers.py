"""The same attention questions answered by qkv, TransformerLens, nnsight and transformers' eager
``output_attentions``, side by side (issue 42 item 1).

Set-up — the peers live in their own environment, never qkv's dependencies::

    python3 -m venv /work/peers-venv
    /work/peers-venv/bin/pip install torch==2.13.0            # the CPU wheel first: a looser
    echo torch==2.13.0 > /tmp/peers-constraints.txt           # spec pulls GBs of CUDA
    /work/peers-venv/bin/pip install -c /tmp/peers-constraints.txt \\
        "transformer-lens==4.3.*" "nnsight==0.8.*" "transformers==5.24.*"
    # a random GPT-2-small-shaped checkpoint (transformers' GPT2Config defaults):
    PYTHONPATH=src python benchmarks/scale.py make --shape gpt2 --out /tmp/qkv-scale/gpt2
    HF_HUB_OFFLINE=1 PYTHONPATH=src /work/peers-venv/bin/python benchmarks/peers.py \\
        --model /tmp/qkv-scale/gpt2 --lengths 512,2048

(measured: TransformerLens 4.3.0, nnsight 0.8.1, transformers 5.24.0, torch 2.13.0+cpu; qkv from
``src`` on ``PYTHONPATH``, so its own requirements come from that venv too.)

Tasks, head ``--head`` of layer ``--layer`` (default: the middle layer, head 3):

* ``pattern`` — one head's whole (t, t) pattern;
* ``layer``   — one layer's patterns, (h, t, t);
* ``steps``   — one head's step by step for the last token: q, every k and v, scores, weights,
  output (nnsight exposes q, k, v and the pattern; scores are rebuilt by the user);
* ``why``     — the score of one key (the first token) for the last token's query, split over
  the upstream components (embeddings, each earlier head, each MLP, biases): qkv's
  ``score_attribution`` against TransformerLens' ``get_full_resid_decomposition`` (the only peer
  that defines it); the two are checked to agree, component by component.

Every cell runs in a fresh interpreter (tool × task × length, in that order interleaved per
length): load (memory-mapped where the tool allows), fault the weights in, read the resident set
(the baseline; the peak is reset to it through ``/proc/self/clear_refs``, so a loader's transient
copies do not count), run the task once, then read its CPU time (one torch thread; on a loaded machine wall time
measures the others' load), its wall time and the peak resident set (VmHWM): the peak above the
weights. ``error`` is the largest difference from a float64 transformers eager forward of
the same checkpoint (computed in its own cell, after). ``lines`` counts the user's lines of the
task's function below (what a user writes; imports and loading excluded).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from scale import peak_rss, reset_peak, text_of  # noqa: E402

TOOLS = ("qkv", "tl", "nnsight", "eager")
TASKS = ("pattern", "layer", "steps", "why")


# -- what a user writes, per tool and task (each returns tensors compared with the reference) ------
def qkv_pattern(m, text, ids, L, H):
    return qkv_explain().attention_map(m, text, layer=L, head=H).weights


def qkv_layer(m, text, ids, L, H):
    return qkv_explain().attention_maps(m, text, layer=L).weights[0]


def qkv_steps(m, text, ids, L, H):
    st = qkv_explain().explain_head(m, text, layer=L, head=H, token=ids.shape[1] - 1)
    return {"weights": st.weights, "scores": st.scaled, "output": st.output}


def qkv_why(m, text, ids, L, H):
    a = qkv_explain().score_attribution(m, text, layer=L, head=H, token=ids.shape[1] - 1, key=0)
    return {"names": list(a.query_components), "terms": a.terms}


def tl_pattern(m, text, ids, L, H):
    name = f"blocks.{L}.attn.hook_pattern"
    _, cache = m.run_with_cache(ids, names_filter=[name])
    return cache[name][0, H]


def tl_layer(m, text, ids, L, H):
    name = f"blocks.{L}.attn.hook_pattern"
    _, cache = m.run_with_cache(ids, names_filter=[name])
    return cache[name][0]


def tl_steps(m, text, ids, L, H):
    names = [f"blocks.{L}.attn.hook_{x}" for x in ("q", "k", "v", "attn_scores", "pattern", "z")]
    _, cache = m.run_with_cache(ids, names_filter=names)
    i = ids.shape[1] - 1
    q, k, v = (cache[n][0, :, H] for n in names[:3])
    scores = cache[names[3]][0, H, i]
    weights = cache[names[4]][0, H, i]
    return {"weights": weights, "scores": scores, "output": cache[names[5]][0, i, H]}


def tl_why(m, text, ids, L, H):
    m.set_use_attn_result(True)
    _, cache = m.run_with_cache(ids)
    i, j = ids.shape[1] - 1, 0
    stack, labels = cache.get_full_resid_decomposition(layer=L, expand_neurons=False,
                                                       apply_ln=True, return_labels=True)
    ln = m.blocks[L].ln1
    stack = stack[:, 0] * ln.weight  # (C, t, E): each part after ln1's scale and γ
    stack[labels.index("bias")] += ln.bias
    W_Q, W_K = m.W_Q[L, H], m.W_K[L, H]  # (E, d)
    q = stack[:, i] @ W_Q  # (C, d)
    k = stack[:, j] @ W_K
    q[labels.index("bias")] += m.b_Q[L, H]
    k[labels.index("bias")] += m.b_K[L, H]
    return {"names": labels, "terms": q @ k.T / W_Q.shape[-1] ** 0.5}


def nnsight_pattern(m, text, ids, L, H):
    with m.trace(ids, output_attentions=True):
        w = m.transformer.h[L].attn.output[1][0, H].save()
    return w


def nnsight_layer(m, text, ids, L, H):
    with m.trace(ids, output_attentions=True):
        w = m.transformer.h[L].attn.output[1][0].save()
    return w


def nnsight_steps(m, text, ids, L, H):
    i, d = ids.shape[1] - 1, m.config.n_embd // m.config.n_head
    with m.trace(ids, output_attentions=True):
        qkv = m.transformer.h[L].attn.c_attn.output[0].save()  # (t, 3E)
        w = m.transformer.h[L].attn.output[1][0, H, i].save()
    q, k, v = (qkv[:, n * m.config.n_embd + H * d:n * m.config.n_embd + (H + 1) * d] for n in range(3))
    scores = k @ q[i] / d ** 0.5
    return {"weights": w, "scores": scores, "output": w @ v}


def eager_pattern(m, text, ids, L, H):
    return m(ids, output_attentions=True).attentions[L][0, H]


def eager_layer(m, text, ids, L, H):
    return m(ids, output_attentions=True).attentions[L][0]


def eager_steps(m, text, ids, L, H):
    out = m(ids, output_attentions=True, output_hidden_states=True)
    i, d, E = ids.shape[1] - 1, m.config.n_embd // m.config.n_head, m.config.n_embd
    block = m.transformer.h[L]
    qkv = block.attn.c_attn(block.ln_1(out.hidden_states[L][0]))  # (t, 3E)
    q, k, v = (qkv[:, n * E + H * d:n * E + (H + 1) * d] for n in range(3))
    w = out.attentions[L][0, H, i]
    return {"weights": w, "scores": k @ q[i] / d ** 0.5, "output": w @ v}


def qkv_explain():
    import qkv.explain

    return qkv.explain


def lines(fn) -> int:
    """The user's lines of ``fn``'s body (no signature, no blank lines)."""
    body = inspect.getsource(fn).splitlines()[1:]
    return sum(1 for line in body if line.strip())


# -- loading each tool, and the float64 reference ---------------------------------------------------
def load(tool: str, path: str):
    import torch

    if tool == "qkv":
        import qkv

        return qkv.load(path)
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(path, "tokenizer.json"))
    if tool == "tl":
        from transformer_lens.model_bridge import TransformerBridge

        return TransformerBridge.boot_transformers(path, tokenizer=tok, dtype=torch.float32)
    if tool == "nnsight":
        from nnsight import LanguageModel

        hf = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
        return LanguageModel(hf, tokenizer=tok)
    return AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()


def reference(path: str, ids, L: int, H: int) -> dict:
    """float64 transformers eager: layer L's pattern (h, t, t), head H's steps for the last token."""
    import torch
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager",
                                             dtype=torch.float64).eval()
    with torch.no_grad():
        return {"layer": eager_layer(m, None, ids, L, H), "steps": eager_steps(m, None, ids, L, H)}


def error(task: str, got, ref: dict, H: int) -> float:
    import torch

    if task == "pattern":
        return float((got.double() - ref["layer"][H]).abs().max())
    if task == "layer":
        return float((got.double() - ref["layer"]).abs().max())
    if task == "steps":
        return max(float((torch.as_tensor(got[k]).double().flatten() - ref["steps"][k].flatten()).abs().max())
                   for k in ("weights", "scores", "output"))
    return float("nan")


def cell(tool: str, task: str, path: str, n: int, L: int, H: int, threads: int, ref_file: str) -> dict:
    import torch

    torch.set_num_threads(threads)
    m = load(tool, path)
    import qkv
    import qkv.hf.projections  # noqa: F401 (the circuits' first use imports it: outside the timing)

    tokenizer = qkv.load(path).tokenizer if tool != "qkv" else m.tokenizer
    text = text_of(tokenizer, n)
    ids = torch.tensor([tokenizer.encode(text).ids])  # (1, t): the same ids for every tool
    weights = 0
    with torch.no_grad():
        for p in m.parameters():
            weights += p.numel() * p.element_size()
            p.detach().sum()
    del tokenizer
    fn = globals()[f"{tool}_{task}"]
    base = reset_peak()
    start, cpu = time.perf_counter(), time.process_time()
    with torch.no_grad():
        got = fn(m, text, ids, L, H)
    took, cpu = time.perf_counter() - start, time.process_time() - cpu
    peak = peak_rss() - base
    out = {"tool": tool, "task": task, "tokens": int(ids.shape[1]), "time": took, "cpu": cpu,
           "peak_above": max(0, peak), "lines": lines(fn)}
    if task == "why":
        torch.save({k: (v.detach().double() if isinstance(v, torch.Tensor) else v) for k, v in got.items()},
                   f"{ref_file}.{tool}.why")
    elif os.path.exists(ref_file):
        out["error"] = error(task, got, torch.load(ref_file), H)
    return out


def agreement(ref_file: str) -> str:
    """qkv's terms against TransformerLens' on the components both name, summed to match."""
    import torch

    a, b = torch.load(f"{ref_file}.qkv.why"), torch.load(f"{ref_file}.tl.why")
    def group(names):  # qkv name → TL label
        out = []
        for n in names:
            if n.startswith("L") and ".H" in n:
                layer, head = n[1:].split(".H")
                out.append(f"L{layer}H{head}")
            elif n.endswith(".ffn"):
                out.append(f"{n[1:-4]}_mlp_out")
            else:
                out.append({"embed.token": "embed", "embed.position": "pos_embed"}.get(n, n))
        return out
    qa = group(a["names"])
    index = [b["names"].index(x) for x in qa]
    tl = b["terms"][index][:, index]
    diff = float((a["terms"] - tl).abs().max())
    return (f"score attribution: {len(qa)}×{len(qa)} terms, max |qkv − TransformerLens| = {diff:.2g} "
            f"(score {float(a['terms'].sum()):.4f})")


def run_cell(args, tool, task, n, ref_file) -> dict:
    cmd = [sys.executable, __file__, "cell", "--model", args.model, "--tool", tool, "--task", task,
           "--length", str(n), "--layer", str(args.layer), "--head", str(args.head),
           "--threads", str(args.threads), "--ref", ref_file]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"tool": tool, "task": task, "failed": f"over {args.timeout:.0f} s"}
    if done.returncode != 0:
        err = done.stderr.strip().splitlines() or ["?"]
        why = "out of memory (killed)" if done.returncode in (-9, 137) else err[-1][:140]
        return {"tool": tool, "task": task, "failed": why}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    for name in ("cell", "run", "reference"):
        c = sub.add_parser(name)
        c.add_argument("--model", required=True)
        c.add_argument("--layer", type=int, default=6)
        c.add_argument("--head", type=int, default=3)
        c.add_argument("--threads", type=int, default=1)
        if name == "run":
            c.add_argument("--lengths", default="512,2048")
            c.add_argument("--tools", default=",".join(TOOLS))
            c.add_argument("--tasks", default=",".join(TASKS))
            c.add_argument("--timeout", type=float, default=1800)
        else:
            c.add_argument("--length", type=int, default=512)
            c.add_argument("--ref", required=True)
        if name == "cell":
            c.add_argument("--tool", choices=TOOLS, required=True)
            c.add_argument("--task", choices=TASKS, required=True)
    args = p.parse_args()
    if args.command == "cell":
        print(json.dumps(cell(args.tool, args.task, args.model, args.length, args.layer, args.head,
                              args.threads, args.ref)))
        return
    if args.command == "reference":
        import torch

        import qkv

        tok = qkv.load(args.model).tokenizer
        ids = torch.tensor([tok.encode(text_of(tok, args.length)).ids])
        torch.save(reference(args.model, ids, args.layer, args.head), args.ref)
        return
    print(f"{args.model}: layer {args.layer} head {args.head}, {args.threads} thread(s), a fresh "
          f"interpreter per cell; peak = max RSS above the resident weights")
    for n in map(int, args.lengths.split(",")):
        ref_file = f"/tmp/qkv-peers-ref-{n}.pt"
        done = subprocess.run([sys.executable, __file__, "reference", "--model", args.model, "--length",
                               str(n), "--layer", str(args.layer), "--head", str(args.head),
                               "--ref", ref_file], capture_output=True, text=True)
        if done.returncode != 0:
            print(f"  N={n}: the float64 reference failed ({done.stderr.strip().splitlines()[-1:]}); "
                  f"errors left out")
        for task in args.tasks.split(","):
            for tool in args.tools.split(","):
                if task == "why" and tool not in ("qkv", "tl"):
                    continue
                r = run_cell(args, tool, task, n, ref_file)
                if "failed" in r:
                    print(f"  N={n:5d} {task:8s} {tool:8s} failed: {r['failed']}", flush=True)
                    continue
                err = f"{r['error']:.1e}" if "error" in r else "  -   "
                print(f"  N={r['tokens']:5d} {task:8s} {tool:8s} cpu {r['cpu']:8.2f} s (wall "
                      f"{r['time']:8.2f} s)  peak "
                      f"{r['peak_above'] / 2**20:8.0f} MiB  max err {err}  {r['lines']:2d} lines",
                      flush=True)
            if task == "why" and "qkv" in args.tools and "tl" in args.tools:
                try:
                    print("  " + agreement(ref_file), flush=True)
                except Exception as e:  # a failed cell leaves no terms to compare
                    print(f"  score attribution: no comparison ({e})", flush=True)


if __name__ == "__main__":
    main()
