"""qkv as an attention backend for 🤗 transformers models (needs `pip install qkv[hf]`).

`import qkv.hf` registers `"qkv"` with transformers' `AttentionInterface` (the attention)
and `AttentionMaskInterface` (the mask): any architecture whose attention goes through the
interface then runs on qkv's backends:

```pycon
>>> import qkv.hf                                         # doctest: +SKIP
>>> from transformers import AutoModelForCausalLM          # doctest: +SKIP
>>> model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="qkv")  # doctest: +SKIP

```

Causal, sliding-window and padding masks reach qkv as *structure* (an
[`AttentionMask`][qkv.attention.attention_mask.AttentionMask], or a
[`BlockMask`][qkv.attention.block_mask.BlockMask] for any other index-based mask), never as a (t ×
s) tensor, so a long sliding-window model runs blockwise in O(N) memory; soft-capping (Gemma 2),
sinks (gpt-oss), GQA, dv ≠ d and a score bias (T5's `position_bias`) are passed on as qkv's own
arguments. `output_attentions=True` gives the exact weights, from the log-sum-exp
([`qkv.attention_weights`][qkv.attention_weights]).

Registration is this module's one side effect, asked for by importing it; registering twice is
a no-op (the same functions).
"""

from __future__ import annotations

from qkv.hf.attention import NAME, qkv_attention_forward
from qkv.hf.load import load
from qkv.hf.masks import qkv_mask

__all__ = ["NAME", "load", "qkv_attention_forward", "qkv_mask", "register"]


def register() -> None:
    """Register `"qkv"` with transformers' attention and mask interfaces."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError as e:
        raise ImportError(f"qkv.hf needs transformers >= 5 (pip install 'qkv[hf]'): {e}") from None

    AttentionInterface.register(NAME, qkv_attention_forward)
    AttentionMaskInterface.register(NAME, qkv_mask)


register()
