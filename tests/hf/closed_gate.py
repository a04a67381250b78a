"""A tiny random qwen3_5 (`hybrids.py`'s sizes) whose attention layers carry biases, so one
head's output gate can be closed for every input: its gate rows of `q_proj` zeroed and their
bias set to `CLOSED` (sigmoid(−30) ≈ 9.4e-14). Shared by the gate's contribution, CLI and
viewer tests."""

from __future__ import annotations

import torch

from hybrids import BASE, HYBRIDS, save_tokenizer

LAYER, HEAD, CLOSED = 1, 1, -30.0  # layer 1 is a softmax layer of the hybrid


def save_gated(path, *, close: bool, layer_types: list[str] | None = None) -> None:
    """The checkpoint in `path` (`save_pretrained` + a word-level tokenizer); `close`: head
    `HEAD` of layer `LAYER` gets a closed gate, else the gate stays as drawn."""
    import transformers

    config_class, model_class, extra, _ = HYBRIDS["qwen3_5"]
    extra = extra | {"attention_bias": True} | ({"layer_types": layer_types} if layer_types else {})
    config = getattr(transformers, config_class)(**(BASE | extra))
    torch.manual_seed(0)
    model = getattr(transformers, model_class)._from_config(config, attn_implementation="eager")
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim >= 1:
                p.add_(torch.randn_like(p) * 0.05)
        if close:
            attn = model.model.layers[LAYER].self_attn
            d = attn.head_dim
            gate_rows = slice(HEAD * 2 * d + d, (HEAD + 1) * 2 * d)  # q_proj: [q_h | gate_h] per head
            attn.q_proj.weight[gate_rows] = 0.0
            attn.q_proj.bias[gate_rows] = CLOSED
    model.eval().save_pretrained(path)
    save_tokenizer(path)
