"""Gated DeltaNet and KDA as a matrix: M·v is the layer's output, M is its one-hot run, rows agree.

Tolerances (tests/tolerance.py): transformers' kernels compute in float32 whatever the module's
dtype, so the layer's output and its one-hot run are compared with M·v and M in float64 by
``assert_within``: no further than FACTOR times the float32 run of qkv's own closed form from the
same recorded arguments (normalisation included) plus 2 float32 ulp (the kernels' results are
float32 numbers, compared as such: ``.float()`` is exact on them). FACTOR 4: the kernels solve the same triangular systems chunk by chunk (64 tokens) and
carry the state between chunks, a different order of the same roundings (flash-attention's 2,
doubled for the chunk-to-chunk state that the closed form does not have). The backward-sweep
row and the matrix are one answer computed two ways in float64: ``assert_agree``.
"""

from __future__ import annotations

import dataclasses
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from mixer_layers import inputs, kimi_kda, olmo_hybrid_delta, one_hot_values, qwen3_5_delta, qwen3_next_delta
from tolerance import assert_agree, assert_within, max_err

from qkv.errors import QkvError
from qkv.explain.mixers import gated_deltanet, kda
from qkv.explain.mixers.capture import KernelCall, kernel_call
from qkv.explain.mixers.delta_rule import DeltaRule, from_call

FACTOR = 4.0
LAYERS = {  # name → (builder, the reader's module, transformers' one-token-at-a-time reference)
    "qwen3_next": (qwen3_next_delta, gated_deltanet, "torch_recurrent_gated_delta_rule"),
    "qwen3_5": (qwen3_5_delta, gated_deltanet, "torch_recurrent_gated_delta_rule"),
    "olmo_hybrid": (olmo_hybrid_delta, gated_deltanet, "torch_recurrent_gated_delta_rule"),
    "kimi_linear": (kimi_kda, kda, "recurrent_kimi_delta_attention"),
}


def _read(name: str, t: int):
    """The layer, its kernel call, the delta rule in float64 (as ``read`` gives it) and in float32."""
    build, reader, _ = LAYERS[name]
    layer = build()
    call = kernel_call(layer, reader.KERNEL, inputs(t))
    rule = reader.read(layer, inputs(t))
    assert torch.equal(rule.matrix(0), from_call(rule.kind, call).matrix(0))  # read = that call, float64
    return layer, call, rule, from_call(rule.kind, call, torch.float32)


@pytest.mark.parametrize("name", list(LAYERS))
@pytest.mark.parametrize("t", [1, 7, 33, 100])
def test_matrix_times_values_is_the_layers_output(name, t):
    _, _, rule, low = _read(name, t)
    for h in range(rule.heads):
        M = rule.matrix(h)
        assert torch.equal(M.triu(1), torch.zeros_like(M)), "causal: nothing above the diagonal"
        assert_within(rule.output[:, h].float(), M @ rule.values(h), low.matrix(h) @ low.values(h), factor=FACTOR,
                      what=f"{name} head {h}: kernel output vs M·v")


@pytest.mark.parametrize("name", list(LAYERS))
@pytest.mark.parametrize("t", [7, 33, 100])
def test_matrix_is_the_one_hot_run(name, t):
    """transformers' recurrent form, fed the captured q, k, g, β and one-hot values, gives M."""
    layer, call, rule, low = _read(name, t)
    reference = getattr(sys.modules[type(layer).__module__], LAYERS[name][2])
    a = call.arguments
    out, _ = reference(a["query"], a["key"], one_hot_values(t, rule.heads), g=a["g"],
                                          beta=a["beta"], initial_state=None, output_final_state=False,
                                          use_qk_l2norm_in_kernel=a["use_qk_l2norm_in_kernel"])
    for h in range(rule.heads):
        assert_within(out[0, :, h].float(), rule.matrix(h), low.matrix(h), factor=FACTOR,
                      what=f"{name} head {h}: one-hot run vs M")


def _assert_row_is_matrix_row(row, ref, lows, what: str = "result"):
    """The row's sweep and the matrix are two computations: their difference is bounded by the sum
    of their errors, each measured one precision down (the float32 runs in `lows`: the row's, the
    matrix's) against the float64 matrix `ref` (tolerance.py's `assert_agree`)."""
    errors = [max_err(x, ref) for x in lows]
    worst = max(errors)
    assert_agree(row, ref, lows[errors.index(worst)], factor=4.0 * sum(errors) / worst if worst > 0 else 4.0,
                 what=what)


@pytest.mark.parametrize("name", list(LAYERS))
@pytest.mark.parametrize("chunk", [1, 5, 64])
def test_row_by_the_backward_sweep_is_the_matrix_row(name, chunk):
    t = 100
    _, _, rule, low = _read(name, t)
    for h in range(rule.heads):
        M = rule.matrix(h)
        M_low = low.matrix(h)
        for i in (0, 1, 16, 64, t - 1):
            _assert_row_is_matrix_row(rule.row(h, i, chunk=chunk), M[i], (low.row(h, i, chunk=chunk), M_low[i]),
                                      what=f"{name} head {h} row {i} in chunks of {chunk}")


def test_without_decay_or_writes_a_row_is_zero_and_with_beta_one_the_last_write_wins():
    """β = 0 writes nothing: M = 0. β = 1 with one repeated key overwrites: o_i reads only v_i."""
    t, c = 5, 4
    k = torch.zeros(t, 1, c, dtype=torch.float64)
    k[..., 0] = 1.0
    q = k * c ** -0.5
    zero = DeltaRule(kind="gated_deltanet", query=q, key=k, value=torch.randn(t, 1, 3, dtype=torch.float64),
                     log_decay=torch.zeros(t, 1, dtype=torch.float64), beta=torch.zeros(t, 1, dtype=torch.float64),
                     output=torch.zeros(t, 1, 3, dtype=torch.float64))
    assert torch.equal(zero.matrix(0), torch.zeros(t, t, dtype=torch.float64))
    overwrite = dataclasses.replace(zero, beta=torch.ones(t, 1, dtype=torch.float64))
    assert torch.allclose(overwrite.matrix(0), torch.eye(t, dtype=torch.float64) * c ** -0.5, atol=1e-15)
    assert torch.allclose(overwrite.row(0, t - 1), overwrite.matrix(0)[t - 1], atol=1e-15)


def test_a_query_out_of_range_is_named():
    _, _, rule, _ = _read("qwen3_next", 7)
    with pytest.raises(QkvError, match="query 7 is out of range for a text of 7 tokens"):
        rule.row(0, 7)


@settings(max_examples=25)
@given(t=st.integers(1, 40), c=st.integers(1, 6), per_channel=st.booleans(), beta_max=st.sampled_from([1.0, 2.0]),
       seed=st.integers(0, 2**16))
def test_the_delta_rule_on_random_inputs_is_transformers_recurrence_on_one_hot_values(t, c, per_channel, beta_max, seed):
    """Any q, k, decays ≤ 1 and β ∈ [0, 2] (not only what a layer makes): M = transformers'
    token-by-token recurrence fed one-hot values; rows in chunks of 3 agree."""
    from transformers.models.kimi_linear.modeling_kimi_linear import recurrent_kimi_delta_attention
    from transformers.models.qwen3_next.modeling_qwen3_next import torch_recurrent_gated_delta_rule

    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(1, t, 1, c, generator=g, dtype=torch.float64) for _ in range(2))
    decay = -torch.rand(1, t, 1, *((c,) if per_channel else ()), generator=g, dtype=torch.float64)
    beta = beta_max * torch.rand(1, t, 1, generator=g, dtype=torch.float64)
    recurrence = recurrent_kimi_delta_attention if per_channel else torch_recurrent_gated_delta_rule
    args = dict(query=q, key=k, value=one_hot_values(t, 1), g=decay, beta=beta, initial_state=None,
                output_final_state=False, use_qk_l2norm_in_kernel=True)
    out, _ = recurrence(**args)
    rule, low = (from_call("kda", KernelCall(args, (out, None)), dtype) for dtype in (torch.float64, torch.float32))
    assert_within(out[0, :, 0].float(), rule.matrix(0), low.matrix(0), factor=FACTOR, what="one-hot recurrence vs M")
    i = t - 1
    _assert_row_is_matrix_row(rule.row(0, i, chunk=3), rule.matrix(0)[i], (low.row(0, i, chunk=3), low.matrix(0)[i]))
