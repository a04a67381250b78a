"""``norm`` (Kobayashi et al., 2020): the per-head terms A_ij f^h(h_j) rebuild the attention
block's output exactly, and the scores are their lengths."""

from __future__ import annotations

import pytest
import torch

from qkv.explain.contributions import base, norm

TEXT = "The dog found some pizza next to the baby and ate it"


def worst_case(terms: torch.Tensor, attn) -> torch.Tensor:
    """(t, 1) Higham's bound (*Accuracy and Stability*, §3.1) on |Σ_h Σ_j A f + b_O − output|.

    Rebuilt: each f^h = v W_O^h is a d-term sum and the terms are added h·s at a time; the
    forward: each head's output an s-term sum, then out_proj an h·d-term sum. A float sum of n
    terms is within n·u·Σ|terms| (u = eps/2) of exact; both sides are sums of the same |A f|
    products, so together they are within (h·s + d + s + h·d + 2)·eps · Σ|A f| (+ |b_O|'s
    rounding, inside the 2).
    """
    h, _, s, _ = terms.shape
    d = attn.head_dim
    n = h * s + d + s + h * d + 2
    return n * torch.finfo(terms.dtype).eps * terms.abs().sum((0, 2)).amax(-1, keepdim=True)


def minilm_ids(model):
    return torch.tensor([model.tokenizer.encode(TEXT).ids])


@pytest.mark.parametrize("which", ["minilm", "gpt2", "llama"])
def test_terms_rebuild_the_attention_block_output(which, model, gpt2_pair, llama, ids):
    m, x = {"minilm": (model, None), "gpt2": (gpt2_pair[0], ids), "llama": (llama, ids)}[which]
    x = minilm_ids(m) if x is None else x
    fwd = base.run(m, x, slice(None))
    for layer, tr in zip(m.layers, fwd.traces):
        with torch.no_grad():
            out = layer.self_attn.out_proj(tr.self_attn.heads)[0]  # (t, E): the forward's own
            terms = norm.terms(layer.self_attn, tr.self_attn)  # (h, t, s, E)
            rebuilt = terms.sum((0, 2)) + base.out_bias(layer.self_attn)  # (t, E)
        err = (rebuilt - out).abs()  # (t, E)
        bound = worst_case(terms, layer.self_attn)  # (t, 1)
        assert bool((err <= bound).all()), (f"{which}: Σ_h Σ_j A f + b_O is {float(err.max()):.2e} "
                                            f"from the output (bound {float(bound.max()):.2e})")


def test_scores_are_the_terms_lengths(model):
    ids = minilm_ids(model)
    rows = torch.tensor([12, 5])
    s = norm.compute(model, ids, rows)
    fwd = base.run(model, ids, rows)
    for L, (layer, tr) in enumerate(zip(model.layers, fwd.traces)):
        with torch.no_grad():
            terms = norm.terms(layer.self_attn, tr.self_attn)  # (h, r, s, E)
        # per head: A‖f‖ against ‖A f‖ (A ≥ 0): E squares summed, a root and a product — within
        # (E + 4) roundings relative (Higham §3.1); per layer: the head sum (h terms, einsum's
        # order or the test's) inside the norm adds h·u·Σ_h‖A f‖. A weight near 1e-25 makes
        # squares below float32's smallest normal number: ‖A f‖ then loses up to √(E·tiny).
        E, h = terms.shape[-1], terms.shape[0]
        eps, tiny = torch.finfo(terms.dtype).eps, torch.finfo(terms.dtype).tiny
        torch.testing.assert_close(s.scores[L], terms.norm(dim=-1), rtol=(E + 4) * eps,
                                   atol=(E * tiny) ** 0.5)
        torch.testing.assert_close(s.layer_scores[L], terms.sum(0).norm(dim=-1), rtol=(E + 4) * eps,
                                   atol=float((h + 2) * eps * terms.norm(dim=-1).sum(0).max()))


def test_a_heavy_weight_on_a_short_value_moves_little(model):
    """The paper's point, on MiniLM: [CLS]'s share of a head's row shrinks once values count."""
    ids = minilm_ids(model)
    w = base.run(model, ids, torch.tensor([12])).traces
    s = norm.compute(model, ids, torch.tensor([12]))
    weight_cls = torch.stack([tr.self_attn.attention.weights[0, :, 0, 0] for tr in w])  # (L, h)
    norm_cls = base.shares(s.scores)[:, :, 0, 0]  # (L, h)
    heavy = weight_cls > 0.5
    assert heavy.sum() >= 10 and bool((norm_cls[heavy] < weight_cls[heavy].double()).all())
