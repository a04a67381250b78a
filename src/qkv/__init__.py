"""qkv — transformer self-attention, computed exactly and explained number by number.

Examples:
    >>> import torch, qkv
    >>> q = k = v = torch.randn(1, 2, 4, 8)                # (b, h, t, d)
    >>> qkv.scaled_dot_product_attention(q, k, v).shape
    torch.Size([1, 2, 4, 8])
    >>> model = qkv.load("minilm")          # all-MiniLM-L6-v2, from the installed package
    >>> model.embed(["The dog ate it."]).shape
    torch.Size([1, 384])

The names below are imported when first used (PEP 562), so `import qkv` costs no torch
import: the `qkv` command answers `--help` and argument errors without it (about 3 s of CPU).
"""

from __future__ import annotations

import ast
import importlib
import os
from typing import TYPE_CHECKING

__version__ = "0.1.0"

if TYPE_CHECKING:  # the public names, imported on first use (__getattr__ reads these lines)
    from qkv.attention import (  # noqa: F401
        AttentionMask, AttentionTrace, BlockMask, VarLen, attention_trace, attention_weights,
        create_block_mask, scaled_dot_product_attention,
    )
    from qkv import masks  # noqa: F401
    from qkv.modules import (  # noqa: F401
        ALiBi, FeedForward, GatedFeedForward, KVCache, LearnedPositionalEmbedding,
        MultiHeadAttention, RotaryEmbedding, SinusoidalPositionalEncoding, TransformerLayer,
        TransformerStack,
    )
    from qkv.models import load  # noqa: F401


def _public() -> dict[str, str]:
    """Each public name → its module, read from the `TYPE_CHECKING` imports above: one list,
    which static readers (the API reference's griffe, type checkers) read too."""
    with open(os.path.join(os.path.dirname(__file__), "__init__.py"), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    block = next(node for node in tree.body if isinstance(node, ast.If)
                 and getattr(node.test, "id", None) == "TYPE_CHECKING")
    return {alias.name: f"{node.module}.{alias.name}" if node.module == "qkv" else node.module
            for node in block.body for alias in node.names}


_WHERE = _public()
__all__ = list(_WHERE)


def __getattr__(name: str):
    """`qkv.load`, `qkv.MultiHeadAttention` …: imported from their module on first use; any
    other name is a sub-package (`qkv.explain`, `qkv.masks`) imported the same way."""
    if name in _WHERE and _WHERE[name] != f"qkv.{name}":
        value = getattr(importlib.import_module(_WHERE[name]), name)
    else:
        try:
            value = importlib.import_module(f"qkv.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"qkv.{name}":
                raise
            raise AttributeError(f"module 'qkv' has no attribute {name!r}") from None
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
