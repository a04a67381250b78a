"""Seeded mutations of a saved hybrid checkpoint's config.json and weights (issue 40 item 6):
what a damaged or hand-edited directory looks like to ``qkv.load``. Shared by
tests/hf/test_load_fuzz.py (a short run) and a longer run by hand::

    PYTHONPATH=src python tests/hf/fuzz_configs.py 400
"""

from __future__ import annotations

import json
import os
import random
import shutil

SIZES = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
         "head_dim", "vocab_size", "max_position_embeddings", "kv_lora_rank", "q_lora_rank",
         "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "linear_num_key_heads",
         "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
         "linear_conv_kernel_dim", "mamba_n_heads", "mamba_d_head", "mamba_d_state", "mamba_d_conv",
         "mamba_expand", "mamba_chunk_size", "mamba_n_groups", "n_groups", "ssm_state_size",
         "mamba_num_heads", "mamba_head_dim", "conv_kernel", "chunk_size", "linear_head_dim",
         "linear_num_heads", "num_local_experts", "num_experts", "num_experts_per_tok",
         "n_routed_experts", "moe_intermediate_size", "index_topk", "index_head_dim",
         "index_n_heads", "block_size", "conv_L_cache", "n_mamba_heads", "mamba_ngroups",
         "adapter_rank", "num_mem_blocks", "attn_layer_period", "expert_layer_period",
         "first_k_dense_replace", "num_hidden_layers")
VALUES = (0, -1, -7, 2**40, 10**18, 3, None, "4", 2.5, True)
LISTS = ("layer_types", "layers_block_type", "attn_layer_indices")


def mutations(config: dict, rng: random.Random, n: int) -> list[tuple[str, object]]:
    """``n`` (key, new value) pairs for ``config``: a size missing, zero, negative, huge or of
    another type; an unknown layer-type name; a kv-lora rank above hidden; a weight's shape."""
    sizes = [k for k in SIZES if k in config]
    lists = [k for k in LISTS if isinstance(config.get(k), list)]
    out = []
    for _ in range(n):
        kind = rng.random()
        if kind < 0.15 and lists:
            key = rng.choice(lists)
            value = list(config[key])
            i = rng.randrange(len(value))
            # an unknown name, or another model's (a kind this one may not run)
            names = ["bogus", "", 7, None, "conv", "mamba", "attention", "hybrid", "linear_attention",
                     "full_attention", "sliding_attention", "mlp", "moe"]
            value[i] = rng.choice(names) if key != "attn_layer_indices" else rng.choice([-1, 99, "x"])
            out.append((key, value))
        elif kind < 0.22 and "kv_lora_rank" in config:
            out.append(("kv_lora_rank", config["hidden_size"] * rng.choice([2, 8])))
        elif kind < 0.35:
            out.append(("<weights>", rng.randrange(10**6)))
        else:
            out.append((rng.choice(sizes), rng.choice(VALUES + ("<missing>",))))
    return out


def apply(src: str, dst: str, key: str, value) -> None:
    """``src`` copied to ``dst`` with one mutation (see :func:`mutations`)."""
    shutil.copytree(src, dst)
    if key == "<weights>":  # one tensor of another shape (a row more along its first dim)
        from safetensors.torch import load_file, save_file
        import torch

        path = os.path.join(dst, "model.safetensors")
        tensors = load_file(path)
        names = sorted(tensors)
        name = names[value % len(names)]
        t = tensors[name]
        tensors[name] = torch.cat([t, t[:1]]) if t.ndim else t.reshape(1)
        save_file(tensors, path, metadata={"format": "pt"})
        return
    path = os.path.join(dst, "config.json")
    with open(path) as f:
        config = json.load(f)
    if value == "<missing>":
        config.pop(key, None)
    else:
        config[key] = value
    with open(path, "w") as f:
        json.dump(config, f)


def run(count: int, seed: int = 0, names=None, work=None):
    """``count`` mutations spread over the hybrids: each (name, key, value, outcome) where the
    outcome is "loaded", "refused: <message>" or "FAILED: <type>: <message>" (not a QkvError, or
    a message of more than one line)."""
    import sys
    import tempfile

    import qkv
    from qkv.errors import QkvError

    sys.path.insert(0, os.path.dirname(__file__))
    from hybrids import HYBRIDS, save_hybrid

    rng = random.Random(seed)
    names = sorted(names or HYBRIDS)
    work = work or tempfile.mkdtemp()
    per = -(-count // len(names))
    results = []
    for name in names:
        base = os.path.join(work, name)
        save_hybrid(name, base)
        with open(os.path.join(base, "config.json")) as f:
            config = json.load(f)
        for i, (key, value) in enumerate(mutations(config, rng, per)):
            dst = os.path.join(work, f"{name}-{i}")
            apply(base, dst, key, value)
            try:
                qkv.load(dst)
                outcome = "loaded"
            except QkvError as e:
                msg = str(e)
                outcome = f"refused: {msg}" if "\n" not in msg else f"FAILED: multi-line: {msg!r}"
            except Exception as e:  # noqa: BLE001 — what the fuzzer is looking for
                outcome = f"FAILED: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            results.append((name, key, value, outcome))
            shutil.rmtree(dst, ignore_errors=True)
    return results


if __name__ == "__main__":
    import sys

    count = int(sys.argv[1]) if len(sys.argv) > 1 else 60
    res = run(count, seed=int(sys.argv[2]) if len(sys.argv) > 2 else 0)
    for name, key, value, outcome in res:
        if outcome.startswith("FAILED"):
            print(name, key, repr(value)[:60], outcome[:300])
    print(f"{len(res)} mutations: {sum(o.startswith('FAILED') for *_, o in res)} failed, "
          f"{sum(o == 'loaded' for *_, o in res)} loaded, "
          f"{sum(o.startswith('refused') for *_, o in res)} refused in one line")
