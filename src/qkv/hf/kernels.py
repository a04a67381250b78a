"""The module-level functions a transformers layer's forward calls by name, read off its
modeling file: the one place qkv looks a function up there.

transformers keeps a layer's kernels (`eager_attention_forward`, `mamba2_chunk_scan`,
`torch_chunk_gated_delta_rule` …) and its RoPE functions (`ROPE_FUNCTIONS`) as functions of
the layer class's `modeling_*.py` module, and the layer's `forward` looks them up there when
it runs. So replacing one there for one call (`replaced`) records exactly what the layer
handed it ([`qkv.explain.mixers.capture`][qkv.explain.mixers.capture]), and the function
found there (`modeling_function`) is the one the layer runs.

Examples:
    >>> from transformers.models.llama.modeling_llama import LlamaAttention  # doctest: +SKIP
    >>> rope_functions(attention)                                             # doctest: +SKIP
    ('apply_rotary_pos_emb',)
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from torch import nn

#: The RoPE functions transformers' attention layers call: half-split or interleaved (deepseek_v3,
#: the sparse layers' attention and their indexers: deepseek_v32, glm_moe_dsa), complex
#: (deepseek_v2)
ROPE_FUNCTIONS = ("apply_rotary_pos_emb", "apply_rotary_pos_emb_interleave", "apply_rotary_emb")


def modeling_function(module: nn.Module, name: str) -> Callable | None:
    """The function `name` of the modeling file `module`'s class is defined in, or None: what
    the module's forward calls when it calls `name`."""
    found = vars(sys.modules[type(module).__module__]).get(name)
    return found if callable(found) else None


def rope_functions(module: nn.Module) -> tuple[str, ...]:
    """The names of `ROPE_FUNCTIONS` that `module`'s modeling file defines, in that order (the
    ones its forward may call to rotate q and k)."""
    return tuple(n for n in ROPE_FUNCTIONS if modeling_function(module, n) is not None)


@contextmanager
def replaced(module: nn.Module, name: str, replacement: Callable) -> Iterator[Callable]:
    """Within the `with`, `module`'s forward calls `replacement` where it calls the function
    `name` of its modeling file; yields the original, put back in a `finally` (not safe while
    another thread runs the same architecture).

    Raises:
        ValueError: the modeling file has no function `name`.
    """
    original = modeling_function(module, name)
    if original is None:
        raise ValueError(f"{type(module).__name__}'s modeling file has no function {name!r}")
    modeling = vars(sys.modules[type(module).__module__])
    modeling[name] = replacement
    try:
        yield original
    finally:
        modeling[name] = original


__all__ = ["ROPE_FUNCTIONS", "modeling_function", "replaced", "rope_functions"]
