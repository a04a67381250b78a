"""--no-projection: attention with q = k = v = x. A token attends most to itself exactly when no
other vector has a larger dot product with it — a matter of norms, checked both ways."""

import json

import pytest
import torch

import qkv
from qkv.explain import forward, no_projection
from qkv.explain.causal.ablation import ablation, layer_self, no_projection_weights


@pytest.fixture(scope="module")
def model():
    return qkv.load("minilm")


def test_no_projection_is_softmax_of_gram_matrix():
    x = torch.randn(9, 16, dtype=torch.float64)
    ref = torch.softmax(x @ x.T / 4.0, dim=-1)  # 1/√16
    torch.testing.assert_close(no_projection_weights(x), ref)


def test_equal_norms_always_attend_to_themselves():
    x = torch.nn.functional.normalize(torch.randn(20, 64, dtype=torch.float64), dim=-1) * 3.0
    # Cauchy–Schwarz: x_i·x_j < ‖x_i‖² for distinct vectors of equal norm
    assert (no_projection_weights(x).argmax(-1) == torch.arange(20)).all()


def test_a_long_vector_draws_attention():
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [4.0, 4.0]])
    s = layer_self(0, x, torch.eye(3)[None])
    assert s.plain_self.tolist() == [False, False, True]
    assert s.plain_target.tolist() == [2, 2, 2]
    assert s.learned_rate == 1.0 and s.plain_rate == pytest.approx(1 / 3)


@pytest.mark.parametrize("text", ["The dog found some pizza next to the baby and ate it",
                                  "The boy kicked the ball over the fence and then chased it."])
def test_self_attention_iff_no_larger_dot_product(model, text):
    traced = forward.trace(model, text, slice(None))
    layers = ablation(traced.traces)
    assert len(layers) == 6
    for L, s in enumerate(layers):
        x = traced.hidden_states[L][0].double()  # BERT is post-norm: the layer's input itself
        gram = x @ x.T
        expected = gram.diagonal() >= gram.max(-1).values
        assert s.plain_self.tolist() == expected.tolist()
        learned = traced.weights(L)  # (h, t, t)
        assert s.learned_rate == pytest.approx(
            float((learned.argmax(-1) == torch.arange(x.shape[0])).double().mean()))


def test_ablation_needs_all_rows(model):
    traced = forward.trace(model, "a b c", torch.tensor([1]))
    with pytest.raises(ValueError, match="every query row"):
        ablation(traced.traces)


def test_no_projection_of_a_text(model):
    text = "The dog found some pizza next to the baby and ate it"
    r = no_projection(model, text)
    assert (r.model, r.text, r.width, len(r.layers)) == ("all-MiniLM-L6-v2", text, 384, 6)
    assert r.tokens == model.tokenizer.encode(text).tokens
    d = json.loads(json.dumps(r.to_dict(), allow_nan=False))
    assert [l["no_projection_self_rate"] for l in d["layers"]] == [s.plain_rate for s in r.layers]
    only = no_projection(model, text, layer=5)
    assert [s.layer for s in only.layers] == [5]
    assert only.layers[0].plain_self.tolist() == r.layers[5].plain_self.tolist()
    with pytest.raises(ValueError, match="^layer 6 is out of range"):
        no_projection(model, text, layer=6)
