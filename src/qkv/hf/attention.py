"""The `AttentionInterface` function for `"qkv"`: transformers' call → qkv's arguments.

transformers calls `fn(module, query, key, value, attention_mask, scaling=, dropout=, …)` with
query (b, h, t, d), key (b, h_kv, s, d), value (b, h_kv, s, dv) and expects
`(output (b, t, h, dv), weights (b, h, t, s) or None)`. Per-architecture extras arrive as
keyword arguments: `softcap` (Gemma 2), `s_aux` (gpt-oss sinks), `position_bias` (T5).
"""

from __future__ import annotations

import torch

from qkv.attention.block_mask import block_mask_for, create_block_mask
from qkv.attention.functional import scaled_dot_product_attention
from qkv.attention.attention_mask import AttentionMask
from qkv.attention.weights import attention_weights
from qkv.hf import trace as recorder

NAME = "qkv"


def _description(module, query, key, attention_mask, is_causal) -> tuple[AttentionMask, torch.Tensor | None]:
    """What reached us as the mask → (a qkv `AttentionMask`, a float score bias or None)."""
    t, s = query.shape[-2], key.shape[-2]
    if isinstance(attention_mask, AttentionMask):  # from qkv.hf.masks: structure
        return _broadcast(attention_mask, query.shape[0], t, s), None
    if attention_mask is None:
        # as transformers' sdpa: no mask and a causal module → causal (bottom-right for decoding)
        causal = is_causal if is_causal is not None else getattr(module, "is_causal", False)
        return AttentionMask(causal=bool(causal) and t > 1, alignment="bottom_right"), None
    if not isinstance(attention_mask, torch.Tensor):
        raise ValueError(f"qkv attention: the mask reaching {type(module).__name__} is a "
                         f"{type(attention_mask).__name__}; expected qkv's mask (load the model with "
                         f"attn_implementation='qkv' after import qkv.hf) or a tensor")
    mask = attention_mask[..., :s]  # transformers may hand a mask longer than the keys (static caches)
    if mask.dtype == torch.bool:
        return AttentionMask(dense=mask), None
    return AttentionMask(), mask.to(query.dtype)  # a float mask is a score bias: added, like eager


def _broadcast(mask: AttentionMask, b: int, t: int, s: int) -> AttentionMask:
    """A prepared mask of fewer queries or keys than the call, broadcast as eager adds it.

    transformers sizes a mask by the cache's count of past keys, and a hybrid's cache may count
    none: MiniMax's decoding step gets a (b, 1, 1, 1) mask — the first key's padding flag — for
    its 1 × s scores, which eager broadcasts over every key. The same here, drawn (b, 1, t, s):
    a broadcast dimension is 1, so it is the decoding step's O(b·s).
    """
    shape = getattr(mask, "shape", None)
    if shape is None or tuple(shape[-2:]) == (t, s):
        return mask
    if any(have not in (1, want) for have, want in zip(shape, (b, 1, t, s))):
        raise ValueError(f"qkv attention: a mask of shape {tuple(shape)} (b, 1, t, s) reached a "
                         f"call of shape {(b, 1, t, s)}, and does not broadcast to it")
    return AttentionMask(dense=mask[:].expand(b, 1, t, s))  # (b, 1, t, s) bool


def _selected(mask: AttentionMask, indices: torch.Tensor, t: int, s: int) -> AttentionMask:
    """`mask` AND the keys an indexer selected: `indices` (b, t, k) key positions per query
    (DeepSeek V3.2's sparse attention, which eager runs as the same dense mask)."""
    b = indices.shape[0]
    chosen = torch.zeros(b, t, s, dtype=torch.bool, device=indices.device)
    chosen.scatter_(-1, indices.long().clamp(0, s - 1), True)  # (b, t, s)
    keep = mask.materialize(t, s, device=indices.device)
    chosen = chosen[:, None]  # (b, 1, t, s)
    if keep is not None:
        chosen = chosen & keep if keep.dtype == torch.bool else chosen & (keep > float("-inf"))
    return AttentionMask(dense=chosen)


def _weights(query, key, lse, mask: AttentionMask, bias, *, scale, softcap, groups) -> torch.Tensor:
    """The exact softmax weights (b, h, t, s) from the forward's lse (sinks already counted)."""
    b, h, t, s = query.shape[0], query.shape[1], query.shape[2], key.shape[2]
    if mask.dense is None:
        block = block_mask_for(mask, b, h, t, s, device=query.device)
    else:  # a bool (b|1, 1|h, t, s) tensor as a mask_mod: its blocks classified, rows exact
        keep = mask.dense.expand(b, -1, t, s)
        block = create_block_mask(lambda bi, hi, qi, ki: keep[bi, hi % keep.shape[1], qi, ki],
                                  b, h, t, s, device=query.device)
    return attention_weights(query, key, lse, block_mask=block, scale=scale, enable_gqa=groups > 1,
                             softcap=softcap, bias=bias)


def _extras(bias, softcap, sinks) -> tuple[str, ...]:
    """What a call's scores carry beyond q·k, the mask and the scale, in words (`Call.extras`)."""
    return tuple(name for name, given in (("a score bias", bias), ("soft-capped logits", softcap),
                                          ("sink logits", sinks)) if given is not None)


def _weights_wanted(kwargs) -> bool:
    """Whether the caller records attention weights (`output_attentions=True`).

    transformers passes the flag down to the attention call, and its output recorder (hooks on
    the attention modules) collects the weights the call returns. GPT-2, OPT and StableLM (5.x)
    consume the flag before their attention call, so there — as under transformers' own sdpa —
    no weights come back; qkv's explanations never ask for them this way (they record through
    `qkv.hf.trace`).
    Weights are (t × s) per head: computed only when asked for.
    """
    return bool(kwargs.get("output_attentions"))


def qkv_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                          value: torch.Tensor, attention_mask, dropout: float = 0.0,
                          scaling: float | None = None, softcap: float | None = None,
                          s_aux: torch.Tensor | None = None, is_causal: bool | None = None,
                          position_bias: torch.Tensor | None = None, **kwargs):
    """transformers' attention call on qkv: `(output (b, t, h, dv), weights or None)`.

    `sliding_window` (and other flash-attention hints) in `kwargs` are already part of the
    mask transformers built through [`qkv.hf.masks.qkv_mask`][qkv.hf.masks.qkv_mask].
    """
    mask, bias = _description(module, query, key, attention_mask, is_causal)
    indices = kwargs.pop("indices", None)
    if indices is not None:  # an indexer's top-k keys per query (b, t, k): the others are masked
        mask = _selected(mask, indices, query.shape[-2], key.shape[-2])
    if position_bias is not None:  # T5's relative position bias (it may carry the mask folded in)
        bias = position_bias.to(query.dtype) if bias is None else bias + position_bias.to(query.dtype)
    groups = query.shape[1] // key.shape[1]
    dropout = float(dropout) if module.training else 0.0
    # qkv.hf.trace: an explanation's forward records here (never a compiled one: dynamo cannot
    # read a ContextVar)
    rec = None if torch.compiler.is_compiling() else recorder.active()
    if rec is not None:
        if rec.keys is None:  # discovering the model's attention modules
            out = scaled_dot_product_attention(query, key, value, mask=mask, bias=bias, scale=scaling,
                                               enable_gqa=groups > 1, softcap=softcap, sinks=s_aux)
            out = out.transpose(1, 2).reshape(query.shape[0], query.shape[2], -1)  # (b, t, h·dv)
            rec.calls.append(recorder.Call(module, query.shape[1], key.shape[1], query.shape[-1],
                                           value.shape[-1], query.shape[2], key.shape[2], out,
                                           indexed=indices is not None,
                                           extras=_extras(bias, softcap, s_aux)))
            return out.view(*out.shape[:2], query.shape[1], value.shape[-1]), None
        if id(module) in rec.keys:
            scale = scaling if scaling is not None else query.shape[-1] ** -0.5
            out = recorder.traced_attention(rec, rec.keys[id(module)], query, key, value, mask=mask,
                                            bias=bias, scale=scale, softcap=softcap, sinks=s_aux,
                                            dropout_p=dropout)
            return out, None
    want_weights = _weights_wanted(kwargs)
    extras = dict(mask=mask, bias=bias, dropout_p=dropout, scale=scaling, enable_gqa=groups > 1,
                  softcap=softcap, sinks=s_aux)
    if not want_weights:
        out = scaled_dot_product_attention(query, key, value, **extras)
        return out.transpose(1, 2).contiguous(), None
    out, lse = scaled_dot_product_attention(query, key, value, return_lse=True, **extras)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    weights = _weights(query, key, lse, mask, bias, scale=scale, softcap=softcap, groups=groups)
    return out.transpose(1, 2).contiguous(), weights.to(query.dtype)
