"""``value-zeroing`` equals a re-run of transformers' own layers with one value vector zeroed
(a forward hook on BertSelfAttention's ``value`` projection), in float64."""

from __future__ import annotations

import pytest
import torch

from qkv.explain.contributions import value_zeroing
from tolerance import softmax_sum_tolerance, assert_agree, twin

TEXT = "the cat sat on the mat."


def hooked_transformers(hf, ids) -> torch.Tensor:
    """(L, t, t) C^ℓ from transformers: each layer re-run on its input with v_j = 0."""
    with torch.no_grad():
        hidden = hf(ids, output_hidden_states=True).hidden_states
        out = []
        for l, layer in enumerate(hf.encoder.layer):
            x = hidden[l]  # (1, t, E)
            base = layer(x)
            base = base[0] if isinstance(base, tuple) else base  # (1, t, E)
            t = x.shape[1]
            rows = []
            for j in range(t):
                def zero(module, args, output, j=j):
                    output = output.clone()
                    output[:, j] = 0
                    return output

                handle = layer.attention.self.value.register_forward_hook(zero)
                try:
                    y = layer(x)
                finally:
                    handle.remove()
                y = y[0] if isinstance(y, tuple) else y
                rows.append(1 - torch.cosine_similarity(base[0], y[0], dim=-1))  # (t,) over i
            c = torch.stack(rows, dim=1)  # (i, j)
            out.append(c / c.sum(-1, keepdim=True))
        return torch.stack(out)


@pytest.fixture(scope="module")
def minilm64(model):
    return twin(model, torch.float64)


def test_value_zeroing_equals_hooked_transformers(model, minilm64, hf):
    ids = torch.tensor([model.tokenizer.encode(TEXT).ids])
    ref = hooked_transformers(twin(hf, torch.float64), ids)
    low = hooked_transformers(hf, ids)  # the same in float32: how much rounding costs
    got = torch.stack(value_zeroing.matrices(minilm64, ids).layers)
    assert_agree(got, ref, low, what="value-zeroing C^ℓ")


def test_rolled_out_rows(model, minilm64):
    ids = torch.tensor([model.tokenizer.encode(TEXT).ids])
    mats = value_zeroing.matrices(minilm64, ids).layers
    s = value_zeroing.METHOD.run(minilm64, ids, torch.tensor([2]))
    # R^1 = C^1 · I and R^2 = C^2 · R^1: the same products the test writes (a product with the
    # identity adds exact zeros), so equal, not close
    assert torch.equal(s.scores[0], mats[0][[2]])
    assert torch.equal(s.scores[1], (mats[1] @ mats[0])[[2]])
    # each C row is divided by its own sum ((t + 1) roundings, softmax_sum_tolerance's argument)
    # and each product R = C R adds a t-term dot product of non-negative numbers summing to ≈ 1
    # (t roundings): to first order the L layers' errors add
    t, L = ids.shape[1], len(mats)
    tol = L * (softmax_sum_tolerance(t, torch.float64) + t * torch.finfo(torch.float64).eps)
    torch.testing.assert_close(s.scores.sum(-1), torch.ones(L, 1, dtype=torch.float64), atol=tol, rtol=0)


def test_causal_model_zeroing_a_later_value_changes_nothing(gpt2_pair, llama, ids):
    for m in (gpt2_pair[0], llama):
        for c in value_zeroing.matrices(m, ids).layers:
            assert bool((torch.triu(c, diagonal=1) == 0).all())
