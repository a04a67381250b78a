"""qkv.attention.traced: the one traced attention call qkv's layers and transformers' attention run.

The traced rows are the forward's rows (their outputs replace the kernel's), soft-capping and sinks
are traced as the definition says (float64, written out below), and the edits change the values
before and the heads after."""

from __future__ import annotations

import pytest
import torch

from qkv.attention import AttentionMask
from qkv.attention.trace import LSE, LseTrace
from qkv.attention.traced import traced_attention
from qkv.errors import QkvError
from qkv.modules.intervention import AttentionEdit
from tolerance import assert_within

H, HKV, T, D = 4, 2, 13, 8


def naive(q, k, v, *, scale, softcap=None, sinks=None):
    """Causal attention by its definition: scores·scale → c·tanh(·/c) → mask → softmax over
    [keys, sink] → drop the sink column; GQA by repeating k/v. (output, weights)."""
    g = q.shape[-3] // k.shape[-3]
    k, v = k.repeat_interleave(g, -3), v.repeat_interleave(g, -3)
    s = (q @ k.transpose(-1, -2)) * scale
    if softcap is not None:
        s = torch.tanh(s / softcap) * softcap
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    if sinks is not None:
        s = torch.cat([s, sinks.to(s.dtype).view(-1, 1, 1).expand(*s.shape[:-1], 1)], -1)
    w = torch.softmax(s, -1)[..., :T]
    return w @ v, w


def inputs(seed=0):
    torch.manual_seed(seed)
    return torch.randn(1, H, T, D) * 2, torch.randn(1, HKV, T, D) * 2, torch.randn(1, HKV, T, D)


@pytest.mark.parametrize("cap, with_sinks", [(None, False), (3.0, False), (None, True), (2.0, True)])
def test_traced_rows_are_the_definition_and_the_forward(cap, with_sinks):
    q, k, v = inputs()
    sinks = torch.randn(H) if with_sinks else None
    rows = torch.tensor([0, 7, 12])
    call = traced_attention(q, k, v, mask=AttentionMask(causal=True), enable_gqa=True, softcap=cap,
                            sinks=sinks, rows=rows)
    sc = D ** -0.5
    ref, w_ref = naive(q.double(), k.double(), v.double(), scale=sc, softcap=cap,
                       sinks=None if sinks is None else sinks.double())
    plain, w_plain = naive(q, k, v, scale=sc, softcap=cap, sinks=sinks)
    tr = call.trace
    assert (tr.softcap, tr.sinks is None) == (cap, sinks is None)
    assert_within(tr.weights, w_ref[:, :, rows], w_plain[:, :, rows], what="traced weights")
    assert_within(call.output, ref, plain, what="every row's output")
    assert torch.equal(call.output[:, :, rows], tr.output)  # the traced rows are the forward's
    if sinks is not None:  # the sink's share is missing from every row
        assert float(tr.weights.sum(-1).min()) < 0.9


def test_need_weights_traces_every_row_and_keeps_the_graph():
    q, k, v = inputs(1)
    q.requires_grad_(True)
    call = traced_attention(q, k, v, mask=AttentionMask(causal=True), enable_gqa=True, softcap=4.0,
                            need_weights=True, rows=torch.tensor([3]))
    assert call.weights.shape == (1, H, T, T) and call.weights.requires_grad
    assert torch.equal(call.trace.weights, call.weights[:, :, 3:4].detach())
    call.output.sum().backward()  # the softcap's tanh is differentiable (not overwritten)
    assert torch.isfinite(q.grad).all()


def test_edits_scale_values_before_and_replace_heads_after():
    q, k, v = inputs(2)
    keep = torch.ones(1, T)
    keep[0, 4] = 0
    edit = AttentionEdit(heads={1: None}, values=keep)
    mask = AttentionMask(causal=True)
    call = traced_attention(q, k, v, mask=mask, enable_gqa=True, rows=slice(None), edit=edit)
    plain = traced_attention(q, k, v * keep[:, None, :, None], mask=mask, enable_gqa=True,
                             rows=slice(None))
    assert torch.equal(call.trace.weights, plain.trace.weights)
    assert torch.equal(call.output[:, 0], plain.output[:, 0])
    assert float(call.output[:, 1].abs().max()) == 0  # head 1 zeroed after attending
    assert float(call.trace.value[0, :, 4].abs().max()) == 0  # the trace holds the edited values


def test_lse_request_records_every_row_and_refuses_softcap():
    q, k, v = inputs(3)
    call = traced_attention(q, k, v, mask=AttentionMask(causal=True), enable_gqa=True, rows=LSE)
    assert isinstance(call.trace, LseTrace) and call.trace.lse.shape == (1, H, T)
    with pytest.raises(QkvError, match="soft-capped attention logits"):
        traced_attention(q, k, v, mask=AttentionMask(causal=True), enable_gqa=True, rows=LSE, softcap=2.0)


def test_bad_rows_are_named():
    q, k, v = inputs()
    with pytest.raises(ValueError, match=r"trace_rows must pick query positions among the 13"):
        traced_attention(q, k, v, mask=AttentionMask(), enable_gqa=True, rows=torch.tensor([13]))
