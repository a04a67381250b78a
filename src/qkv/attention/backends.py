"""Attention backends, registered by name behind one signature, and the ``"auto"`` rule.

Every backend takes already-validated tensors and returns the output ``(..., t, dv)``:

    backend(query, key, value, *, attn_mask, dropout_p, is_causal, scale, enable_gqa,
            window, causal_alignment) -> Tensor

* ``"reference"`` — :func:`qkv.attention.reference.reference_attention`, the readable math.
* ``"fused"`` — ``torch.nn.functional.scaled_dot_product_attention`` (PyTorch's flash /
  memory-efficient / math kernels). Windows and bottom-right causality are passed to it as an
  explicit mask; plain top-left causality as ``is_causal=True`` so its causal kernel runs.
* ``"auto"`` — the dispatch rule, in :func:`choose_backend` and nowhere else.
"""

from __future__ import annotations

from typing import Callable, Protocol

import torch
import torch.nn.functional as F

from qkv.attention.masks import combine_masks, structural_mask
from qkv.attention.reference import reference_attention

# torch 2.5 made SDPA return zeros for all-masked rows (before: NaN) and added enable_gqa.
_TORCH_2_5 = tuple(int(p) for p in torch.__version__.split(".")[:2]) >= (2, 5)


class Backend(Protocol):
    def __call__(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        *,
        attn_mask: torch.Tensor | None,
        dropout_p: float,
        is_causal: bool,
        scale: float,
        enable_gqa: bool,
        window: tuple[int | None, int | None] | None,
        causal_alignment: str,
    ) -> torch.Tensor: ...


BACKENDS: dict[str, Backend] = {}


def register_backend(name: str) -> Callable[[Backend], Backend]:
    """Decorator: make a backend selectable as ``backend=name``."""

    def add(fn: Backend) -> Backend:
        BACKENDS[name] = fn
        return fn

    return add


def repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """(..., h_kv, s, d) → (..., h_kv·groups, s, d): each key/value head serves ``groups`` query heads."""
    return x if groups == 1 else x.repeat_interleave(groups, dim=-3)


def full_mask(attn_mask, t, s, *, is_causal, window, causal_alignment, device):
    """The user's mask and the causal/window structure folded into one (or None)."""
    structure = structural_mask(
        t, s, is_causal=is_causal, window=window, causal_alignment=causal_alignment, device=device
    )
    return combine_masks(attn_mask, structure)


@register_backend("reference")
def reference_backend(query, key, value, *, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                      window, causal_alignment):
    # a rank-2 call has no head dimension to group (the fused backend ignores the flag there too)
    groups = query.shape[-3] // key.shape[-3] if enable_gqa and query.ndim >= 3 else 1
    mask = full_mask(attn_mask, query.shape[-2], key.shape[-2], is_causal=is_causal, window=window,
                     causal_alignment=causal_alignment, device=query.device)
    trace = reference_attention(query, repeat_kv(key, groups), repeat_kv(value, groups), mask,
                                scale=scale, dropout_p=dropout_p)
    return trace.output


@register_backend("fused")
def fused_backend(query, key, value, *, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                  window, causal_alignment):
    t, s = query.shape[-2], key.shape[-2]
    # torch's own causal kernel is top-left; bottom-right with t == s is the same thing.
    torch_causal = is_causal and window is None and attn_mask is None and (
        causal_alignment == "top_left" or t == s
    )
    mask = None if torch_causal else full_mask(
        attn_mask, t, s, is_causal=is_causal, window=window, causal_alignment=causal_alignment,
        device=query.device,
    )
    if mask is not None and mask.dtype != torch.bool and mask.dtype != query.dtype:
        mask = mask.to(query.dtype)
    if not _TORCH_2_5 and mask is not None:
        return reference_backend(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                                 is_causal=is_causal, scale=scale, enable_gqa=enable_gqa,
                                 window=window, causal_alignment=causal_alignment)
    if query.ndim < 3 or query.shape[-3] == key.shape[-3]:
        enable_gqa = False  # nothing to repeat; also keeps torch's fastest path for 2-D inputs
    elif not _TORCH_2_5:
        key, value = repeat_kv(key, query.shape[-3] // key.shape[-3]), repeat_kv(value, query.shape[-3] // key.shape[-3])
        enable_gqa = False
    gqa = dict(enable_gqa=True) if enable_gqa else {}
    return F.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, dropout_p=dropout_p, is_causal=torch_causal,
        scale=scale, **gqa,
    )


def choose_backend(query: torch.Tensor, key: torch.Tensor) -> str:
    """The ``"auto"`` rule: ``"fused"`` unless a sequence is empty, then ``"reference"``.

    Measured in ``benchmarks/attention.py``: PyTorch's fused kernel is as fast as or faster than
    the explicit math for every size, dtype and mask kind on CPU, and it is exact (it is torch's
    own SDPA; all-masked rows give zeros since torch 2.5). The explicit path is kept for empty
    sequences (t = 0 or s = 0), where the kernels' behaviour has varied between releases.
    """
    if query.shape[-2] == 0 or key.shape[-2] == 0:
        return "reference"
    return "fused"
