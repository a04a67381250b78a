"""qkv.explain.circuits: score and logit attribution sum to the forward's own numbers, the
composition scores are their definition, and removing a component moves the score as predicted.

Bounds are derived, not tuned: each result carries ``bound`` — the forward's rounding of q and k
(measured against the parts' sums, each checked to be rounding) carried through the dot product,
plus that dot product's own rounding γ_d Σ|q||k| (Higham, Thm 3.1). Run in float64 the bound is
~1e-13; the tests also require it to be that small, so a loose bound cannot hide a wrong split.
"""

from __future__ import annotations

import re

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


# archs.py's RoBERTa pads with id 1, its tokenizer's [CLS]: transformers then counts positions
# around it, qkv's family does not; with [PAD]'s id 3 both read the same rows
ROBERTA_PAD3 = {"roberta-pad3": ("RobertaConfig", "RobertaModel", dict(pad_token_id=3))}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """name → a directory transformers saved (a tiny random model of tests/hf/archs.py)."""
    pytest.importorskip("transformers")
    from archs import DECODERS, ENCODERS, build
    from test_adapter import save_tokenizer

    dirs = {}

    def get(name):
        if name not in dirs:
            table = next(t for t in (ENCODERS, ROBERTA_PAD3, DECODERS) if name in t)
            dirs[name] = tmp_path_factory.mktemp(name)
            build(table, name).save_pretrained(dirs[name])
            save_tokenizer(dirs[name], encoder=table is not DECODERS)
        return dirs[name]
    return get


@pytest.fixture(scope="module")
def hf64(saved):
    """name → the transformers model on qkv's adapter (``via="hf"``), float64."""
    models = {}

    def get(name):
        if name not in models:
            models[name] = qkv.load(saved(name), via="hf", dtype=torch.float64)
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
    assert a.key_components[:3] == ("embed.token", "embed.position", "embed.type")
    assert a.key_components[-1] == "bias"
    assert len(a.key_components) == 3 + 3 * (12 + 1) + 1


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


@pytest.mark.parametrize("missing", ["layer", "head"])
def test_a_missing_layer_or_head_is_one_line(lm64, missing):
    # (issue 40) layer=None was a TypeError from a comparison, head=None a tensor index error
    where = {"layer": 1, "head": 0, missing: None}
    with pytest.raises(qkv.explain.ArgumentError, match=rf"^{missing} is required: .* got None$"):
        score_attribution(lm64, LM_TEXT, token=7, key=4, **where)


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


def test_a_post_norm_row_sums_to_every_score(minilm64):
    row = score_attribution(minilm64, SENTENCE, layer=3, head=1, token="it")
    assert row.terms.shape == (14, 43)  # every key of an encoder, 3 + 3 × 13 + 1 components
    assert float((row.terms.sum(1) - row.scores).abs().max()) <= row.bound <= TIGHT * 10


# -- transformers post-norm layers (BERT), the embeddings by table, refusals by name --------------
@pytest.mark.parametrize("name", ["bert", "distilbert", "roberta"])
def test_transformers_post_norm_terms_sum_to_the_score(hf64, name):
    """A transformers BERT: each norm3 reads what the forward recorded (LayerTrace.ffn_sum)."""
    model = hf64(name)
    for layer in range(len(model.layers)):
        for head in (0, 3):
            check_sum(score_attribution(model, HF_TEXT, layer=layer, head=head, token="it",
                                        key="pizza"))
    row = score_attribution(model, HF_TEXT, layer=1, head=2, token="it")
    assert float((row.terms.sum(1) - row.scores).abs().max()) <= row.bound <= TIGHT


@pytest.mark.parametrize("name,embeddings", [
    ("bert", ("embed.token", "embed.position", "embed.type")),
    ("roberta-pad3", ("embed.token", "embed.position", "embed.type")),
    ("distilbert", ("embed.token", "embed.position")), ("gpt2", ("embed.token", "embed.position"))])
def test_transformers_splits_as_the_native_family_does(saved, hf64, name, embeddings):
    """The same checkpoint through transformers and through qkv's own family: the same terms,
    component by component (two float64 forwards: 4 × the larger bound apart at most)."""
    native = qkv.load(saved(name), via="native", dtype=torch.float64)
    for layer, head in ((0, 1), (1, 2)):
        a = score_attribution(hf64(name), HF_TEXT, layer=layer, head=head, token="it", key="pizza")
        b = score_attribution(native, HF_TEXT, layer=layer, head=head, token="it", key="pizza")
        assert a.key_components == b.key_components
        assert a.key_components[:len(embeddings)] == embeddings
        assert float((a.terms - b.terms).abs().max()) <= 4 * max(a.bound, b.bound)


def test_removing_a_component_from_a_transformers_bert_key_is_exact(hf64):
    a = score_attribution(hf64("bert"), HF_TEXT, layer=1, head=1, token="it", key="pizza")
    top = a.key_components[int(a.key_totals().abs().argmax())]
    r = remove_component(hf64("bert"), a, top)
    assert r.exact and abs(r.measured - r.predicted) <= 4 * a.bound
    assert abs(r.measured - r.before) > 100 * a.bound  # it did move


@pytest.mark.parametrize("name,embeddings", [
    ("gpt2", ("embed.token", "embed.position")), ("opt", ("embed.token", "embed.position")),
    ("llama", ("embed.token",)), ("gemma", ("embed.token",))])
def test_the_embeddings_split_by_table(hf64, name, embeddings):
    """GPT-2 and OPT add a learned position row, RoPE models none; Gemma's token rows are
    scaled by √E in its embedding module (read as the module computes them)."""
    model = hf64(name)
    a = score_attribution(model, HF_TEXT, layer=1, head=1, token="it", key="pizza")
    assert a.key_components[:len(embeddings) + 1] == (*embeddings, "L0.H0")
    check_sum(a, TIGHT if name in ("gpt2", "opt") else LOOSE)


def test_an_embedding_the_tables_do_not_rebuild_stays_whole(tmp_path):
    """ELECTRA with embedding_size < hidden_size projects the normalised rows up
    (``embeddings_project``): the tables do not rebuild layer 0's input, which stays one exact
    component, ``embed``."""
    pytest.importorskip("transformers")
    from archs import build
    from test_adapter import save_tokenizer

    build({"electra": ("ElectraConfig", "ElectraModel", dict(embedding_size=16))},
          "electra").save_pretrained(tmp_path)
    save_tokenizer(tmp_path, encoder=True)
    model = qkv.load(tmp_path, via="hf", dtype=torch.float64)
    a = score_attribution(model, HF_TEXT, layer=1, head=0, token="it", key="pizza")
    assert a.key_components[:2] == ("embed", "L0.H0")
    check_sum(a)


def test_gpt2s_embedding_parts_are_its_table_rows(hf64):
    """No norm before layer 0: the parts are the checkpoint's own rows, wte[id] and wpe[p]."""
    model = hf64("gpt2")
    ids = torch.tensor([model.tokenizer.encode(HF_TEXT).ids])
    every = torch.arange(ids.shape[1])
    st = stream(model, run(model, ids, torch.tensor([0])), 0, every)
    assert st.names == ("embed.token", "embed.position", "bias")
    tf = model.hf.transformer
    assert torch.equal(st.parts[0], tf.wte.weight[ids[0]].double())
    assert torch.equal(st.parts[1], tf.wpe.weight[every].double())
    assert not st.parts[2].any()


@pytest.mark.parametrize("via", ["hf", "native"])
def test_logit_attribution_names_the_position_rows(saved, via):
    model = qkv.load(saved("gpt2"), via=via, dtype=torch.float64)
    a = logit_attribution(model, HF_TEXT, token="ate")
    assert a.components[:3] == ("embed.token", "embed.position", "L0.H0")
    assert abs(float(a.contributions.sum()) - a.logit) <= a.bound <= TIGHT * max(1.0, abs(a.logit))


@pytest.mark.parametrize("name,reason", [
    ("gptj", "x + attn(x) + ff(x): a parallel residual"),
    ("phi", "x + attn(x) + ff(x): a parallel residual"),
    ("gpt_neox", "x + attn(x) + ff(x): a parallel residual")])
def test_a_layer_without_x_plus_attn_is_refused_by_name(hf64, name, reason):
    """What each architecture does instead of x + attn, read off its forward."""
    with pytest.raises(QkvError, match=rf"layer 0 \(HFLayer\) does not form x \+ attn .*"
                                       rf"{re.escape(reason)}"):
        score_attribution(hf64(name), HF_TEXT, layer=1, head=0, token="it", key="pizza")


@pytest.mark.parametrize("name,form", [("gemma2", "branch_norm"), ("olmo2", "branch_norm"),
                                       ("granite", "scaled")])
def test_a_norm_on_the_branch_or_a_scaled_residual_splits(hf64, name, form):
    """Gemma 2, OLMo 2: x + norm(attn(x)), each head's write carried through the frozen norm;
    Granite: x + 0.5·attn (the residual_multiplier of tests/hf/archs.py), a factor on each
    write. The terms sum to the forward's score (before Gemma 2's soft cap) within the bound."""
    model = hf64(name)
    assert model.parts.layers[0].residual.value == form
    a = score_attribution(model, HF_TEXT, layer=1, head=0, token="it", key="pizza")
    assert abs(float(a.terms.sum()) - a.score) <= a.bound <= 1e-5 * max(1.0, abs(a.score))
    assert "L0.H1" in a.key_components


def test_qkv_gpt_neox_parallel_residual_is_refused_by_name(saved):
    model = qkv.load(saved("gpt_neox"), via="native")
    with pytest.raises(QkvError, match=r"\(ParallelResidualLayer\) does not form x \+ attn .*"
                                       r"a parallel residual"):
        score_attribution(model, HF_TEXT, layer=1, head=0, token="it", key="pizza")
