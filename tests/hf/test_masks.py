"""qkv.hf.masks.qkv_mask draws the same mask as transformers' own sdpa_mask (where a query row
has a key), for recognised and custom mask functions, offsets (caches) and padding."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from transformers import masking_utils as mu  # noqa: E402

from qkv.attention.attention_mask import AttentionMask  # noqa: E402
from qkv.hf.masks import qkv_mask  # noqa: E402

FUNCTIONS = {
    "causal": mu.causal_mask_function,
    "bidirectional": mu.bidirectional_mask_function,
    "sliding": mu.sliding_window_causal_mask_function(4),
    "sliding_bidirectional": mu.sliding_window_bidirectional_mask_function(3),
    "chunked": mu.chunked_causal_mask_function(4, torch.zeros(2, dtype=torch.long)),  # custom
}


@pytest.mark.parametrize("fn", sorted(FUNCTIONS))
@pytest.mark.parametrize("t,s,q_offset,kv_offset", [(9, 9, 0, 0), (1, 12, 11, 0), (3, 7, 10, 6),
                                                    (130, 140, 10, 0), (5, 9, 0, 0)])
@pytest.mark.parametrize("padded", [False, True])
def test_same_mask_as_sdpa_mask(fn, t, s, q_offset, kv_offset, padded):
    total = max(kv_offset + s, q_offset + t)
    attention_mask = torch.ones(2, total, dtype=torch.bool)
    if padded:
        attention_mask[1, :3] = False
    args = (2, t, s, q_offset, kv_offset, FUNCTIONS[fn], attention_mask)
    want = mu.sdpa_mask(*args, allow_is_causal_skip=False)  # (b, 1, t, s) bool
    got = qkv_mask(*args)
    assert isinstance(got, AttentionMask) and got.dense is None
    drawn = got.materialize(t, s, rank=4)
    drawn = torch.ones(2, 1, t, s, dtype=torch.bool) if drawn is None else drawn.expand(2, 1, t, s)
    assert torch.equal(drawn, want.expand(2, 1, t, s))
    if fn == "bidirectional" or fn != "chunked" and q_offset - kv_offset == s - t:
        # recognised: no mask_mod to evaluate (cross-attention, t ≠ s, is bidirectional)
        assert got.block is None
