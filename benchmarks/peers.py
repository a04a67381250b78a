"""The same attention questions answered by qkv, TransformerLens, nnsight and transformers' eager
``output_attentions``, side by side (issue 42 item 1).

Set-up — the peers live in their own environment, never qkv's dependencies::

    python3 -m venv /work/peers-venv
    /work/peers-venv/bin/pip install torch==2.13.0            # the CPU wheel first: a looser
    echo torch==2.13.0 > /tmp/peers-constraints.txt           # spec pulls GBs of CUDA
    /work/peers-venv/bin/pip install -c /tmp/peers-constraints.txt \\
        "transformer-lens==4.3.*" "nnsight==0.8.*" "transformers==5.24.*"
    # random checkpoints of the three shapes (``--tiny``: 2 layers, 4 for the hybrid — for checks):
    PYTHONPATH=src /work/peers-venv/bin/python benchmarks/peers.py make --shape gpt2
    PYTHONPATH=src /work/peers-venv/bin/python benchmarks/peers.py make --shape llama1b
    PYTHONPATH=src /work/peers-venv/bin/python benchmarks/peers.py make --shape hybrid
    # what each cell should cost, then the cells
    HF_HUB_OFFLINE=1 PYTHONPATH=src /work/peers-venv/bin/python benchmarks/peers.py run \\
        --shape gpt2 --lengths 8192,32768 --plan
    HF_HUB_OFFLINE=1 PYTHONPATH=src /work/peers-venv/bin/python benchmarks/peers.py run \\
        --shape gpt2 --lengths 8192,32768 --tools qkv,tl,nnsight,eager --tasks pattern,layer,steps,why

(measured: TransformerLens 4.3.0, nnsight 0.8.1, transformers 5.24.0, torch 2.13.0+cpu; qkv from
``src`` on ``PYTHONPATH``, so its own requirements come from that venv too.)

Shapes (``--shape``; random weights, float32 — bf16 matmul is ~200× slower on an AVX2 CPU without
AVX512-BF16, RESULTS.md; the shipped lm's word tokenizer, so the ids are small):

* ``gpt2``    — transformers' ``GPT2Config()`` (124M), ``n_positions`` 32768;
* ``llama1b`` — Llama-3.2-1B's shape: hidden 2048, 16 layers, 32 heads, 8 kv heads, intermediate
  8192, vocab 128256 (tied), rope θ 500000 (1.24B, 4.9 GB float32);
* ``hybrid``  — a Qwen3.5-shaped hybrid (issue 39): hidden 1024, 12 layers, every 4th full (gated)
  attention, the others Gated DeltaNet; 8 heads, 2 kv heads, head_dim 256, intermediate 3584,
  vocab 151936 (tied) (~0.4B). The layer asked for is the full-attention layer at or after the
  middle.

Tasks, head ``--head`` of layer ``--layer`` (default: the middle layer, head 3):

* ``pattern`` — one head's whole (t, t) pattern, in memory, float32 (qkv: ``attention_map``; at
  32k tokens that tensor alone is 4 GiB);
* ``stream``  — (qkv only) the same pattern as a long text's answer: ``document()`` (one forward,
  O(N) memory), then every row of the head, 256 rows at a time, written to a float16 ``.npy`` on
  disk (2 GiB at 32k) by plain writes — the process never holds more than a block of rows;
* ``layer``   — one layer's patterns, (h, t, t);
* ``steps``   — one head's step by step for the last token: q, every k and v, scores, weights,
  output (nnsight exposes q, k, v and the pattern; scores are rebuilt by the user);
* ``why``     — the score of one key (the first token) for the last token's query, split over
  the upstream components (embeddings, each earlier head, each MLP, biases): qkv's
  ``score_attribution`` against TransformerLens' ``get_full_resid_decomposition`` (the only peer
  that defines it; written for GPT-2 — a rotary model's decomposition needs each part rotated by
  hand); the two are checked to agree, component by component.

Every cell runs in a fresh interpreter (tool × task × length, in that order interleaved per
length): load (memory-mapped where the tool allows), fault the weights in, read the resident set
(the baseline; the peak is reset to it through ``/proc/self/clear_refs``, so a loader's transient
copies do not count), run the task once, then read its CPU time (one torch thread; on a loaded machine wall time
measures the others' load), its wall time and the peak resident set (VmHWM): the peak above the
weights. ``lines`` counts the user's lines of the task's function below (what a user writes;
imports and loading excluded).

Memory cap (``--mem-cap``, GiB, default 16): each cell (and each reference) runs with its address
space limited (``RLIMIT_AS`` = the cap + the checkpoint's bytes, which loaders map, + 8 GiB of
virtual slack for the interpreter and libraries), and the parent kills it the moment its resident
set passes the cap (polled every 50 ms). Either way the row says "out of memory at N" — an
allocation refused, or the resident set over the cap — instead of swapping or taking the machine.

``error`` — the largest difference from float64:

* GPT-2 at N ≤ ``--eager-ref-max`` (2048): a float64 transformers eager forward (every row);
* otherwise (8k and 32k, and every length of the other shapes): **sampled rows** — transformers'
  own forward in float32 (``sdpa``: O(N) memory) up to the layer asked for, then that layer in
  float64 (its norm, projections, rotary, q/k norms, as transformers defines them; its input cast
  up), and 17 query rows (evenly spaced, the last included) of every head recomputed from its q
  and k in float64: softmax(q kᵀ · scale) under the causal mask. The error column compares those
  rows (and the last token's scores, weights and output); the upstream layers are float32 in
  the reference, as in every tool. ``stream``'s rows carry float16's rounding (≤ 2⁻¹² relative).

``--plan`` prints each cell's estimated CPU time (one thread, a quiet machine) and peak, from
a cost model calibrated on the measured GPT-2 rows (RESULTS.md: 512/2048) and the small runs:
linear layers at 55 GFLOP/s, a materialised attention element (score, softmax, pattern kept)
22 ns, qkv's blockwise element 2.8 ns; a cell whose estimated peak passes the cap is expected to
fail at its first large allocation (seconds).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import re
import resource
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from scale import WORDS, peak_rss, reset_peak  # noqa: E402

TOOLS = ("qkv", "tl", "nnsight", "eager")
TASKS = ("pattern", "stream", "layer", "steps", "why")
GIB = 2**30
SAMPLED_ROWS = 16  # + the last: the rows the float64 reference recomputes past --eager-ref-max
STREAM_ROWS = 256  # rows of the pattern written at a time by ``stream``

# -- the checkpoints -------------------------------------------------------------------------------
HYBRID_TYPES = ["linear_attention"] * 3 + ["full_attention"]
SHAPES = {  # name: (config class, model class, config, --tiny's changes)
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(n_positions=32768), dict(n_layer=2)),
    "llama1b": ("LlamaConfig", "LlamaForCausalLM",
                dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=64, intermediate_size=8192, vocab_size=128256,
                     rope_theta=500000.0, max_position_embeddings=32768, tie_word_embeddings=True),
                dict(num_hidden_layers=2)),
    "hybrid": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM",
               dict(hidden_size=1024, num_hidden_layers=12, layer_types=HYBRID_TYPES * 3,
                    num_attention_heads=8, num_key_value_heads=2, head_dim=256,
                    intermediate_size=3584, vocab_size=151936, max_position_embeddings=32768,
                    linear_num_key_heads=16, linear_num_value_heads=16, linear_key_head_dim=128,
                    linear_value_head_dim=128, linear_conv_kernel_dim=4, tie_word_embeddings=True),
               dict(num_hidden_layers=4, layer_types=["linear_attention", "full_attention"] * 2)),
}
LENGTHS = {"gpt2": "512,2048,8192,32768", "llama1b": "512,2048", "hybrid": "512,2048"}


def make(shape: str, out: str, tiny: bool) -> None:
    """A random float32 checkpoint of ``shape`` saved by transformers, with the shipped lm's
    tokenizer (a small word vocabulary: the text's length is what is measured)."""
    import shutil

    import torch
    import transformers

    torch.manual_seed(0)
    config, model, kwargs, small = SHAPES[shape]
    cfg = getattr(transformers, config)(**(kwargs | (small if tiny else {})))
    m = getattr(transformers, model)(cfg)
    m.save_pretrained(out, safe_serialization=True)
    import qkv

    shutil.copy(os.path.join(os.path.dirname(qkv.__file__), "data", "lm", "tokenizer.json"), out)
    print(f"{out}: {shape}{' (tiny)' if tiny else ''}, "
          f"{sum(p.numel() for p in m.parameters()) / 1e6:.0f}M parameters")


def text_of(tokenizer, n: int) -> str:
    """A text of at most ``n`` tokens (``scale.text_of``'s words; probed past the model's limit,
    so ``n`` may be the model's whole context)."""
    words = [WORDS[(i * 7 + i // 16) % len(WORDS)] for i in range(n)]
    lo, hi = 1, n
    while lo < hi:  # the most words whose encoding holds ≤ n tokens
        mid = (lo + hi + 1) // 2
        if len(tokenizer.encode(" ".join(words[:mid]), max_length=4 * n + 8).ids) <= n:
            lo = mid
        else:
            hi = mid - 1
    return " ".join(words[:lo])


def config_of(path: str) -> dict:
    with open(os.path.join(path, "config.json")) as f:
        return json.load(f)


def family(cfg: dict) -> str:
    """``gpt2`` (fused c_attn, learned positions), ``rope`` (q/k/v projections, rotary) or
    ``hybrid`` (rotary softmax layers among linear ones: ``layer_types``)."""
    return "gpt2" if cfg["model_type"] == "gpt2" else "hybrid" if cfg.get("layer_types") else "rope"


def families(fam: str) -> list[str]:
    """``fam`` and the families whose code it shares, most specific first ("" = GPT-2's)."""
    return {"gpt2": [""], "rope": ["_rope", ""], "hybrid": ["_hybrid", "_rope", ""]}[fam]


def default_layer(cfg: dict) -> int:
    """The middle layer; for a hybrid, the first full-attention layer at or after it."""
    n = cfg.get("num_hidden_layers") or cfg["n_layer"]
    types = cfg.get("layer_types")
    if not types:
        return n // 2
    return next(i for i in list(range(n // 2, n)) + list(range(n)) if types[i] == "full_attention")


# -- what a user writes, per tool and task (each returns tensors compared with the reference) ------
def qkv_pattern(m, text, ids, L, H):
    return qkv_explain().attention_map(m, text, layer=L, head=H).weights


def qkv_stream(m, text, ids, L, H):
    doc, t = qkv_explain().document(m, text), ids.shape[1]
    with open(stream_file(), "wb") as f:
        numpy().lib.format.write_array_header_1_0(f, {"descr": "<f2", "fortran_order": False, "shape": (t, t)})
        for start in range(0, t, STREAM_ROWS):
            f.write(doc.weights(L, H, range(start, min(t, start + STREAM_ROWS))).half().numpy().tobytes())
    return stream_file()


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


def tl_steps_rope(m, text, ids, L, H):
    names = [f"blocks.{L}.attn.hook_{x}" for x in ("rot_q", "rot_k", "v", "attn_scores", "pattern")]
    _, cache = m.run_with_cache(ids, names_filter=names)
    i, g = ids.shape[1] - 1, cache[names[0]].shape[2] // cache[names[1]].shape[2]
    q, k, v = cache[names[0]][0, :, H], cache[names[1]][0, :, H // g], cache[names[2]][0, :, H // g]  # noqa: F841 (the steps a user reads; scores and weights are compared)
    scores = cache[names[3]][0, H, i]
    weights = cache[names[4]][0, H, i]
    return {"weights": weights, "scores": scores, "output": weights @ v}  # z: after a gate, if any


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


def nnsight_pattern_rope(m, text, ids, L, H):
    with m.trace(ids, output_attentions=True):
        w = m.model.layers[L].self_attn.output[1][0, H].save()
    return w


def nnsight_layer(m, text, ids, L, H):
    with m.trace(ids, output_attentions=True):
        w = m.transformer.h[L].attn.output[1][0].save()
    return w


def nnsight_layer_rope(m, text, ids, L, H):
    with m.trace(ids, output_attentions=True):
        w = m.model.layers[L].self_attn.output[1][0].save()
    return w


def nnsight_steps(m, text, ids, L, H):
    i, d = ids.shape[1] - 1, m.config.n_embd // m.config.n_head
    with m.trace(ids, output_attentions=True):
        qkv = m.transformer.h[L].attn.c_attn.output[0].save()  # (t, 3E)
        w = m.transformer.h[L].attn.output[1][0, H, i].save()
    q, k, v = (qkv[:, n * m.config.n_embd + H * d:n * m.config.n_embd + (H + 1) * d] for n in range(3))
    scores = k @ q[i] / d ** 0.5
    return {"weights": w, "scores": scores, "output": w @ v}


def nnsight_steps_rope(m, text, ids, L, H):
    i, attn = ids.shape[1] - 1, m.model.layers[L].self_attn
    with m.trace(ids, output_attentions=True):
        args = attn.source.attention_interface_1.inputs[0]  # (self, q, k, v, mask): after rotary
        q, k, v = (x[0].save() for x in args[1:4])  # (h, t, d), (h_kv, t, d) twice
        w = attn.output[1][0, H, i].save()
    g = q.shape[0] // k.shape[0]
    scores = k[H // g] @ q[H, i] * attn._module.scaling
    return {"weights": w, "scores": scores, "output": w @ v[H // g]}


def eager_pattern(m, text, ids, L, H):
    return m(ids, output_attentions=True).attentions[L][0, H]


def eager_layer(m, text, ids, L, H):
    return m(ids, output_attentions=True).attentions[L][0]


def eager_pattern_hybrid(m, text, ids, L, H):
    softmax_layers = [i for i, t in enumerate(m.config.layer_types) if t == "full_attention"]
    return m(ids, output_attentions=True).attentions[softmax_layers.index(L)][0, H]


def eager_layer_hybrid(m, text, ids, L, H):
    softmax_layers = [i for i, t in enumerate(m.config.layer_types) if t == "full_attention"]
    return m(ids, output_attentions=True).attentions[softmax_layers.index(L)][0]


def eager_steps(m, text, ids, L, H):
    out = m(ids, output_attentions=True, output_hidden_states=True)
    i, d, E = ids.shape[1] - 1, m.config.n_embd // m.config.n_head, m.config.n_embd
    block = m.transformer.h[L]
    qkv = block.attn.c_attn(block.ln_1(out.hidden_states[L][0]))  # (t, 3E)
    q, k, v = (qkv[:, n * E + H * d:n * E + (H + 1) * d] for n in range(3))
    w = out.attentions[L][0, H, i]
    return {"weights": w, "scores": k @ q[i] / d ** 0.5, "output": w @ v}


def eager_steps_rope(m, text, ids, L, H):
    import torch
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    out = m(ids, output_attentions=True, output_hidden_states=True)
    layer, i = m.model.layers[L], ids.shape[1] - 1
    attn, x = layer.self_attn, layer.input_layernorm(out.hidden_states[L])  # (1, t, E)
    d, g = attn.head_dim, m.config.num_attention_heads // m.config.num_key_value_heads
    q = attn.q_proj(x)[..., H * d:(H + 1) * d]  # (1, t, d)
    k, v = (p(x)[..., H // g * d:(H // g + 1) * d] for p in (attn.k_proj, attn.v_proj))
    cos, sin = m.model.rotary_emb(x, torch.arange(ids.shape[1])[None])
    q, k = apply_rotary_pos_emb(q[:, None], k[:, None], cos, sin)  # (1, 1, t, d)
    w = out.attentions[L][0, H, i]
    return {"weights": w, "scores": k[0, 0] @ q[0, 0, i] * attn.scaling, "output": w @ v[0]}


#: (tool, task, family) a user's code is not written for here, and why
NOT_WRITTEN = {
    ("eager", "steps", "hybrid"): "the gated q, q/k norms and partial rotary rebuilt by hand: not written",
    ("tl", "why", "rope"): "a rotary decomposition (each part's q and k rotated by hand): not written",
}


def user_function(tool: str, task: str, fam: str):
    """The function a user of ``tool`` writes for ``task`` on a model of family ``fam``."""
    return next(globals()[f"{tool}_{task}{f}"] for f in families(fam) if f"{tool}_{task}{f}" in globals())


def not_written(tool: str, task: str, fam: str) -> str | None:
    """Why no user code is written for this cell, or None."""
    return next((NOT_WRITTEN[(tool, task, f.strip("_") or "gpt2")] for f in families(fam)
                 if (tool, task, f.strip("_") or "gpt2") in NOT_WRITTEN), None)


def qkv_explain():
    import qkv.explain

    return qkv.explain


def numpy():
    import numpy

    return numpy


def stream_file() -> str:
    return os.environ["QKV_PEERS_STREAM"]


def lines(fn) -> int:
    """The user's lines of ``fn``'s body (no signature, no blank lines)."""
    body = inspect.getsource(fn).splitlines()[1:]
    return sum(1 for line in body if line.strip())


# -- loading each tool, and the float64 references -------------------------------------------------
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


def reference_eager(path: str, ids, L: int, H: int) -> dict:
    """float64 transformers eager (GPT-2): layer L's pattern (h, t, t) at every row, head H's
    steps for the last token."""
    import torch
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager",
                                             dtype=torch.float64).eval()
    with torch.no_grad():
        return {"rows": torch.arange(ids.shape[1]), "layer": eager_layer(m, None, ids, L, H),
                "steps": eager_steps(m, None, ids, L, H)}


def sampled_rows(t: int):
    import torch

    return torch.linspace(0, t - 1, SAMPLED_ROWS + 1).round().long().unique()  # (r,): 0 … t − 1


class _Stop(Exception):
    """Raised inside layer L's attention once its q, k and v are read: nothing after it runs."""


def reference_rows(path: str, ids, L: int, H: int) -> dict:
    """Sampled rows in float64 (see the module doc): transformers' sdpa forward in float32 up to
    layer L, layer L in float64 from its input on; its attention's q, k, v (after rotary and
    norms, as the model computes them) give the rows' softmax(q kᵀ · scale), causal."""
    import torch
    from transformers import AttentionInterface, AutoModelForCausalLM
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    m = AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa").eval()
    layers = m.transformer.h if hasattr(m, "transformer") else m.model.layers
    target = layers[L].attn if hasattr(layers[L], "attn") else layers[L].self_attn
    layers[L].double()
    up = lambda x: x.double() if torch.is_tensor(x) and x.is_floating_point() else x  # noqa: E731

    def cast(module, args, kwargs):  # the layer's input (and rotary cos/sin) in float64
        kwargs = {k: tuple(map(up, v)) if isinstance(v, tuple) else up(v) for k, v in kwargs.items()}
        return tuple(map(up, args)), kwargs

    layers[L].register_forward_pre_hook(cast, with_kwargs=True)
    t = ids.shape[1]
    rows, got = sampled_rows(t), {}

    def attention(module, query, key, value, attention_mask, **kwargs):
        if module is not target:
            return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
        scale = kwargs.get("scaling") or query.shape[-1] ** -0.5
        g = query.shape[1] // key.shape[1]
        k = key[0].double().repeat_interleave(g, 0)  # (h, s, d)
        v = value[0].double().repeat_interleave(g, 0)
        scores = query[0, :, rows].double() @ k.transpose(1, 2) * scale  # (h, r, s)
        future = torch.arange(t)[None, :] > rows[:, None]  # (r, s)
        w = scores.masked_fill(future, float("-inf")).softmax(-1)
        got.update(layer=w, steps={"weights": w[H, -1], "scores": scores[H, -1], "output": w[H, -1] @ v[H]})
        raise _Stop

    AttentionInterface.register("qkv_reference", attention)
    AttentionMaskInterface.register("qkv_reference", sdpa_mask)
    m.set_attn_implementation("qkv_reference")
    with torch.no_grad():
        try:
            m(ids)
        except _Stop:
            pass
    return {"rows": rows, **got}


def error(task: str, got, ref: dict, H: int) -> float:
    import torch

    rows = ref["rows"]
    if task == "stream":
        got = torch.from_numpy(numpy().load(got, mmap_mode="r")[rows.numpy()].astype("float64"))
        return float((got - ref["layer"][H]).abs().max())
    if task == "pattern":
        return float((got[rows].double() - ref["layer"][H]).abs().max())
    if task == "layer":
        return float((got[:, rows].double() - ref["layer"]).abs().max())
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
    fn = user_function(tool, task, family(config_of(path)))
    base = reset_peak()
    start, cpu = time.perf_counter(), time.process_time()
    with torch.no_grad():
        got = fn(m, text, ids, L, H)
    took, cpu = time.perf_counter() - start, time.process_time() - cpu
    peak = peak_rss() - base
    out = {"tool": tool, "task": task, "tokens": int(ids.shape[1]), "time": took, "cpu": cpu,
           "peak_above": max(0, peak), "weights": weights, "lines": lines(fn)}
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


# -- a child under a memory cap --------------------------------------------------------------------
def capped(cmd: list[str], cap: int, mapped: int, timeout: float, n: int) -> tuple[dict | None, str | None]:
    """Run ``cmd`` with its address space limited to ``cap + mapped + 8 GiB`` and killed when its
    resident set passes ``cap``; (its last stdout line as JSON, None) or (None, why it failed)."""
    limit = cap + mapped + 8 * GIB

    def limited():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        child = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, preexec_fn=limited)
        start, over = time.monotonic(), False
        while child.poll() is None:
            if rss_of(child.pid) > cap:
                over = True
                child.send_signal(signal.SIGKILL)
            elif time.monotonic() - start > timeout:
                child.send_signal(signal.SIGKILL)
                child.wait()
                return None, f"over {timeout:.0f} s"
            time.sleep(0.05)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if over:
        return None, f"out of memory at {n} (resident set over the {cap / GIB:.0f} GiB cap)"
    if child.returncode != 0:
        if re.search(r"can't allocate memory|MemoryError|bad_alloc|Cannot allocate memory", stderr):
            return None, f"out of memory at {n} (an allocation refused under the {cap / GIB:.0f} GiB cap)"
        if child.returncode in (-9, 137):
            return None, f"out of memory at {n} (killed)"
        return None, first_error_line(stderr)
    return json.loads(stdout.strip().splitlines()[-1]), None


def rss_of(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def first_error_line(stderr: str) -> str:
    """The exception's first line: the last line of the traceback that names an exception."""
    lines_ = stderr.strip().splitlines() or ["?"]
    named = [x for x in lines_ if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Exit)\b", x)]
    return (named[-1] if named else lines_[-1])[:160]


def shape_config(shape: str) -> dict:
    """``shape``'s config as its config.json would hold it (for --plan before ``make``)."""
    import transformers

    config, _, kwargs, _ = SHAPES[shape]
    return getattr(transformers, config)(**kwargs).to_dict()


def shape_bytes(shape: str) -> int:
    """The float32 bytes of ``shape``'s weights, counted on the meta device (nothing allocated)."""
    import torch
    import transformers

    config, model, kwargs, _ = SHAPES[shape]
    with torch.device("meta"):
        m = getattr(transformers, model)(getattr(transformers, config)(**kwargs))
    return sum(p.numel() for p in m.parameters()) * 4


def checkpoint_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path) if f.endswith(".safetensors"))


# -- the cost model behind --plan ------------------------------------------------------------------
RATE = 55e9  # linear layers, FLOP/s, one fp32 thread (calibrated: GPT-2 forwards at 512/2048)
MATERIALISED = 22e-9  # s per (head, query, key) element of an eager attention that keeps its pattern
BLOCKWISE = 2.8e-9  # s per element of qkv's blockwise attention (causal half, q·k and w·v, exp)
SDPA = 8e-9  # s per (head, query, key) element of transformers' sdpa forward (the reference)
START = 8.0  # s: interpreter, imports, tokenising, outside the timed task
INTERPRETER = 0.7 * GIB  # resident before the weights: python, torch, transformers (and the peer)


def estimate(cfg: dict, size: int, tool: str, task: str, n: int, L: int) -> tuple[float, int]:
    """(CPU seconds of the timed task, peak bytes above the weights) for one cell — a model, not
    a measurement: see the module doc."""
    layers = cfg.get("num_hidden_layers") or cfg["n_layer"]
    heads = cfg.get("num_attention_heads") or cfg["n_head"]
    width = cfg.get("hidden_size") or cfg["n_embd"]
    vocab, d = cfg["vocab_size"], cfg.get("head_dim") or width // heads
    full = [t == "full_attention" for t in cfg.get("layer_types") or ["full_attention"] * layers]
    head_params = vocab * width
    per_layer = (size / 4 - head_params - cfg.get("n_positions", 0) * width) / layers
    own = tool == "qkv"  # qkv stops after L: its own layers, and a transformers model's loop (a hook)
    run = L + 1 if own and task != "stream" else layers
    attn = sum(full[:run]) * heads * n * n * d / 64  # (head, query, key) elements
    linear = 2 * per_layer * run * n + (0 if own else 2 * head_params * n)
    logits = 0 if own else n * vocab * 4
    if tool == "qkv" and own:
        cpu = linear / RATE + attn * BLOCKWISE + (n * n * d * 4 / RATE if task in ("pattern", "stream") else 0)
        # pattern: 1.15 × the (t, t) answer (measured at 32k, GPT-2 shape, 2 layers: 4.6 GiB
        # for a 4 GiB map, since the NaN check reads row sums; it was 2.9 ×, +11.4 GiB);
        # stream: document()'s record, 12 vectors of the width per layer and token (GPT-2 at
        # 8192: +3.6 GB); steps, why: ~40 vectors of the width per token (GPT-2 at 2048: +0.2 GB)
        answer = {"pattern": 1.15 * n * n * 4, "layer": heads * n * n * 4}
        if task in answer:
            return cpu, int(answer[task] + 8 * n * width * 4)
        return cpu, (12 * layers if task == "stream" else 40) * n * width * 4
    cpu = linear / RATE + attn * MATERIALISED
    kept = sum(full) * heads * n * n * 4 if tool in ("eager", "nnsight") else 3 * heads * n * n * 4
    if tool == "tl" and task == "why":  # every hook of every layer (GPT-2 at 2048: 9.7 GB measured)
        kept = 2 * layers * heads * n * n * 4 + 60 * layers * n * width * 4
    return cpu, kept + logits + 40 * n * width * 4


def reference_estimate(cfg: dict, size: int, n: int, args) -> float:
    """Wall seconds of the (untimed) float64 reference: eager float64 ≈ 4 × an eager float32
    forward; sampled rows ≈ transformers' sdpa forward up to the layer, at ``SDPA`` s per
    element (measured: GPT-2 shape, 2 layers, 32k tokens, 209 s wall on 2 loaded threads)."""
    if eager_reference(cfg, n, args):
        return 4 * estimate(cfg, size, "eager", "pattern", n, args.layer)[0]
    heads = cfg.get("num_attention_heads") or cfg["n_head"]
    layers = cfg.get("num_hidden_layers") or cfg["n_layer"]
    width = cfg.get("hidden_size") or cfg["n_embd"]
    full = [t == "full_attention" for t in cfg.get("layer_types") or ["full_attention"] * layers]
    per_layer = (size / 4 - cfg["vocab_size"] * width - cfg.get("n_positions", 0) * width) / layers
    linear = 2 * per_layer * (args.layer + 1) * n / RATE
    return (linear + sum(full[:args.layer]) * heads * n * n * SDPA) / args.ref_threads + START


def plan(args, cfg: dict, size: int) -> None:
    """Print each cell's estimate and the total (what fits a quiet window)."""
    total = 0.0
    print(f"{args.model}: {size / GIB:.2f} GiB of weights, layer {args.layer} head {args.head}; "
          f"estimates (CPU s of the task, one thread, quiet; + ~{START:.0f} s a cell to start and load; "
          f"cap {args.mem_cap:g} GiB):")
    for n in map(int, args.lengths.split(",")):
        ref = "eager float64" if eager_reference(cfg, n, args) else "sampled rows"
        rcpu = reference_estimate(cfg, size, n, args) if n <= args.rows_ref_max else 0.0
        print(f"  N={n:6d} reference ({ref}): ~{rcpu:7.0f} s" if n <= args.rows_ref_max
              else f"  N={n:6d} no reference (past --rows-ref-max): no error column")
        total += rcpu + START
        for task, tool in cells(args, cfg):
            if not_written(tool, task, family(cfg)):
                continue
            cpu, peak = estimate(cfg, size, tool, task, n, args.layer)
            fails = peak + size + INTERPRETER > args.mem_cap * GIB
            shown = "expect out of memory (fails at its first large allocation)" if fails else f"~{cpu:7.0f} s"
            print(f"  N={n:6d} {task:8s} {tool:8s} {shown:>10s}   peak ~{peak / GIB:7.2f} GiB above the weights")
            total += START + (size / 1e9 if fails else cpu)
    print(f"  total ≈ {total / 60:.0f} min (wall ≈ CPU on a quiet machine)")


def cells(args, cfg: dict):
    for task in args.tasks.split(","):
        for tool in args.tools.split(","):
            if task == "why" and tool not in ("qkv", "tl") or task == "stream" and tool != "qkv":
                continue
            yield task, tool


def eager_reference(cfg: dict, n: int, args) -> bool:
    return family(cfg) == "gpt2" and n <= args.eager_ref_max


def run_cell(args, tool, task, n, ref_file) -> dict:
    cmd = [sys.executable, __file__, "cell", "--model", args.model, "--tool", tool, "--task", task,
           "--length", str(n), "--layer", str(args.layer), "--head", str(args.head),
           "--threads", str(args.threads), "--ref", ref_file]
    r, why = capped(cmd, int(args.mem_cap * GIB), checkpoint_bytes(args.model), args.timeout, n)
    return r if r is not None else {"tool": tool, "task": task, "failed": why}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    mk = sub.add_parser("make")
    mk.add_argument("--shape", choices=sorted(SHAPES), required=True)
    mk.add_argument("--out", default=None, help="default /tmp/qkv-peers/SHAPE (SHAPE-tiny)")
    mk.add_argument("--tiny", action="store_true", help="2 layers (the hybrid: 4): for checks")
    for name in ("cell", "run", "reference"):
        c = sub.add_parser(name)
        c.add_argument("--model", default=None, help="a checkpoint directory (default: --shape's)")
        c.add_argument("--layer", type=int, default=None, help="default: the middle (attention) layer")
        c.add_argument("--head", type=int, default=3)
        c.add_argument("--threads", type=int, default=1)
        if name == "run":
            c.add_argument("--shape", choices=sorted(SHAPES), default="gpt2")
            c.add_argument("--lengths", default=None, help="default: the shape's (gpt2: 512,2048,8192,32768)")
            c.add_argument("--tools", default=",".join(TOOLS))
            c.add_argument("--tasks", default=",".join(TASKS))
            c.add_argument("--timeout", type=float, default=1800)
            c.add_argument("--mem-cap", type=float, default=16.0, help="GiB a cell may hold (default 16)")
            c.add_argument("--eager-ref-max", type=int, default=2048,
                           help="the longest N with a float64 eager reference (GPT-2); past it: sampled rows")
            c.add_argument("--rows-ref-max", type=int, default=32768,
                           help="the longest N given a reference (the error column); past it none")
            c.add_argument("--ref-threads", type=int, default=os.cpu_count() or 1,
                           help="threads of the (untimed) reference")
            c.add_argument("--plan", action="store_true", help="print each cell's estimate; run nothing")
        else:
            c.add_argument("--length", type=int, default=512)
            c.add_argument("--ref", required=True)
        if name == "cell":
            c.add_argument("--tool", choices=TOOLS, required=True)
            c.add_argument("--task", choices=TASKS, required=True)
        if name == "reference":
            c.add_argument("--kind", choices=("eager", "rows"), required=True)
    args = p.parse_args()
    if args.command == "make":
        make(args.shape, args.out or f"/tmp/qkv-peers/{args.shape}{'-tiny' if args.tiny else ''}", args.tiny)
        return
    args.model = args.model or f"/tmp/qkv-peers/{getattr(args, 'shape', 'gpt2')}"
    unmade = getattr(args, "plan", False) and not os.path.exists(args.model)
    cfg = shape_config(args.shape) if unmade else config_of(args.model)
    args.layer = default_layer(cfg) if args.layer is None else args.layer
    if args.command == "cell":
        print(json.dumps(cell(args.tool, args.task, args.model, args.length, args.layer, args.head,
                              args.threads, args.ref)))
        return
    if args.command == "reference":
        import torch

        import qkv

        torch.set_num_threads(args.threads)
        tok = qkv.load(args.model).tokenizer
        ids = torch.tensor([tok.encode(text_of(tok, args.length)).ids])
        make_ref = reference_eager if args.kind == "eager" else reference_rows
        torch.save(make_ref(args.model, ids, args.layer, args.head), args.ref)
        print("{}")
        return
    args.lengths = args.lengths or LENGTHS[args.shape]
    size = shape_bytes(args.shape) if unmade else checkpoint_bytes(args.model)
    if args.plan:
        plan(args, cfg, size)
        return
    fam = family(cfg)
    print(f"{args.model}: layer {args.layer} head {args.head}, {args.threads} thread(s), a fresh "
          f"interpreter per cell under a {args.mem_cap:g} GiB cap; peak = max RSS above the resident weights")
    os.environ["QKV_PEERS_STREAM"] = os.path.join(tempfile.gettempdir(), "qkv-peers-stream.npy")
    for n in map(int, args.lengths.split(",")):
        tag = os.path.basename(os.path.normpath(args.model))
        ref_file = f"/tmp/qkv-peers-ref-{tag}-{n}.pt"
        kind = "eager" if eager_reference(cfg, n, args) else "rows"
        if n > args.rows_ref_max:
            kind = None
        for old in (ref_file, f"{ref_file}.qkv.why", f"{ref_file}.tl.why"):
            if os.path.exists(old):
                os.remove(old)
        cmd = [sys.executable, __file__, "reference", "--model", args.model, "--length", str(n),
               "--layer", str(args.layer), "--head", str(args.head), "--ref", ref_file, "--kind", kind,
               "--threads", str(args.ref_threads)]
        start = time.perf_counter()
        _, why = capped(cmd, int(args.mem_cap * GIB), checkpoint_bytes(args.model), args.timeout, n) \
            if kind else (None, "past --rows-ref-max")
        print(f"  N={n}: float64 reference ({'eager, every row' if kind == 'eager' else 'sampled rows'}) "
              + (f"failed: {why}; errors left out" if why else f"{time.perf_counter() - start:.0f} s"), flush=True)
        for task, tool in cells(args, cfg):
            skip = not_written(tool, task, fam)
            if skip:
                print(f"  N={n:5d} {task:8s} {tool:8s} {skip}", flush=True)
                continue
            r = run_cell(args, tool, task, n, ref_file)
            if "failed" in r:
                what = "failed" if r["failed"].startswith(("out of", "over")) else "unsupported"
                print(f"  N={n:5d} {task:8s} {tool:8s} {what}: {r['failed']}", flush=True)
                continue
            err = f"{r['error']:.1e}" if "error" in r else "  -   "
            print(f"  N={r['tokens']:5d} {task:8s} {tool:8s} cpu {r['cpu']:8.2f} s (wall "
                  f"{r['time']:8.2f} s)  peak "
                  f"{r['peak_above'] / 2**20:8.0f} MiB  max err {err}  {r['lines']:2d} lines",
                  flush=True)
        if all(os.path.exists(f"{ref_file}.{t}.why") for t in ("qkv", "tl")):
            try:
                print("  " + agreement(ref_file), flush=True)
            except Exception as e:  # a failed cell leaves no terms to compare
                print(f"  score attribution: no comparison ({e})", flush=True)


if __name__ == "__main__":
    main()
