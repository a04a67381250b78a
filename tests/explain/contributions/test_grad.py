"""``grad`` equals autograd through transformers' eager attention, same target, in float64:
∂y/∂A read off transformers' own attention probabilities (``retain_grad``), where qkv reads it
from the heads' outputs (∂y/∂A_ij = ⟨∂y/∂o_i, v_j⟩)."""

from __future__ import annotations

import pytest
import torch

from qkv.explain.contributions import grad
from qkv.explain.wording import ArgumentError
from tolerance import assert_agree, twin

TEXT = "The dog found some pizza next to the baby and ate it"
OTHER = "a dog ate the pizza"


def chefer(attentions) -> torch.Tensor:
    """(L, t, t) R^ℓ − I with R^ℓ = R^{ℓ−1} + mean_h (A ⊙ ∂y/∂A)⁺ R^{ℓ−1}, in A's dtype."""
    r, out = None, []
    for a in attentions:
        m = (a * a.grad)[0].clamp_min(0).mean(0).detach()  # (t, t)
        eye = torch.eye(m.shape[0], dtype=m.dtype)
        r = eye if r is None else r
        r = r + m @ r
        out.append(r - eye)
    return torch.stack(out)


def transformers_encoder(hf, ids, other_ids) -> torch.Tensor:
    with torch.no_grad():
        e_other = hf(other_ids).last_hidden_state[0].mean(0)
    out = hf(ids, output_attentions=True)
    for a in out.attentions:
        a.retain_grad()
    y = torch.cosine_similarity(out.last_hidden_state[0].mean(0), e_other, dim=0)
    y.backward()
    return chefer(out.attentions)


def transformers_decoder(hf, ids, row: int) -> torch.Tensor:
    out = hf(ids, output_attentions=True)
    for a in out.attentions:
        a.retain_grad()
    logits = out.logits[0, row]
    logits[logits.argmax()].backward()
    return chefer(out.attentions)


def test_grad_equals_transformers_autograd_encoder(model, hf):
    ids = torch.tensor([model.tokenizer.encode(TEXT).ids])
    other = torch.tensor([model.tokenizer.encode(OTHER).ids])
    t = ids.shape[1]
    ref = transformers_encoder(twin(hf, torch.float64), ids, other)
    low = transformers_encoder(twin(hf, torch.float32), ids, other)
    got = grad.METHOD.run(twin(model, torch.float64), ids, torch.arange(t), target_text=OTHER)
    assert "similarity" in got.target
    assert_agree(got.scores, ref, low, what="grad R^ℓ − I (encoder)")


def test_grad_equals_transformers_autograd_decoder(gpt2_pair, ids):
    model, hf = gpt2_pair
    t, row = ids.shape[1], 7
    ref = transformers_decoder(twin(hf, torch.float64), ids, row)
    low = transformers_decoder(twin(hf, torch.float32), ids, row)
    got = grad.METHOD.run(twin(model, torch.float64), ids, torch.arange(t)[: row + 1])
    assert "next token" in got.target and f"at token {row}" in got.target
    assert_agree(got.scores, ref[:, : row + 1], low[:, : row + 1], what="grad R^ℓ − I (decoder)")


def test_grad_leaves_no_graph_and_no_grads_behind(model):
    ids = torch.tensor([model.tokenizer.encode("the cat sat").ids])
    s = grad.METHOD.run(model, ids, torch.tensor([2]), target_text="a cat")
    assert not s.scores.requires_grad
    assert all(p.grad is None for p in model.parameters())


def test_grad_needs_a_target_on_an_encoder_and_none_on_a_decoder(model, gpt2_pair):
    with pytest.raises(ArgumentError, match=r"does not apply to all-MiniLM-L6-v2 without a target"):
        grad.check_target(model, None)
    with pytest.raises(ArgumentError, match=r"target_text is empty"):
        grad.check_target(model, "  ")
    with pytest.raises(ArgumentError, match=r"target_text is for encoders"):
        grad.check_target(gpt2_pair[0], "some text")
