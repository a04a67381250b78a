"""transformers' masks as qkv structure: the `AttentionMaskInterface` function for `"qkv"`.

transformers builds every mask from a `mask_function(b, h, q_idx, kv_idx) -> bool` (causal,
sliding window, padding, packed sequences, images' bidirectional blocks …) and hands it to the
registered mask interface. Here the common ones are *recognised* and become an
[`AttentionMask`][qkv.attention.attention_mask.AttentionMask] (causal / window / key padding:
torch's causal kernel or qkv's blockwise band, never a (t × s) tensor); any other index-based
function becomes a [`BlockMask`][qkv.attention.block_mask.BlockMask] evaluated one block row at a
time (exact, O(N) memory); a function transformers says is not index-based (`use_vmap`) is drawn
densely by transformers' own `sdpa_mask`, the only thing that can evaluate it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from qkv.attention.block_mask import KeyMask, and_masks, create_block_mask, sliding_window
from qkv.attention.attention_mask import AttentionMask


@dataclass(frozen=True, eq=False)
class PreparedMask(AttentionMask):
    """An [`AttentionMask`][qkv.attention.attention_mask.AttentionMask] as transformers sees a
    prepared mask: 4-D, `shape` (b, 1, t, s).

    `generate` with a static cache builds each step's mask ahead of the forward and passes it
    back in as `attention_mask`; transformers' `_preprocess_mask_arguments` reads its
    `ndim` (a 2-D mask would be padding) and [`qkv_mask`][qkv.hf.masks.qkv_mask] hands it on
    unchanged.
    """

    shape: tuple[int, int, int, int] = (0, 1, 0, 0)

    @property
    def ndim(self) -> int:
        return 4

    @property
    def dtype(self) -> torch.dtype:
        """A bool mask's (True = takes part), as model code that combines masks itself asks."""
        return torch.bool

    def __and__(self, other: torch.Tensor) -> torch.Tensor:
        """The mask drawn (b, 1, t, s) AND a bool tensor: DeepSeek V3.2's eager/sdpa path
        removes the keys its indexer did not pick this way."""
        return self[:] & other

    def __getitem__(self, index) -> torch.Tensor:
        """The mask drawn as a bool tensor (b, 1, t, s) (True = takes part), then indexed: for
        model code that reads the mask as numbers (DeepSeek V3.2's indexer scores its keys
        under `attention_mask[:, 0]`, an O(t·s) score matrix of its own)."""
        b, _, t, s = self.shape
        keep = self.materialize(t, s)
        if keep is None:
            keep = torch.ones(1, 1, t, s, dtype=torch.bool)
        elif keep.dtype != torch.bool:
            keep = keep > float("-inf")
        return keep.expand(b, 1, t, s)[index]


def _window(mask_function) -> tuple[int | None, int | None] | None:
    """transformers' built-in mask functions as a qkv window `(left, right)`; None if unknown.

    causal → (None, 0); bidirectional → (None, None); sliding window w (keys q−w < k ≤ q) →
    (w−1, 0); bidirectional window w (|q − k| ≤ w) → (w, w); an `and_masks` of these → their
    intersection.
    """
    from transformers import masking_utils as mu

    if mask_function is mu.causal_mask_function:
        return (None, 0)
    if mask_function is mu.bidirectional_mask_function:
        return (None, None)
    name = getattr(mask_function, "__qualname__", "")
    cells = {n: c.cell_contents for n, c in zip(mask_function.__code__.co_freevars,
                                                mask_function.__closure__ or ())} \
        if hasattr(mask_function, "__code__") else {}
    if name == "sliding_window_overlay.<locals>.inner_mask":  # kv > q − w
        return (cells["sliding_window"] - 1, None)
    if name == "sliding_window_bidirectional_overlay.<locals>.inner_mask":  # |q − kv| ≤ w
        w = cells["sliding_window"]
        return (w, w)
    if name == "and_masks.<locals>.and_mask":
        left, right = None, None
        for part in cells.get("mask_functions", ()):
            got = _window(part)
            if got is None:
                return None
            left = got[0] if left is None else left if got[0] is None else min(left, got[0])
            right = got[1] if right is None else right if got[1] is None else min(right, got[1])
        return (left, right)
    return None


def qkv_mask(batch_size: int, q_length: int, kv_length: int, q_offset: int = 0, kv_offset: int = 0,
             mask_function=None, attention_mask: torch.Tensor | None = None, use_vmap: bool = False,
             device="cpu", **kwargs) -> PreparedMask:
    """The mask interface function: structure (an `AttentionMask`, or a `BlockMask` in one)
    or, for non-index-based functions and inside `torch.compile` with a static cache,
    transformers' dense bool mask (b, 1, t, s).

    Queries are at global positions `q_offset + i`, keys at `kv_offset + j`. A static cache
    gives `q_offset` as a 0-d tensor (so that a compiled step does not recompile) and keys up
    to its full length: the diagonal is then not bottom-right, and a recognised causal or window
    function becomes the same band placed by the offsets (classified from bounds, not evaluated).
    """
    from transformers import masking_utils as mu

    shape = (batch_size, 1, q_length, kv_length)
    if isinstance(attention_mask, AttentionMask):  # a mask built here, handed back (generate)
        if getattr(attention_mask, "shape", None) != shape:
            raise ValueError(f"qkv attention: a prepared mask of shape {attention_mask.shape} "
                             f"reached a call of shape {shape} (b, 1, t, s)")
        return attention_mask
    mask_function = mask_function or mu.causal_mask_function
    if use_vmap or isinstance(q_offset, torch.Tensor) or torch.compiler.is_compiling():
        # only transformers can evaluate a function that is not index-based. A static cache's
        # offset is a tensor so that its compiled step neither breaks nor recompiles, and traced
        # (torch.compile) recognising structure would branch on the numbers (is every key real?)
        # and on the function's closure: transformers' index arithmetic draws these without a
        # guard, O(t·s) bools as for sdpa (a decoding step's t is 1)
        return PreparedMask(dense=mu.sdpa_mask(
            batch_size, q_length, kv_length, q_offset, kv_offset, mask_function, attention_mask,
            allow_is_causal_skip=False, use_vmap=use_vmap, device=device), shape=shape)
    padding = None  # (b, ≥ kv_offset + s) bool, indexed by global key position
    if attention_mask is not None and not bool(attention_mask.all()):
        padding = mu.prepare_padding_mask(attention_mask, kv_length, kv_offset)
    window = _window(mask_function)
    if window == (None, None) or (window is not None and q_offset - kv_offset == kv_length - q_length):
        # global positions q_offset + i, kv_offset + j: the diagonal is bottom-right aligned
        # (without a window, as in cross-attention, there is no diagonal to place)
        left, right = window
        causal = right == 0
        keep = (left, None if causal else right)
        keys = padding[:, kv_offset:kv_offset + kv_length] if padding is not None else None  # (b, s)
        return PreparedMask(causal=causal, alignment="bottom_right", key_padding=keys,
                            window=None if keep == (None, None) else keep, shape=shape)
    if window is not None:  # the band in global positions: top-left once the offsets are added
        mod = sliding_window(*window)
        if padding is not None:
            mod = and_masks(mod, KeyMask(padding[:, :kv_offset + kv_length]))
    else:
        mod = mask_function if padding is None else _with_padding(mask_function, padding)
    return PreparedMask(block=create_block_mask(mod, batch_size, None, q_length, kv_length,
                                                q_offset=q_offset, k_offset=kv_offset,
                                                device=device), shape=shape)


def _with_padding(mod, padding: torch.Tensor):
    """A custom mask_mod and the key padding (b, ≥ kv_offset + s), indexed by global position."""
    def both(b, h, q, kv):
        return mod(b, h, q, kv) & padding[b, kv]
    return both
