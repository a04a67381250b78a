"""TransformerStack, the one layer loop: what ``hidden_states`` and ``traces`` hold, where the
final norm applies, that the mask reaches every layer as built, and that decoding with one KV
cache per layer (and cross-attention caches) equals the full pass.

Tolerances: ``torch.equal`` where the stack's result is the very computation repeated here;
cached against full in fp64 with :func:`tolerance.assert_agree`.
"""

from __future__ import annotations

import doctest

import pytest
import torch
from torch import nn

import qkv.modules.stack
from qkv.attention import AttentionMask
from qkv.modules import KVCache, StackOutput, TransformerLayer, TransformerStack
from tolerance import assert_agree, twin

E, H, FF, L = 16, 4, 24, 3


def _stack(*, norm_first=True, cross=False, final_norm=True, seed=0):
    torch.manual_seed(seed)
    layers = [TransformerLayer.build(E, H, FF, norm_first=norm_first, cross_attention=cross)
              for _ in range(L)]
    stack = TransformerStack(layers, norm=nn.LayerNorm(E) if final_norm else None)
    with torch.no_grad():  # random norms too, so a misplaced one cannot hide
        for p in stack.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return stack.double().eval()


def _inputs(b=2, t=7, s=5, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(b, t, E, generator=gen, dtype=torch.float64),
            torch.randn(b, s, E, generator=gen, dtype=torch.float64))


def test_layers_are_reached_by_index_length_and_iteration():
    stack = _stack()
    assert len(stack) == L and list(stack) == list(stack.layers)
    assert stack[1] is stack.layers[1] and isinstance(stack[0], TransformerLayer)


@pytest.mark.parametrize("norm_first", [True, False], ids=["pre_norm", "post_norm"])
def test_hidden_states_are_what_enters_each_layer(norm_first):
    stack = _stack(norm_first=norm_first, final_norm=norm_first)
    x, _ = _inputs()
    mask = AttentionMask(causal=True)
    out = stack(x, mask=mask, output_hidden_states=True)
    assert isinstance(out, StackOutput) and out.traces is None
    assert len(out.hidden_states) == L + 1
    assert out.hidden_states[0] is x
    for i, layer in enumerate(stack):
        # exact: the stack calls this very layer on this very input
        assert torch.equal(out.hidden_states[i + 1], layer(out.hidden_states[i], mask=mask).hidden), i
    assert stack(x, mask=mask).hidden_states is None


def test_the_final_norm_applies_to_last_hidden_state_only():
    stack = _stack(final_norm=True)
    x, _ = _inputs()
    out = stack(x, mask=AttentionMask(causal=True), output_hidden_states=True)
    assert torch.equal(out.last_hidden_state, stack.norm(out.hidden_states[-1]))
    assert not torch.equal(out.last_hidden_state, out.hidden_states[-1])
    bare = _stack(final_norm=False)  # the same weights (same seed) without the final norm
    out = bare(x, mask=AttentionMask(causal=True), output_hidden_states=True)
    assert torch.equal(out.last_hidden_state, out.hidden_states[-1])


def test_traces_are_one_per_layer_and_each_layers_own():
    stack = _stack(cross=True)
    x, memory = _inputs()
    mask, memory_mask = AttentionMask(causal=True), AttentionMask(key_padding=torch.tensor(
        [[True] * 5, [True] * 3 + [False] * 2]))
    rows = torch.tensor([6, 0])
    out = stack(x, mask=mask, memory=memory, memory_mask=memory_mask, trace_rows=rows,
                output_hidden_states=True)
    assert len(out.traces) == L
    for i, (layer, trace) in enumerate(zip(stack, out.traces)):
        alone = layer(out.hidden_states[i], mask=mask, memory=memory, memory_mask=memory_mask,
                      trace_rows=rows).trace
        for part in ("self_attn", "cross_attn"):  # exact: the same traced call
            got, want = getattr(trace, part), getattr(alone, part)
            assert torch.equal(got.rows, rows)
            assert torch.equal(got.attention.weights, want.attention.weights), (i, part)
            assert torch.equal(got.query_input, want.query_input), (i, part)
    assert out.traces[0].cross_attn.attention.weights.shape == (2, H, 2, 5)


def test_the_mask_reaches_every_layer_as_built():
    stack = _stack(cross=True)
    x, memory = _inputs()
    mask, memory_mask = AttentionMask(causal=True), AttentionMask()
    seen = []
    hooks = [layer.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append((kwargs["mask"], kwargs["memory_mask"])),
        with_kwargs=True) for layer in stack]
    try:
        stack(x, mask=mask, memory=memory, memory_mask=memory_mask)
    finally:
        for hook in hooks:
            hook.remove()
    assert len(seen) == L
    assert all(m is mask and mm is memory_mask for m, mm in seen)


@pytest.mark.parametrize("schedule", [[1] * 7, [4, 1, 2]], ids=["token_by_token", "chunks"])
@pytest.mark.parametrize("cross", [False, True], ids=["decoder_only", "encoder_decoder"])
def test_cached_decoding_equals_the_full_pass(cross, schedule):
    stack = _stack(cross=cross)
    x, memory = _inputs()
    memory = memory if cross else None
    memory_pad = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    memory_mask = AttentionMask(key_padding=memory_pad) if cross else None
    full = stack(x, mask=AttentionMask(causal=True), memory=memory, memory_mask=memory_mask)
    low = twin(stack, torch.float32)(x.float(), mask=AttentionMask(causal=True),
                                     memory=memory.float() if cross else None, memory_mask=memory_mask)
    caches = [KVCache(2, H, E // H, max_len=7, dtype=torch.float64) for _ in range(L)]
    memory_caches = [KVCache(2, H, E // H, max_len=5, dtype=torch.float64) for _ in range(L)] \
        if cross else None
    steps, start = [], 0
    for n in schedule:
        # the new tokens are the last of the cached positions: causal, aligned bottom-right
        out = stack(x[:, start:start + n], mask=AttentionMask(causal=True, alignment="bottom_right"),
                    memory=memory, memory_mask=memory_mask, kv_caches=caches,
                    memory_kv_caches=memory_caches)
        steps.append(out.last_hidden_state)
        start += n
    assert all(len(c) == 7 for c in caches)
    if cross:
        assert all(len(c) == 5 for c in memory_caches)  # projected once, by the first step
    assert_agree(torch.cat(steps, dim=1), full.last_hidden_state, low.last_hidden_state)


@pytest.mark.parametrize("name", ["kv_caches", "memory_kv_caches"])
def test_one_cache_per_layer_is_required(name):
    stack = _stack(cross=True)
    x, memory = _inputs()
    caches = [KVCache(2, H, E // H, max_len=7, dtype=torch.float64) for _ in range(L - 1)]
    with pytest.raises(ValueError, match=rf"{name} must hold one KVCache per layer \({L}\), got {L - 1}"):
        stack(x, memory=memory, **{name: caches})


def test_docstring_examples_run():
    assert doctest.testmod(qkv.modules.stack, extraglobs={"torch": torch}).failed == 0


def test_layer_rows_traces_one_layer_and_stops_after_it():
    """LayerRows(ℓ, rows): layer ℓ's trace is the full forward's, the layers after it never run
    (a layer that would raise is never called), the output holds no positions."""
    from qkv.modules import LayerRows

    stack = _stack()
    x = torch.randn(1, 7, E, dtype=next(stack.parameters()).dtype)
    full = stack(x, mask=AttentionMask(causal=True), trace_rows=torch.tensor([6]),
                 output_hidden_states=True)

    class Refuses(nn.Module):
        def forward(self, *args, **kwargs):
            raise AssertionError("a layer after the stop ran")

    stack.layers[2] = Refuses()
    out = stack(x, mask=AttentionMask(causal=True), trace_rows=LayerRows(1, torch.tensor([6])),
                output_hidden_states=True)
    assert out.last_hidden_state.shape == (1, 0, E) and len(out.hidden_states) == 3
    assert out.traces[0] is None and len(out.traces) == 2
    # layer 0 ran untraced here (the kernel for row 6, not the reference path): fp64 roundings apart
    torch.testing.assert_close(out.traces[1].self_attn.attention.weights,
                               full.traces[1].self_attn.attention.weights, rtol=0, atol=1e-12)
    both = stack(x, mask=AttentionMask(causal=True),
                 trace_rows=LayerRows(1, torch.tensor([6]), earlier=True), output_hidden_states=True)
    for layer in (0, 1):  # traced alike: the very same computation
        assert torch.equal(both.traces[layer].self_attn.attention.weights,
                           full.traces[layer].self_attn.attention.weights)
        assert torch.equal(both.hidden_states[layer + 1], full.hidden_states[layer + 1])
    with pytest.raises(ValueError, match=r"^LayerRows.layer must be a layer of the stack \(0…2\), got 3"):
        stack(x, trace_rows=LayerRows(3, torch.tensor([6])))


def test_layer_rows_attention_only_stops_after_the_layers_attention():
    """LayerRows(ℓ, rows, attention_only=True): layer ℓ's trace is the same as without it, its
    out_proj and feed-forward never run (no residual formed), and hidden_states end with what
    entered layer ℓ."""
    from qkv.modules import LayerRows

    stack = _stack()
    x = torch.randn(1, 7, E, dtype=next(stack.parameters()).dtype)
    whole = stack(x, mask=AttentionMask(causal=True), trace_rows=LayerRows(1, torch.tensor([6])),
                  output_hidden_states=True)

    class Refuses(nn.Module):
        def forward(self, *args, **kwargs):
            raise AssertionError("the stop layer's feed-forward ran")

    stack.layers[1].feed_forward = Refuses()
    stack.layers[1].self_attn.out_proj = Refuses()
    out = stack(x, mask=AttentionMask(causal=True), output_hidden_states=True,
                trace_rows=LayerRows(1, torch.tensor([6]), attention_only=True))
    assert out.last_hidden_state.shape == (1, 0, E) and len(out.hidden_states) == 2
    assert torch.equal(out.hidden_states[1], whole.hidden_states[1])
    for name in ("query", "key", "scores", "weights", "output"):  # the very same computation
        assert torch.equal(getattr(out.traces[1].self_attn.attention, name),
                           getattr(whole.traces[1].self_attn.attention, name))
    assert out.traces[1].residual is None and out.traces[1].self_attn.heads is None
