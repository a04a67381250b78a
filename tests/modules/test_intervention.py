"""Interventions through the forward: heads zeroed or replaced, value vectors zeroed, inputs patched.

The peer is transformers' eager Llama with the same weights, changed the plain way — a hook on
its own ``o_proj`` (the heads' concatenated outputs, before the output projection) or ``v_proj``
(the value vectors). A tiny GQA model (4 heads, 2 key/value heads, d = 10) so that a head's slice
and a key/value head's slice differ. Tolerances are derived (``tests/tolerance.py``): the truth
is the changed transformers in float64; qkv in float32 may be twice as far from it as the changed
transformers in float32 (+ 2 ulp).
"""

from __future__ import annotations

import pytest
import torch

from hf_decoders import make_checkpoint
from qkv.models import load
from qkv.modules import AttentionEdit, Interventions, MultiHeadAttention
from tolerance import assert_within, twin

transformers = pytest.importorskip("transformers")

HEADS, KV_HEADS, D = 4, 2, 10


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    path, hf = make_checkpoint(tmp_path_factory.mktemp("llama"), "LlamaConfig", "LlamaForCausalLM",
                               hidden_size=HEADS * D, intermediate_size=50, num_hidden_layers=2,
                               num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                               max_position_embeddings=48)
    return load(path), hf


def ids(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 300, (2, n), generator=torch.Generator().manual_seed(seed))  # (b, t)


def hf_edited(hf, x, module: str, layer: int, edit):
    """(float32, float64) logits of transformers with ``edit`` applied to the input (``o_proj``)
    or output (``v_proj``) of ``module`` in layer ``layer``."""
    outs = []
    for peer in (hf, twin(hf, torch.float64)):
        target = getattr(peer.model.layers[layer].self_attn, module)
        if module == "o_proj":
            handle = target.register_forward_pre_hook(lambda m, args: (edit(args[0].clone()),))
        else:
            handle = target.register_forward_hook(lambda m, args, out: edit(out.clone()))
        try:
            with torch.no_grad():
                outs.append(peer(input_ids=x).logits)
        finally:
            handle.remove()
    return outs


@pytest.mark.parametrize("layer,head", [(0, 1), (1, 3)])
def test_zeroing_a_head_equals_transformers_with_its_out_proj_input_slice_zeroed(pair, layer, head):
    model, hf = pair
    x = ids(7, 0)

    def zero(h):  # (b, t, h·d)
        h[..., head * D:(head + 1) * D] = 0
        return h

    plain, ref = hf_edited(hf, x, "o_proj", layer, zero)
    with torch.no_grad():
        got = model(x, interventions=Interventions(heads={(layer, head): None})).logits
        unchanged = model(x).logits
    assert_within(got, ref, plain, what="logits with the head zeroed")
    assert (got - unchanged).abs().max() > 1e3 * (got - ref).abs().max()  # the edit did something


def test_a_head_patched_from_another_run_equals_transformers(pair):
    model, hf = pair
    clean, corrupt = ids(6, 1), ids(6, 2)
    layer, head = 1, 2
    with torch.no_grad():
        traced = model(clean, trace_rows=slice(None)).traces[layer].self_attn.attention.output
    new = traced[:, head]  # (b, t, d): the clean run's head output

    def patch(h):  # (b, t, h·d)
        h[..., head * D:(head + 1) * D] = new.to(h.dtype)
        return h

    plain, ref = hf_edited(hf, corrupt, "o_proj", layer, patch)
    with torch.no_grad():
        got = model(corrupt, interventions=Interventions(heads={(layer, head): new})).logits
    assert_within(got, ref, plain, what="logits with a head patched")


def test_zeroed_value_vectors_equal_transformers_with_v_proj_rows_zeroed(pair):
    model, hf = pair
    x = ids(8, 3)
    layer, token = 0, 5
    keep = torch.ones(2, 8)
    keep[0, token] = 0  # batch row 0 only: row 1 must stay as it was

    def zero(v):  # (b, t, h_kv·d)
        v[0, token] = 0
        return v

    plain, ref = hf_edited(hf, x, "v_proj", layer, zero)
    with torch.no_grad():
        got = model(x, interventions=Interventions(values={layer: keep})).logits
    assert_within(got, ref, plain, what="logits with a value vector zeroed")


def test_a_patched_layer_input_makes_the_rest_of_the_run_the_other_runs(pair):
    model, _ = pair
    a, b = ids(6, 4), ids(6, 5)
    with torch.no_grad():
        other = model(b, output_hidden_states=True)
        got = model(a, output_hidden_states=True,
                    interventions=Interventions(inputs={1: other.hidden_states[1]}))
        by_function = model(a, interventions=Interventions(inputs={1: lambda h: h[1:].expand_as(h)}))
        alone = model(a[1:].expand(2, -1)).logits
    # layer 1 onward runs the same operations on the same numbers: equal, not close
    assert torch.equal(got.logits, other.logits)
    # hidden_states stay what each stage computed: layer 0's output on a, not the patch
    assert not torch.equal(got.hidden_states[1], other.hidden_states[1])
    # a function of the input: its answer replaces layer 1's input, so the run equals passing
    # that answer as a tensor (the same operations on the same numbers)
    h1 = model(a, output_hidden_states=True).hidden_states[1]
    with torch.no_grad():
        by_tensor = model(a, interventions=Interventions(inputs={1: h1[1:].expand_as(h1)}))
    assert torch.equal(by_function.logits, by_tensor.logits)
    # every row now continues row 1: the rows agree up to the batched matmuls' rounding, which may
    # differ between rows of one batch on some CPUs (AVX-512 tails) — compared with the rounding of
    # the same logits computed alone, not with a constant
    plain = (alone[0] - alone[1]).abs().max()  # the same row twice in one batch, unpatched
    floor = 4 * torch.finfo(torch.float32).eps * alone.abs().max()
    assert (by_function.logits[0] - by_function.logits[1]).abs().max() <= 4 * plain + floor
    assert (by_function.logits[1] - alone[1]).abs().max() <= 4 * plain + floor
    assert not torch.allclose(by_function.logits[0], model(a).logits[0])  # the patch changed row 0


def test_a_layer_or_head_out_of_range_is_a_value_error(pair):
    model, _ = pair
    x = ids(3, 6)
    with pytest.raises(ValueError, match="layer 2 is out of range"):
        model(x, interventions=Interventions(heads={(2, 0): None}))
    with pytest.raises(ValueError, match="head 4 is out of range"):
        model(x, interventions=Interventions(heads={(0, 4): None}))
    with pytest.raises(ValueError, match="layer -1 is out of range"):
        model(x, interventions=Interventions(values={-1: torch.ones(2, 3)}))


def test_multihead_edit_zeroes_the_head_columns_of_out_proj():
    """Independent of any model: zeroing head h equals out_proj with its d input columns zeroed."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(12, 3).double()
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    got = mha(x, intervention=AttentionEdit(heads={1: None})).output
    cut = twin(mha, torch.float64)
    with torch.no_grad():
        cut.out_proj.weight[:, 4:8] = 0  # head 1 of d = 4
    # the same products with zeros in place of head 1's terms; the sums differ only in order
    torch.testing.assert_close(got, cut(x).output, rtol=0, atol=16 * torch.finfo(torch.float64).eps)


def test_a_function_of_the_head_output_edits_some_batch_copies_only():
    """heads[(ℓ, h)] as a function: ablating head 1 in copy 0 only leaves copy 1 as it was, and
    copy 0 equals the plain zero ablation (the same products; a batch of 2 may sum in another
    order than a batch of 1, so within a few float64 ulp)."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(12, 3).double()
    x = torch.randn(1, 5, 12, dtype=torch.float64).expand(2, 5, 12)
    keep = torch.tensor([0.0, 1.0], dtype=torch.float64)
    got = mha(x, intervention=AttentionEdit(heads={1: lambda o: o * keep[:, None, None]})).output
    zeroed = mha(x[:1], intervention=AttentionEdit(heads={1: None})).output
    plain = mha(x[1:]).output
    tol = dict(rtol=0, atol=16 * torch.finfo(torch.float64).eps)
    torch.testing.assert_close(got[0], zeroed[0], **tol)
    torch.testing.assert_close(got[1], plain[0], **tol)
    assert (got[0] - got[1]).abs().max() > 1e-3  # the head mattered
