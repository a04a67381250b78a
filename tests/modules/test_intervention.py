"""``HeadEdit`` (qkv.modules.intervention) through ``MultiHeadAttention``: a zeroed head equals the
output projection with that head's input columns zeroed; other copies of the batch untouched."""

from __future__ import annotations

import pytest
import torch

from qkv.modules import HeadEdit, MultiHeadAttention


def test_zeroing_a_head_equals_zeroing_its_columns_of_out_proj():
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4, num_kv_heads=2).double()
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    where = torch.tensor([[False, True, False, True], [False, False, False, False]])
    got = mha(x, is_causal=True, head_edit=HeadEdit(where, torch.zeros(()))).output
    w = mha.out_proj.weight.detach().clone()
    w[:, 4:8] = 0  # head 1's columns (d = 4)
    w[:, 12:16] = 0  # head 3's
    heads = mha(x, is_causal=True, trace_rows=slice(None)).trace.attention.output  # (b, h, t, d)
    merged = heads.transpose(1, 2).reshape(2, 7, 16)
    ref0 = merged[0] @ w.T + mha.out_proj.bias  # copy 0: heads 1 and 3 removed
    ref1 = merged[1] @ mha.out_proj.weight.T + mha.out_proj.bias  # copy 1: as it was
    torch.testing.assert_close(got[0], ref0)
    torch.testing.assert_close(got[1], ref1)
    assert torch.equal(got[1], mha(x, is_causal=True).output[1])  # the edit never reaches copy 1


def test_a_replacement_takes_the_heads_place():
    torch.manual_seed(1)
    mha = MultiHeadAttention(8, 2)
    x = torch.randn(1, 5, 8)
    value = torch.randn(1, 5, 2, 4)  # (b, t, h, d): another run's head outputs
    where = torch.tensor([[True, True]])
    got = mha(x, head_edit=HeadEdit(where, value)).output
    torch.testing.assert_close(got, mha.out_proj(value.reshape(1, 5, 8)))


def test_where_must_match_the_batch_and_heads():
    mha = MultiHeadAttention(8, 2)
    with pytest.raises(ValueError, match=r"HeadEdit.where must be \(batch, heads\) = \(1, 2\), got \(1, 3\)"):
        mha(torch.randn(1, 3, 8), head_edit=HeadEdit(torch.zeros(1, 3, dtype=torch.bool), torch.zeros(())))
