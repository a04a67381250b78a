"""qkv.explain.circuits: score and logit attribution sum to the forward's own numbers, the
composition scores are their definition, and removing a component moves the score as predicted.

Bounds are derived, not tuned: each result carries ``bound`` — the forward's rounding of q and k
(measured against the parts' sums, each checked to be rounding) carried through the dot product,
plus that dot product's own rounding γ_d Σ|q||k| (Higham, Thm 3.1). Run in float64 the bound is
~1e-13; the tests also require it to be that small, so a loose bound cannot hide a wrong split.
"""

from __future__ import annotations

import pytest
import torch

import qkv
from qkv.errors import QkvError
from qkv.explain import composition, logit_attribution, score_attribution
from qkv.explain.circuits.ablate import remove_component
from qkv.explain.circuits.composition import head_matrices
from qkv.explain.circuits.residual import stream
from qkv.explain.contributions.base import run

SENTENCE = "The dog found some pizza next to the baby and ate it"
LM_TEXT = "baka bela dima fona baka bela dima fona"
HF_TEXT = "the dog found some pizza next to the baby and ate it"
# float64: the sums may differ from the forward by roundings of 2⁻⁵³ in a few hundred operations
TIGHT = 1e-10


@pytest.fixture(scope="module")
def minilm64():
    return qkv.load("minilm").double()


@pytest.fixture(scope="module")
def lm64():
    return qkv.load("lm").double()


@pytest.fixture(scope="module")
def hf64(tmp_path_factory):
    pytest.importorskip("transformers")
    from archs import DECODERS, build
    from test_adapter import save_tokenizer

    models = {}

    def get(name):
        if name not in models:
            path = tmp_path_factory.mktemp(name)
            build(DECODERS, name).save_pretrained(path)
            save_tokenizer(path, encoder=False)
            models[name] = qkv.load(path, via="hf", dtype=torch.float64)
        return models[name]
    return get


# transformers computes RMSNorms and RoPE tables in float32 even in a float64 model: its forward
# is then float32-rounded there (relative 2⁻²⁴ per step), and so is every bound derived from it
LOOSE = 1e-5


def check_sum(a, tight=TIGHT):
    assert abs(float(a.terms.sum()) - a.score) <= a.bound, (float(a.terms.sum()), a.score, a.bound)
    assert a.bound <= tight * max(1.0, abs(a.score))
    assert a.terms.shape == (len(a.query_components), len(a.key_components))


@pytest.mark.parametrize("layer,head", [(0, 0), (3, 1), (5, 11)])
def test_minilm_terms_sum_to_the_score(minilm64, layer, head):
    check_sum(score_attribution(minilm64, SENTENCE, layer=layer, head=head, token="it",
                                key="pizza"))


def test_minilm_float32_within_its_bound():
    a = score_attribution(qkv.load("minilm"), SENTENCE, layer=3, head=1, token="it", key="pizza")
    assert abs(float(a.terms.sum()) - a.score) <= a.bound
    assert a.key_components[0] == "embed" and a.key_components[-1] == "bias"
    assert len(a.key_components) == 1 + 3 * (12 + 1) + 1


@pytest.mark.parametrize("layer,head", [(0, 1), (1, 0), (1, 1)])
def test_lm_terms_sum_to_the_score(lm64, layer, head):
    check_sum(score_attribution(lm64, LM_TEXT, layer=layer, head=head, token=7, key=4))


@pytest.mark.parametrize("name", ["llama", "gpt2", "qwen2", "qwen3", "phi3", "gemma", "opt"])
def test_transformers_terms_sum_to_the_score(hf64, name):
    model = hf64(name)
    for layer in range(len(model.layers)):
        check_sum(score_attribution(model, HF_TEXT, layer=layer, head=1, token="it", key="pizza"),
                  LOOSE)


def test_the_stream_sums_to_every_hidden_state(minilm64, lm64):
    for model, text in ((minilm64, SENTENCE), (lm64, LM_TEXT)):
        ids = torch.tensor([model.tokenizer.encode(text).ids])
        fwd = run(model, ids, torch.tensor([0]))
        every = torch.arange(ids.shape[1])
        for layer in range(len(model.layers) + 1):
            st = stream(model, fwd, layer, every)
            want = fwd.hidden_states[layer][0]
            assert float((st.parts.sum(0) - want).abs().max()) <= TIGHT * float(want.abs().max())


def test_a_whole_row_matches_one_key_at_a_time(lm64):
    row = score_attribution(lm64, LM_TEXT, layer=1, head=0, token=7)
    assert row.keys.tolist() == list(range(8))  # causal: keys 0…7
    assert float((row.terms.sum(1) - row.scores).abs().max()) <= row.bound
    one = score_attribution(lm64, LM_TEXT, layer=1, head=0, token=7, key=4)
    assert torch.allclose(row.terms[4], one.key_totals(), rtol=0, atol=TIGHT)


def test_a_masked_key_is_refused(lm64):
    with pytest.raises(qkv.explain.ArgumentError, match="masked"):
        score_attribution(lm64, LM_TEXT, layer=1, head=0, token=3, key=5)


def test_logit_attribution_sums_to_the_logit(lm64, hf64):
    for model, text, token, tight in ((lm64, LM_TEXT, 7, TIGHT), (hf64("llama"), HF_TEXT, "ate", LOOSE),
                                      (hf64("gpt2"), HF_TEXT, "ate", TIGHT),
                                      (hf64("qwen2"), HF_TEXT, "ate", LOOSE)):
        a = logit_attribution(model, text, token=token)
        assert abs(float(a.contributions.sum()) - a.logit) <= a.bound
        assert a.bound <= tight * max(1.0, abs(a.logit))
        logits = model(torch.tensor([model.tokenizer.encode(text).ids])).logits[0, a.token_index]
        assert a.target_id == int(logits.argmax())  # the default target: the model's prediction


def test_the_lm_induction_heads_promote_the_copied_token(lm64):
    a = logit_attribution(lm64, LM_TEXT, token=7, target="fona")
    parts = dict(zip(a.components, a.contributions.tolist()))
    assert parts["L1.H0"] + parts["L1.H1"] > 0.5 * a.logit
    assert a.promoted["L1.H1"][0][0] == "fona"


def test_logit_attribution_refuses_an_encoder(minilm64):
    with pytest.raises(QkvError, match="no next-token logits"):
        logit_attribution(minilm64, SENTENCE)


def test_composition_is_its_definition(lm64, hf64):
    """Against the E × E matrices of Elhage et al.'s definitions, multiplied out in float64."""
    for model in (lm64, hf64("llama")):
        c = composition(model)
        fro = torch.linalg.matrix_norm
        mats = [head_matrices(model, ell) for ell in range(len(model.layers))]
        for l1 in range(len(mats)):
            for l2 in range(l1 + 1, len(mats)):
                for h1 in range(mats[0][0].shape[0]):
                    for h2 in range(mats[0][0].shape[0]):
                        ov1 = mats[l1][2][h1] @ mats[l1][3][h1]  # (E, E)
                        qk2 = mats[l2][0][h2] @ mats[l2][1][h2].T
                        ov2 = mats[l2][2][h2] @ mats[l2][3][h2]
                        want = {"q": fro(ov1 @ qk2) / (fro(ov1) * fro(qk2)),
                                "k": fro(qk2 @ ov1.T) / (fro(ov1) * fro(qk2)),
                                "v": fro(ov1 @ ov2) / (fro(ov1) * fro(ov2))}
                        for w, value in want.items():
                            got = getattr(c, w)[l1, h1, l2, h2]
                            assert abs(float(got - value)) <= 1e-12, (w, l1, h1, l2, h2)
        assert torch.isnan(c.k[1, :, 0]).all()  # only earlier → later


def test_removing_a_component_from_a_post_norm_key_is_exact(minilm64):
    """MiniLM's attention reads its layer's input itself: the key is linear in it, so removing
    a component moves the score by exactly its column of terms (to two forwards' roundings:
    4 × the bound of one)."""
    a = score_attribution(minilm64, SENTENCE, layer=3, head=1, token="it", key="pizza")
    top = a.key_components[int(a.key_totals().abs().argmax())]
    r = remove_component(minilm64, a, top)
    assert r.exact and abs(r.measured - r.predicted) <= 4 * a.bound
    assert abs(r.measured - r.before) > 0.1


def test_removing_a_component_from_a_pre_norm_key_rescales(lm64):
    """Llama's RMSNorm recomputes its scale on the edited key: with no bias anywhere,
    k' = (σ/σ')·(k − k_b), so the score is ratio × the frozen-scale prediction, exactly."""
    a = score_attribution(lm64, LM_TEXT, layer=1, head=0, token=7, key=4)
    for component in a.key_components[:-1]:
        r = remove_component(lm64, a, component)
        assert not r.exact
        assert abs(r.measured - r.scale_ratio * r.predicted) <= 4 * a.bound * r.scale_ratio


def test_a_sandwich_norm_is_refused_by_name(hf64):
    with pytest.raises(QkvError, match="does not form"):
        score_attribution(hf64("gemma2"), HF_TEXT, layer=1, head=0, token="it", key="pizza")


def test_a_post_norm_row_sums_to_every_score(minilm64):
    row = score_attribution(minilm64, SENTENCE, layer=3, head=1, token="it")
    assert row.terms.shape == (14, 41)  # every key of an encoder, 1 + 3 × 13 + 1 components
    assert float((row.terms.sum(1) - row.scores).abs().max()) <= row.bound <= TIGHT * 10


def test_a_transformers_post_norm_layer_is_refused_by_name(tmp_path):
    pytest.importorskip("transformers")
    from archs import ENCODERS, build
    from test_adapter import save_tokenizer

    build(ENCODERS, "bert").save_pretrained(tmp_path)
    save_tokenizer(tmp_path, encoder=True)
    with pytest.raises(QkvError, match="post-norm and its feed-forward is not one qkv runs"):
        score_attribution(qkv.load(tmp_path, via="hf"), HF_TEXT, layer=1, head=0, token="it",
                          key="pizza")
