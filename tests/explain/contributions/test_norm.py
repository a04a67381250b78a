"""``norm`` (Kobayashi et al., 2020): the per-head terms A_ij f^h(h_j) rebuild the attention
block's output exactly, and the scores are their lengths."""

from __future__ import annotations

import pytest
import torch

from qkv.explain.contributions import base, norm

TEXT = "The dog found some pizza next to the baby and ate it"
# The bound for float32: a sum of h·t float32 products against the forward's own
# out_proj; measured ~1e-6 on MiniLM (outputs of size ~10).
RECONSTRUCTION = 1e-5


def block_outputs(model, ids):
    """(Forward tracing every row, each layer's self-attention output as the forward made it)."""
    outs = []
    hooks = [layer.self_attn.register_forward_hook(lambda m, a, o: outs.append(o.output))
             for layer in model.layers]
    try:
        fwd = base.run(model, ids, slice(None))
    finally:
        for h in hooks:
            h.remove()
    return fwd, outs


def minilm_ids(model):
    return torch.tensor([model.tokenizer.encode(TEXT).ids])


@pytest.mark.parametrize("which", ["minilm", "gpt2", "llama"])
def test_terms_rebuild_the_attention_block_output(which, model, gpt2_pair, llama, ids):
    m, x = {"minilm": (model, None), "gpt2": (gpt2_pair[0], ids), "llama": (llama, ids)}[which]
    x = minilm_ids(m) if x is None else x
    fwd, outs = block_outputs(m, x)
    for layer, tr, out in zip(m.layers, fwd.traces, outs):
        with torch.no_grad():
            terms = norm.terms(layer.self_attn, tr.self_attn)  # (h, t, s, E)
            rebuilt = terms.sum((0, 2)) + base.out_bias(layer.self_attn)  # (t, E)
        err = float((rebuilt - out[0]).abs().max())
        assert err <= RECONSTRUCTION, f"{which}: Σ_h Σ_j A f + b_O is {err:.2e} from the output"


def test_scores_are_the_terms_lengths(model):
    ids = minilm_ids(model)
    rows = torch.tensor([12, 5])
    s = norm.compute(model, ids, rows)
    fwd = base.run(model, ids, rows)
    for L, (layer, tr) in enumerate(zip(model.layers, fwd.traces)):
        with torch.no_grad():
            terms = norm.terms(layer.self_attn, tr.self_attn)  # (h, r, s, E)
        torch.testing.assert_close(s.scores[L], terms.norm(dim=-1))
        torch.testing.assert_close(s.layer_scores[L], terms.sum(0).norm(dim=-1))


def test_a_heavy_weight_on_a_short_value_moves_little(model):
    """The paper's point, on MiniLM: [CLS]'s share of a head's row shrinks once values count."""
    ids = minilm_ids(model)
    w = base.run(model, ids, torch.tensor([12])).traces
    s = norm.compute(model, ids, torch.tensor([12]))
    weight_cls = torch.stack([tr.self_attn.attention.weights[0, :, 0, 0] for tr in w])  # (L, h)
    norm_cls = base.shares(s.scores)[:, :, 0, 0]  # (L, h)
    heavy = weight_cls > 0.5
    assert heavy.sum() >= 10 and bool((norm_cls[heavy] < weight_cls[heavy].double()).all())
