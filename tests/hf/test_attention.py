"""qkv.hf.attention: transformers' attention call on qkv — a prepared mask of fewer queries or
keys than the call is broadcast as eager adds it; one that cannot broadcast is one line."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")  # the qkv[hf] extra
import torch  # noqa: E402

from qkv.hf.attention import qkv_attention_forward  # noqa: E402
from qkv.hf.masks import qkv_mask  # noqa: E402
from tolerance import FUSED_FACTOR, assert_within  # noqa: E402


def _eager(query, key, value, keep, dtype=torch.float64):
    """transformers' eager attention with a bool mask broadcast over the scores; a row without
    a key gives 0 (as sdpa and qkv do)."""
    q, k, v = (x.to(dtype) for x in (query, key, value))
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)  # (b, h, s, d)
    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5  # (b, h, t, s)
    weights = scores.masked_fill(~keep, float("-inf")).softmax(-1).nan_to_num(0.0)
    return (weights @ v).transpose(1, 2)  # (b, t, h, d)


def test_a_one_key_mask_is_broadcast_over_every_key():
    """MiniMax's decoding step: a (b, 1, 1, 1) mask (the first key's padding flag) for 1 × 9
    scores: the first row sees all 9 keys, the second (its first key padding) none."""
    torch.manual_seed(0)
    query, key, value = torch.randn(2, 4, 1, 8), torch.randn(2, 2, 9, 8), torch.randn(2, 2, 9, 8)
    mask = qkv_mask(2, 1, 1, attention_mask=torch.tensor([[1, 1, 1], [0, 1, 1]]).bool())
    module = torch.nn.Module().eval()
    got, _ = qkv_attention_forward(module, query, key, value, mask)
    keep = torch.tensor([True, False]).view(2, 1, 1, 1)  # (b, 1, 1, 1) broadcast as eager adds it
    want, plain = _eager(query, key, value, keep), _eager(query, key, value, keep, torch.float32)
    assert_within(got, want, plain, factor=FUSED_FACTOR, what="broadcast mask's output")
    assert got[1].abs().max() == 0


def test_a_mask_that_does_not_broadcast_is_one_line():
    query, key = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 9, 8)
    mask = qkv_mask(1, 2, 5)  # (1, 1, 2, 5): neither 3 queries nor 9 keys
    with pytest.raises(ValueError, match=r"^qkv attention: a mask of shape \(1, 1, 2, 5\) \(b, 1, t, "
                                         r"s\) reached a call of shape \(1, 1, 3, 9\), and does not "
                                         r"broadcast to it$"):
        qkv_attention_forward(torch.nn.Module().eval(), query, key, key, mask)
