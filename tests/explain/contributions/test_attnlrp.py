"""``attnlrp``: each rule against the paper's formula, conservation (y = Σ R(x_j) + what the
biases, β and softmax linearisations kept) on MiniLM, GPT-2, Llama and a transformers Llama, the
forward left bit-identical, and qkv's per-weight relevance equal to the same rules run through
transformers' own eager attention."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hf_decoders import make_checkpoint
from qkv.explain.contributions import attnlrp, contributions
from qkv.explain.forward import num_layers
from tolerance import twin, ulp, unit_roundoff_ratio

TEXT = "The dog found some pizza next to the baby and ate it"


def relevance_of(inputs, y) -> list[torch.Tensor]:
    """R = x ⊙ G for each of ``inputs`` (G: the rules' gradient of the scalar ``y``)."""
    return [x * g for x, g in zip(inputs, torch.autograd.grad(y, inputs))]


# -- the rules, one at a time ---------------------------------------------------------------------
def test_softmax_rule_is_eq_11():
    torch.manual_seed(0)
    x = torch.randn(7, dtype=torch.float64, requires_grad=True)
    g = torch.randn(7, dtype=torch.float64)
    rules = attnlrp.Rules()
    with rules:
        s = torch.softmax(x, dim=-1)
    (r_in,) = relevance_of([x], (s * g).sum())
    r_out = (s * g).detach()
    expected = x.detach() * (r_out - s.detach() * r_out.sum())  # R_x = x (R_s − s Σ R_s)
    torch.testing.assert_close(r_in, expected, rtol=0, atol=4 * ulp(expected, torch.float64))
    # what it did not hand on is in the ledger
    torch.testing.assert_close(float(r_out.sum() - r_in.sum().detach()), float(sum(rules.ledger)))


@pytest.mark.parametrize("op", [torch.mul, torch.matmul])
def test_products_split_relevance_evenly(op):
    torch.manual_seed(1)
    a = torch.randn(4, 4, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, 4, dtype=torch.float64, requires_grad=True)
    with attnlrp.Rules():
        y = op(a, b)
    assert torch.equal(y, op(a, b))  # the forward's value is untouched
    r_a, r_b = relevance_of([a, b], y.sum())
    half = 0.5 * float(y.detach().sum())
    assert abs(float(r_a.sum()) - half) <= 8 * ulp(y.abs().sum(), torch.float64)
    assert abs(float(r_b.sum()) - half) <= 8 * ulp(y.abs().sum(), torch.float64)


def test_norms_hold_one_over_sigma_constant():
    torch.manual_seed(2)
    x = torch.randn(3, 8, dtype=torch.float64, requires_grad=True)
    w, b = torch.rand(8, dtype=torch.float64) + 0.5, torch.randn(8, dtype=torch.float64)
    g = torch.randn(3, 8, dtype=torch.float64)
    rules = attnlrp.Rules()
    with rules:
        y = F.layer_norm(x, (8,), w, b, 1e-5)
    assert torch.equal(y, F.layer_norm(x, (8,), w, b, 1e-5))
    (r,) = relevance_of([x], (y * g).sum())
    sigma = (x.var(-1, unbiased=False, keepdim=True) + 1e-5).sqrt().detach()
    linear = w * (x.detach() - x.detach().mean(-1, keepdim=True)) / sigma  # y − β, linear in x
    # ε-rule on the linear map x ↦ γ (x − μ)/σ: row relevance Σ_i R_i = Σ_k (y_k − β_k) g_k
    torch.testing.assert_close(r.sum(-1), (linear * g).sum(-1))
    torch.testing.assert_close(float(sum(rules.ledger)), float((b * g).sum()))


@pytest.mark.parametrize("act", [F.gelu, F.silu, F.relu])
def test_activations_pass_relevance_through(act):
    torch.manual_seed(3)
    x = torch.randn(20, dtype=torch.float64, requires_grad=True)
    g = torch.randn(20, dtype=torch.float64)
    with attnlrp.Rules():
        y = act(x)
    (r,) = relevance_of([x], (y * g).sum())
    torch.testing.assert_close(r, (y * g).detach())  # R_x = R_y, element by element


# -- conservation on whole models ------------------------------------------------------------------
def assert_conserved(r64: attnlrp.Relevance, r32: attnlrp.Relevance, layers: int):
    """|y − Σ R − absorbed| in float64 is rounding. Relevance reaches the tokens through ``layers``
    blocks, each handing every term on with a few roundings (the ε-rule's division, the products'
    halves, the residual's sum), so the float64 gap is bounded by one unit roundoff per block and
    term, 4 × (layers + 1) · eps64 · (|y| + Σ|R| + |absorbed|) — or by 4× the same gap measured in
    float32 and rescaled by eps64/eps32, whichever is larger (the float32 gap alone may round
    luckily small). A missed rule leaves a gap of order y, ~10¹³ times either bound."""
    gap64 = abs(r64.y - float(r64.tokens.sum()) - r64.absorbed)
    gap32 = abs(r32.y - float(r32.tokens.sum()) - r32.absorbed)
    magnitude = abs(r64.y) + float(r64.tokens.abs().sum()) + abs(r64.absorbed)
    per_block = 4 * (layers + 1) * torch.finfo(torch.float64).eps * magnitude
    tol = max(4 * gap32 * unit_roundoff_ratio(torch.float64, torch.float32), per_block)
    assert gap64 <= tol, f"relevance not conserved: gap {gap64:.3g} > {tol:.3g} (y = {r64.y:.6g})"
    assert abs(float(r64.tokens.sum())) > 1e-3 * abs(r64.y)  # the tokens do receive relevance


def check_model(model, ids, rows):
    layers = num_layers(model)
    for r64, r32 in zip(attnlrp.relevance(twin(model, torch.float64), ids, rows),
                        attnlrp.relevance(twin(model, torch.float32), ids, rows)):
        assert_conserved(r64, r32, layers)


def test_conservation_minilm(model):
    ids = torch.tensor([model.tokenizer.encode(TEXT).ids])
    check_model(model, ids, [12, 5])


def test_conservation_gpt2(gpt2_pair, ids):
    check_model(gpt2_pair[0], ids, [10, 3])


def test_conservation_llama(llama, ids):
    check_model(llama, ids, [10, 4])


def test_the_forward_is_left_as_it_was(llama, ids):
    plain = llama(ids, torch.ones_like(ids)).logits
    with torch.enable_grad(), attnlrp.Rules():
        ruled = llama(ids, torch.ones_like(ids)).logits
    assert torch.equal(plain, ruled.detach())


# -- a transformers model: conservation, and the same weights' relevance as qkv's -------------------
@pytest.fixture(scope="module")
def hf_llama(tmp_path_factory):
    import qkv

    path, hf = make_checkpoint(tmp_path_factory.mktemp("lrp"), "LlamaConfig", "LlamaForCausalLM",
                               hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2,
                               max_position_embeddings=32)
    return qkv.load(path), hf


def transformers_relevance(hf, ids, row):
    """(y, token relevance (t,), per-weight relevance (L, h, t, s), absorbed) through
    transformers' eager forward with the same rules."""
    rules = attnlrp.Rules()
    with torch.enable_grad():
        with rules:
            emb = hf.get_input_embeddings()(ids)
            out = hf(inputs_embeds=emb, output_attentions=True)
        logits = out.logits[0, row]
        y = logits[logits.argmax()]
        grads = torch.autograd.grad(y, [emb, *out.attentions])
    weights = torch.stack([(a * g)[0] for a, g in zip(out.attentions, grads[1:])])
    return float(y), (emb * grads[0])[0].sum(-1), weights, float(sum(rules.ledger))


def test_equals_the_rules_through_transformers(hf_llama):
    model, hf = hf_llama
    ids = torch.tensor([model.tokenizer.encode("Attention is all you need, said the paper.").ids])
    row = ids.shape[1] - 2
    ours = attnlrp.relevance(twin(model, torch.float64), ids, [row])[0]
    y, tokens, weights, absorbed = transformers_relevance(twin(hf, torch.float64), ids, row)
    low = transformers_relevance(twin(hf, torch.float32), ids, row)
    # the same rules on the same weights, two implementations. transformers' RMSNorm and softmax
    # round to float32 even in a float64 model, so its float64 run carries float32 roundings:
    # qkv may differ from it by at most 4× what transformers' own float32 run does (+ 2 ulp)
    for got, ref, lo in ((ours.tokens, tokens, low[1]), (ours.weights, weights, low[2])):
        tol = 4 * float((lo.double() - ref).abs().max()) + 2 * ulp(ref, torch.float64)
        assert float((got - ref).abs().max()) <= tol
        assert float((lo.double() - ref).abs().max()) < 1e-3 * float(ref.abs().max())  # not vacuous
    # conserved in transformers too: its float32 roundings (norms, softmax) bound the gap
    gap32 = abs(low[0] - float(low[1].sum()) - low[3])
    assert abs(y - float(tokens.sum()) - absorbed) <= 4 * gap32 + 2 * ulp(torch.tensor(y), torch.float64)


def test_contributions_runs_it(model):
    c = contributions(model, TEXT, token="it", method="attnlrp")
    assert c.per == "head" and c.scores.shape == (6, 12, len(c.tokens))
    assert "final vector" in c.target  # an encoder: the token's own final vector is explained
