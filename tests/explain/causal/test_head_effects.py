"""``head_effects`` (qkv.explain.head_effects): the probes' data and metrics, the batched effects
equal to ablating one head at a time, and errors for probes that do not apply."""

from __future__ import annotations

import pytest
import torch

from qkv.explain.causal.head_effects import head_effects, task
from qkv.explain.probes.induction import alternating_pairs
from qkv.explain.wording import ArgumentError


@pytest.fixture(scope="module")
def lm():
    import qkv

    return qkv.load("lm")  # the shipped 2-layer, 2-head decoder


def test_alternating_pairs_need_the_previous_token(lm):
    ids = alternating_pairs(lm, sequences=5, length=6, seed=1)
    body = ids[:, 1:]  # after <bos>
    assert ids.shape == (5, 13) and (ids[:, 0] == 0).all()
    assert (body[:, 0] != body[:, 1]).all()
    # from the third token on, the next token is the one before the current one
    assert torch.equal(body[:, 2:], body[:, :-2])


def test_induction_scores_the_repeated_half_only(lm):
    t = task(lm, "induction", sequences=2, length=10, seed=0)
    assert t.ids[0].shape == (1, 21)
    # prediction i → token i + 1; the second copy's r₀ is at 11, so r₁ … r₉ are predicted from 11 … 19
    assert t.scored.nonzero().flatten().tolist() == list(range(11, 20))


def test_probes_that_do_not_apply(lm, model):
    with pytest.raises(ArgumentError, match=r"probe coref cannot run on qkv-lm"):
        head_effects(lm, "coref")
    with pytest.raises(ArgumentError, match=r"probe induction measures next-token loss; "
                                            r"all-MiniLM-L6-v2 is an encoder"):
        head_effects(model, "induction")
    with pytest.raises(ArgumentError, match=r"unknown probe 'copying'"):
        head_effects(lm, "copying")


def one_at_a_time(model, probe, mode, sequences):
    """effects (L, h) by ablating each head alone with :func:`ablate`, one sequence at a time."""
    from qkv.explain.causal.head_effects import metric
    from qkv.explain.causal.interventions import ablate

    t_ = task(model, probe, sequences=sequences, length=None, seed=0)
    L, H = len(model.layers), model.layers[0].self_attn.num_heads
    out = torch.zeros(L, H, dtype=torch.float64)
    for i, ids in enumerate(t_.ids):
        index = torch.tensor([i])
        clean = ablate(model, ids, heads=[], mode=mode)
        y0 = (clean.logits if clean.logits is not None else clean.hidden)[None]
        base = metric(t_, index, y0, y0)
        for l in range(L):
            for h in range(H):
                r = ablate(model, ids, heads=[(l, h)], mode=mode)
                y = (r.logits if r.logits is not None else r.hidden)[None]
                out[l, h] += float(metric(t_, index, y, y0) - base)
    return out / len(t_.ids)


@pytest.mark.parametrize("probe, mode", [("induction", "zero"), ("previous-token", "mean")])
def test_batched_effects_equal_one_head_at_a_time(lm, probe, mode):
    from tolerance import assert_agree, twin

    got = head_effects(twin(lm, torch.float64), probe, mode=mode, sequences=3).effects
    ref = one_at_a_time(twin(lm, torch.float64), probe, mode, 3)
    low = one_at_a_time(twin(lm, torch.float32), probe, mode, 3).float()  # a float32 computation
    assert_agree(got, ref, low, what=f"{probe} effects, batched vs one at a time")


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    """A random 2-layer Llama with grouped queries (4 heads, 2 key/value heads), loaded by qkv."""
    import qkv
    from hf_decoders import make_checkpoint

    path, _ = make_checkpoint(tmp_path_factory.mktemp("llama"), "LlamaConfig", "LlamaForCausalLM",
                              hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return qkv.load(path)


@pytest.mark.parametrize("mode", ["zero", "mean"])
def test_batched_effects_equal_one_head_at_a_time_with_grouped_queries(tiny_llama, mode):
    """A head ablated in one copy of the batch leaves its key/value group's other heads, and the
    other copies, as they are."""
    from tolerance import assert_agree, twin

    got = head_effects(twin(tiny_llama, torch.float64), "induction", mode=mode, sequences=2).effects
    ref = one_at_a_time(twin(tiny_llama, torch.float64), "induction", mode, 2)
    low = one_at_a_time(twin(tiny_llama, torch.float32), "induction", mode, 2).float()
    assert got.shape == (2, 4) and bool((ref != 0).any())
    assert_agree(got, ref, low, what=f"tiny llama (GQA) {mode} effects, batched vs one at a time")


def test_induction_heads_matter_on_the_shipped_lm(lm):
    e = head_effects(lm, "induction", sequences=10)
    # layer 1 holds the induction heads (tutorial): removing one raises the repeated-half loss
    assert e.effects[1].min() > 0.1 and e.clean < 1.0
    d = e.to_dict()
    assert d["kind"] == "head_effects" and len(d["effects"]) == 2 and len(d["effects"][0]) == 2


def test_coref_effects_on_minilm(model):
    e = head_effects(model, "coref", layers=True)
    assert e.effects.shape == (6, 12) and e.layer_effects.shape == (6,)
    assert e.clean == 0.0 and (e.effects >= 0).all()  # 1 − cos to itself is 0; the rest ≥ 0
