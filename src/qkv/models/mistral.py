"""Mistral (Jiang et al., 2023): Llama with a sliding attention window.

Each token attends to itself and the `sliding_window − 1` tokens before it (in every layer;
information still travels further through the layers):

```text
sliding_window = 3, t = 5      k0 k1 k2 k3 k4
                           q0   1  0  0  0  0
                           q1   1  1  0  0  0
                           q2   1  1  1  0  0
                           q3   0  1  1  1  0
                           q4   0  0  1  1  1
```

The window is part of the one [`AttentionMask`][qkv.attention.AttentionMask] the model builds per
forward (`window=(sliding_window − 1, None)` beside `causal=True`); everything else is
`LlamaModel`.
"""

from __future__ import annotations

from qkv.errors import QkvError
from qkv.models.llama import LlamaConfig, LlamaModel, family, read_config

MISTRAL_ARCHITECTURES = ("MistralForCausalLM", "MistralModel")


def mistral_config(d: dict, *, where: str = "config.json") -> LlamaConfig:
    """A Mistral `config.json` (as a dict) → `LlamaConfig` with its `sliding_window`.

    Examples:
        >>> mistral_config({"hidden_size": 64, "num_attention_heads": 4, "sliding_window": 4096}).sliding_window
        4096
    """
    window = d.get("sliding_window")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise QkvError(f"{where}: sliding_window must be a positive integer or null, got {window!r}")
    return read_config(d, "mistral", MISTRAL_ARCHITECTURES, where=where, sliding_window=window)


MistralModel = LlamaModel  # the same model; the config carries the window
FAMILY = family(mistral_config)
