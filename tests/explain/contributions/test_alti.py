"""``alti`` (Ferrando et al., 2022): the reconstruction y_i = Σ_j T_i(x_j) + biases holds for
post-norm LayerNorm (MiniLM), pre-norm LayerNorm (GPT-2), pre-norm RMSNorm with grouped-query
attention (Llama) and post-norm RMSNorm; the check in the code path fails on a wrong
decomposition; rows are distributions and causal models stay causal."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from qkv.explain.contributions import alti, base, check_method
from qkv.explain.wording import ArgumentError
from qkv.modules import TransformerLayer
from tolerance import softmax_sum_tolerance

TEXT = "The dog found some pizza next to the baby and ate it"


def model_and_ids(which, model, gpt2_pair, llama, rms_post, ids):
    if which == "minilm":
        return model, torch.tensor([model.tokenizer.encode(TEXT).ids])
    return {"gpt2": gpt2_pair[0], "llama": llama, "rms_post": rms_post}[which], ids


@pytest.mark.parametrize("which", ["minilm", "gpt2", "llama", "rms_post"])
def test_terms_rebuild_the_forwards_output(which, model, gpt2_pair, llama, rms_post, ids):
    m, x = model_and_ids(which, model, gpt2_pair, llama, rms_post, ids)
    fwd = base.run(m, x, slice(None))
    with torch.no_grad():
        for i, layer in enumerate(m.layers):
            terms, bias, y = alti.layer_terms(layer, fwd, i)  # raises past the tolerance itself
            assert terms.shape == (x.shape[1], x.shape[1], y.shape[-1])
            err = float((terms.sum(1) + bias - y).abs().max())
            tol = alti.RECONSTRUCTION_TOLERANCE * max(1.0, float(y.abs().max()))
            assert err <= tol, f"{which} layer {i}: {err:.2e}"


@pytest.mark.parametrize("which", ["minilm", "gpt2", "llama", "rms_post"])
def test_rows_are_distributions(which, model, gpt2_pair, llama, rms_post, ids):
    m, x = model_and_ids(which, model, gpt2_pair, llama, rms_post, ids)
    t = x.shape[1]
    mats = alti.matrices(m, x)
    for c in mats:
        assert bool((c >= 0).all())
        # each row is divided by its own sum: a softmax row's rounding argument bounds the sum
        torch.testing.assert_close(c.sum(-1), torch.ones(t), atol=softmax_sum_tolerance(t, c.dtype), rtol=0)
    if which in ("gpt2", "llama"):
        assert all(bool((torch.triu(c, diagonal=1) == 0).all()) for c in mats)
    s = alti.METHOD.run(m, x, torch.tensor([t - 1]))
    # The registry multiplies only the last layer's row by R^{L−1}; the full product's row is the
    # same t-term dot product, perhaps summed in another order by BLAS. Each term is a product of
    # non-negative numbers ≤ 1 whose sum is ≈ 1, so two orders differ by at most 2·t roundings.
    torch.testing.assert_close(s.scores[-1], base.rollout(mats)[-1][[t - 1]],
                               atol=2 * t * torch.finfo(s.scores.dtype).eps, rtol=0)


def test_a_wrong_decomposition_is_caught(model, monkeypatch):
    """The check in the code path can fail: values 0.1% too long no longer add up."""
    ids = torch.tensor([model.tokenizer.encode(TEXT).ids])
    real = alti.value_vectors
    monkeypatch.setattr(alti, "value_vectors", lambda attn, tr: real(attn, tr) * 1.001)
    with pytest.raises(AssertionError, match=r"ALTI: layer 0's terms sum to within"):
        alti.matrices(model, ids)


def test_matrix_follows_the_papers_formula():
    y = torch.tensor([[1.0, -2.0]])  # one token i, ‖y‖₁ = 3
    terms = torch.tensor([[[1.0, -2.0], [0.0, 0.0], [-1.0, 2.0]]])  # T_i(x_j) for j = 0, 1, 2
    # c = max(0, 3 − ‖y − T‖₁): 3, 0, max(0, 3 − 6) = 0
    assert alti.matrix(terms, y).tolist() == [[1.0, 0.0, 0.0]]


class Parallel(TransformerLayer):
    def forward(self, x, **kwargs):  # a layer that does not run the sequential residual
        return super().forward(x, **kwargs)


def test_parallel_residual_layers_are_refused():
    fake = nn.Module()
    fake.name = "parallel"
    fake.layers = nn.ModuleList([Parallel.build(8, 2, 16, norm_first=True)])
    with pytest.raises(ArgumentError, match=r"'alti' does not apply to parallel: its layers "
                                            r"\(Parallel\) do not form x \+ attn before the feed-forward"):
        check_method(fake, "alti")
    check_method(fake, "norm")  # the others read any self-attention layer


class OffsetScale(nn.Module):
    """Gemma's RMSNorm under a name that says nothing: x / rms(x) · (1 + γ), γ stored."""

    def __init__(self, width: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(0.3 * torch.randn(width))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * (1 + self.weight)


def test_a_norm_is_known_by_what_it_does_not_its_name(rms_post, ids):
    """Post-norm layers whose norms scale by 1 + γ under a class name with neither "rms" nor
    "LayerNorm" in it: read as RMSNorms with γ offset (`qkv.modules.norms.norm_kind`), and the
    terms rebuild the forward's output."""
    torch.manual_seed(4)
    m = type(rms_post)().eval()  # conftest's post-norm stack, fresh
    for layer in m.layers:
        layer.norm1, layer.norm3 = OffsetScale(32), OffsetScale(32)
    fwd = base.run(m, ids, slice(None))
    with torch.no_grad():
        for i, layer in enumerate(m.layers):
            terms, bias, y = alti.layer_terms(layer, fwd, i)  # raises past the tolerance itself
            assert float((terms.sum(1) + bias - y).abs().max()) <= \
                alti.RECONSTRUCTION_TOLERANCE * max(1.0, float(y.abs().max()))
