"""Full explanations on transformers models of any architecture (qkv.hf.projections): explain_head
recomputes x·W_Q + b → (q/k norm) → the model's own position step → q from the module's input,
with the projections read from one table and each entry checked against the forward; ``norm``
and ALTI read the heads' W_O and the residual x + attn where the layer forms it.

Tolerances are derived (tests/tolerance.py): a float32 model's recomputation differs from its
forward by the forward's own float32 roundings, and the same code on the float64 model makes
the same roundings 2⁻²⁹ times smaller (tests/hf_decoders.py: ``assert_explain_rounding``).
"""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")  # the qkv[hf] extra
import torch  # noqa: E402

import qkv  # noqa: E402
import qkv.explain as E  # noqa: E402
from archs import COMMON, DECODERS, ENCODERS, GQA, build  # noqa: E402
from qkv.explain.contributions import get_method  # noqa: E402
from qkv.explain.contributions.base import out_bias, run  # noqa: E402
from qkv.explain.contributions.norm import terms  # noqa: E402
from test_adapter import TEXT, save_tokenizer  # noqa: E402
from tolerance import assert_within, ulp, unit_roundoff_ratio  # noqa: E402

# name: (the table's layout, the position step's style) — what each architecture must be read as
EXPECTED = {
    "llama": ("q_proj, k_proj, v_proj", "half"),
    "qwen2": ("q_proj, k_proj, v_proj", "half"),  # q/k/v biases
    "qwen3": ("q_proj, k_proj, v_proj", "half"),  # per-head q/k norms, head_dim ≠ E/h
    "olmo2": ("q_proj, k_proj, v_proj", "half"),  # q/k norms over the whole projection
    "gpt2": ("c_attn", None),  # Conv1D [q | k | v] stored (in, out); learned positions are in x
    "gpt_neox": ("query_key_value", "half"),  # per head [q_h | k_h | v_h], partial rotary
    "phi3": ("qkv_proj", "half"),  # fused [q | k | v]
    "gemma2": ("q_proj, k_proj, v_proj", "half"),  # softcap, scale ≠ 1/√d
    "cohere": ("q_proj, k_proj, v_proj", "pairs"),  # RoPE on interleaved pairs
    "opt": ("q_proj, k_proj, v_proj", None),  # q scaled in the module (kernel told 1): W_Q·c
}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    dirs = {}

    def get(name):
        if name not in dirs:
            path = tmp_path_factory.mktemp(name)
            build(DECODERS, name).save_pretrained(path)
            save_tokenizer(path, encoder=False)
            dirs[name] = path
        return dirs[name]
    return get


def steps(path, dtype):
    model = qkv.load(path, via="hf", dtype=dtype)
    return model, E.explain_head(model, TEXT, token="it", layer=1, head=1)


@pytest.mark.parametrize("name", list(EXPECTED))
def test_explain_head_recomputes_q_from_x(saved, name):
    model, st = steps(saved(name), torch.float32)
    _, fine = steps(saved(name), torch.float64)
    layout, style = EXPECTED[name]
    attn = model.layers[1].self_attn
    assert (attn.parts.layout, attn.parts.rotation) == (layout, style)
    assert (attn.parts.q_scale != 1.0) == (name == "opt")
    assert st.projection == "" and model.capabilities.head_weights
    assert ("RoPE" in st.qk_transform) == (style is not None)
    assert ("normalised" in st.qk_transform) == (name in ("qwen3", "olmo2"))
    assert_float32_rounding(name, st, fine)


def assert_float32_rounding(name, st, fine) -> None:
    """Each stage of the float32 model's recomputation is off its forward by that forward's
    roundings: the float64 model's differences scaled by 2²⁹, plus 2 ulp."""
    ratio = unit_roundoff_ratio(torch.float32, torch.float64)  # 2²⁹
    for stage, diff in st.diffs.items():  # each stage against the float32 forward's own tensor
        tol = 4 * fine.diffs[stage] * ratio + 2 * ulp(getattr(st, stage), torch.float32)
        assert diff <= tol, f"{name} {stage}: float32 forward vs float64 recomputation {diff:.3g} > {tol:.3g}"


def test_layernorm_qk_norms_by_their_other_names(tmp_path):
    """Persimmon normalises each head's q and k by a torch LayerNorm (`q_layernorm`,
    `k_layernorm`) before a partial rotation: read by NORMS' second pair of names, and run on the
    float64 recomputation of a float32 model (its float32 weights taken to float64)."""
    import transformers

    torch.manual_seed(0)
    config = transformers.PersimmonConfig(**(COMMON | dict(qk_layernorm=True)))
    transformers.PersimmonForCausalLM(config).eval().save_pretrained(tmp_path)
    save_tokenizer(tmp_path, encoder=False)
    model, st = steps(tmp_path, torch.float32)
    _, fine = steps(tmp_path, torch.float64)
    attn = model.layers[1].self_attn
    assert (attn.parts.layout, attn.parts.rotation) == ("query_key_value", "half") and st.projection == ""
    assert isinstance(attn.q_norm, torch.nn.LayerNorm)
    assert "normalised per head (LayerNorm), then rotated by RoPE" in st.qk_transform  # not "RMSNorm"
    assert_float32_rounding("persimmon", st, fine)


@pytest.mark.parametrize("name", ["llama", "olmo2"])
def test_bfloat16_models_are_read_too(saved, name):
    """In bfloat16 the check against the kernel allows the model's own roundings (OLMo 2 rotates
    in float32 angles, then rounds): the projections are read, and the float64 q, k_j from the
    model's own x and weights differ from the kernel's by its roundings — a matmul rounded once
    (float32 accumulation), a norm, a rotation: at most 8 bfloat16 ulp of the largest entry."""
    model, st = steps(saved(name), torch.bfloat16)
    assert st.projection == "" and model.layers[1].self_attn.parts.layout == EXPECTED[name][0]
    for stage in ("query", "keys", "values"):
        assert st.diffs[stage] <= 8 * ulp(getattr(st, stage), torch.bfloat16), stage


def test_gpt2_conv1d_is_read_transposed(saved):
    """q = x · c_attn.weight[:, head] + b, written out from the Conv1D's own (in, out) weight."""
    model, st = steps(saved("gpt2"), torch.float64)
    conv = model.layers[1].self_attn.module.c_attn
    d = st.head_dim
    cols = slice(d, 2 * d)  # head 1 of the [q | k | v] columns
    want = st.x @ conv.weight[:, cols].double() + conv.bias[cols].double()
    assert float((st.query - want).abs().max()) <= 64 * torch.finfo(torch.float64).eps * float(want.abs().max())


def test_neox_interleaved_heads_and_partial_rotary(saved):
    """GPT-NeoX's query_key_value holds [q_h | k_h | v_h] per head; RoPE turns only the first
    rotary_pct of each head: the unrotated features are x·W_Q + b as they are."""
    model, st = steps(saved("gpt_neox"), torch.float64)
    qkv_ = model.layers[1].self_attn.module.query_key_value
    d = st.head_dim
    rows = slice(1 * 3 * d, 1 * 3 * d + d)  # head 1's q rows
    plain = st.x @ qkv_.weight[rows].double().T + qkv_.bias[rows].double()
    r = int(d * model.config.rope_parameters["partial_rotary_factor"])
    assert 0 < r < d
    assert float((st.query[r:] - plain[r:]).abs().max()) <= 64 * torch.finfo(torch.float64).eps * float(plain.abs().max())
    assert float((st.query[:r] - plain[:r]).abs().max()) > 1e-3  # the rotated ones moved


@pytest.mark.parametrize("name", ["llama", "gpt2", "phi3", "qwen2", "opt"])
def test_norm_terms_rebuild_the_attention_output_and_alti_runs(saved, name):
    """Σ_h Σ_j A_ij f^h(h_j) + b_O is the attention module's own output (x + attn − x, read from the
    recorded residual): W_O and the values are the model's; ALTI's own check (its terms sum to the
    forward's x + attn) passes, and its rows are shares."""
    model = qkv.load(saved(name), via="hf")
    ids = torch.tensor([model.tokenizer.encode(TEXT).ids])
    fwd = run(model, ids, slice(None))
    for layer, (tr, hidden) in enumerate(zip(fwd.traces, fwd.hidden_states)):
        attn = model.layers[layer].self_attn
        rebuilt = terms(attn, tr.self_attn).sum((0, 2)) + out_bias(attn)  # (t, E)
        got = (tr.residual - hidden)[0]  # (t, E): the attention's output as the layer added it
        top = float(got.abs().max())
        # float32 sums of h·s terms of size ≤ top, and the subtraction: far inside 2¹⁰ eps
        assert float((rebuilt - got).abs().max()) <= 1024 * torch.finfo(torch.float32).eps * max(top, 1.0), layer
    rows = torch.tensor([ids.shape[1] - 1])
    scores = get_method("alti").run(model, ids, rows).scores  # (L, r, t)
    assert torch.allclose(scores.sum(-1), torch.ones_like(scores.sum(-1)), atol=1e-5)


def test_gpt2_native_and_adapter_agree_on_alti_and_norm(saved):
    """GPT-2 has a native family: its float64 run is the truth for the adapter's."""
    path = saved("gpt2")
    truth, native, ours = (qkv.load(path, dtype=torch.float64), qkv.load(path), qkv.load(path, via="hf"))
    ids = torch.tensor([native.tokenizer.encode(TEXT).ids])
    rows = torch.tensor([ids.shape[1] - 1])
    for method in ("alti", "norm"):
        got = [get_method(method).run(m, ids, rows).scores for m in (truth, native, ours)]
        assert_within(got[2], got[0], got[1], what=method)
    st = [E.explain_head(m, TEXT, token="it", layer=1, head=2) for m in (truth, native, ours)]
    for field in ("x", "query", "keys", "values", "weights", "output"):
        assert_within(getattr(st[2], field), getattr(st[0], field), getattr(st[1], field), what=field)


def test_bert_native_and_adapter_agree_post_norm(tmp_path):
    """A post-norm encoder: the adapter finds the LayerNorm that reads x + attn (norm1, not
    norm_first) and ALTI decomposes its output; BERT's native family in float64 is the truth."""
    build(ENCODERS, "bert").save_pretrained(tmp_path)
    save_tokenizer(tmp_path, encoder=True)
    truth, native, ours = (qkv.load(tmp_path, dtype=torch.float64), qkv.load(tmp_path),
                           qkv.load(tmp_path, via="hf"))
    layer = ours.layers[0]
    assert layer.sequential_residual and not layer.norm_first and isinstance(layer.norm1, torch.nn.LayerNorm)
    ids = torch.tensor([native.tokenizer.encode(TEXT).ids])
    rows = torch.tensor([4])
    for method in ("alti", "norm"):
        got = [get_method(method).run(m, ids, rows).scores for m in (truth, native, ours)]
        assert_within(got[2], got[0], got[1], what=method)


def test_modernbert_fused_wqkv_rope_encoder(tmp_path):
    """An encoder the other tests never build: ModernBERT's fused Wqkv [q | k | v], RoPE, pre-norm
    (its first layer has no attention norm: the attention reads x itself there)."""
    import transformers

    config = transformers.ModernBertConfig(vocab_size=99, hidden_size=32, intermediate_size=37,
                                           num_hidden_layers=2, num_attention_heads=4,
                                           max_position_embeddings=64, pad_token_id=3,
                                           global_attn_every_n_layers=1)
    torch.manual_seed(0)
    transformers.ModernBertModel(config).save_pretrained(tmp_path)
    save_tokenizer(tmp_path, encoder=True)
    model, fine = qkv.load(tmp_path), qkv.load(tmp_path, dtype=torch.float64)
    assert model.capabilities.encoder and model.capabilities.head_weights
    attn = model.layers[1].self_attn
    assert (attn.parts.layout, attn.parts.rotation) == ("Wqkv", "half")
    # layer 0's norm before the attention is the identity: its x + attn still goes on unnormed
    assert [(layer.norm_first, layer.sequential_residual) for layer in model.layers] == [(True, True)] * 2
    st = E.explain_head(model, TEXT, token="it", layer=1, head=1)
    st64 = E.explain_head(fine, TEXT, token="it", layer=1, head=1)
    ratio = unit_roundoff_ratio(torch.float32, torch.float64)
    assert st.projection == "" and "RoPE" in st.qk_transform
    for stage, diff in st.diffs.items():
        assert diff <= 4 * st64.diffs[stage] * ratio + 2 * ulp(getattr(st, stage), torch.float32), stage
    ids = torch.tensor([model.tokenizer.encode(TEXT).ids])
    scores = get_method("alti").run(model, ids, torch.tensor([3])).scores  # (L, r, t)
    assert torch.allclose(scores.sum(-1), torch.ones_like(scores.sum(-1)), atol=1e-5)


def test_projections_that_cannot_be_read_are_named(saved):
    """GPT-J computes its angles inside the module (none is handed to it): q is not x·W_Q + b with
    a step qkv can see, so explain_head starts from the kernel's q and says why, by name."""
    model, st = steps(saved("gptj"), torch.float32)
    assert "GPTJAttention" in st.projection and "x·W_Q, x·W_K and x·W_V are not shown" in st.projection
    assert not model.capabilities.head_weights
    assert st.max_abs_diff < 1e-5  # from the kernel's q on, the arithmetic is the forward's


def test_nothing_stays_hooked(saved):
    model = qkv.load(saved("qwen3"), via="hf")
    E.explain_head(model, TEXT, token="it", layer=0, head=0)
    for m in model.hf.modules():
        assert not m._forward_hooks and not m._forward_pre_hooks, type(m).__name__


# -- issue 38 item 2: the position step by the architecture's own rotary function -----------------
@pytest.mark.parametrize("model_type", ["glm", "helium", "ernie4_5", "glm4"])
def test_unseen_rope_gqa_decoders_get_the_full_step_by_step(tmp_path, model_type):
    """Decoders tests/hf/archs.py never builds (interleaved and partial RoPE, GQA): x·W_Q →
    the architecture's own apply_rotary_pos_emb → q, every stage equal to the forward's."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from hybrids import BASE, save_tokenizer
    import qkv
    import qkv.explain

    config = transformers.CONFIG_MAPPING[model_type](**(BASE | dict(num_hidden_layers=3, head_dim=8,
                                                                    hidden_size=48, num_attention_heads=6)))
    torch.manual_seed(1)
    cls = getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])
    cls._from_config(config, attn_implementation="eager").save_pretrained(tmp_path)
    save_tokenizer(tmp_path)
    model = qkv.load(tmp_path)
    text = "a red dog sat . the apple sat on a mat"
    steps = qkv.explain.explain_head(model, text, layer=2, head=5, token="mat")
    assert steps.projection == "" and "x·W_Q" not in steps.projection
    for stage, diff in steps.diffs.items():
        assert diff <= 64 * torch.finfo(torch.float32).eps * max(1.0, float(steps.model_output.abs().max())), stage


def _hunyuan(path) -> None:
    """A random HunYuan checkpoint saved at `path` (every weight perturbed: norms' not ones)."""
    import transformers

    torch.manual_seed(0)
    config = transformers.HunYuanDenseV1Config(**(COMMON | GQA | dict(head_dim=8)))
    model = transformers.HunYuanDenseV1ForCausalLM._from_config(config, attn_implementation="eager")
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)  # norms' weights too: not ones
    model.save_pretrained(path)
    save_tokenizer(path, encoder=False)


def test_norms_after_the_rotation_get_the_full_step_by_step(tmp_path):
    """HunYuan rotates q and k, then normalises them (query_layernorm, key_layernorm): the order
    is read off the forward (Qwen3's, norm then RoPE, does not rebuild it) and the step-by-step
    applies the steps in it — every stage the float32 forward's to its own rounding."""
    _hunyuan(tmp_path)
    model, st = steps(tmp_path, torch.float32)
    _, fine = steps(tmp_path, torch.float64)
    attn = model.layers[1].self_attn
    assert st.projection == "" and attn.norm_after_rotation and attn.parts.rotation == "half"
    assert st.qk_transform.startswith("rotated by RoPE") and st.qk_transform.endswith(
        "then normalised per head (RMSNorm)")
    assert_float32_rounding("hunyuan_v1_dense", st, fine)


def test_norms_after_the_rotation_split_a_score(tmp_path):
    """`qkv why` on HunYuan: each component is projected, rotated, then carried through the
    q/k norm frozen at the forward's scale — the terms sum to the forward's own score within the
    result's derived bound, itself below 1e-5 relative (as test_hybrid_scores' LOOSE: a wrong
    order — the norm frozen before the rotation — is off by 0.13, and refused)."""
    _hunyuan(tmp_path)
    model = qkv.load(tmp_path, via="hf", dtype=torch.float64)
    a = E.score_attribution(model, TEXT, layer=1, head=1, token="it", key=0)
    assert abs(float(a.terms.sum()) - a.score) <= a.bound <= 1e-5 * max(1.0, abs(a.score))
    row = E.score_attribution(model, TEXT, layer=1, head=1, token="it")
    assert float((row.terms.sum(1) - row.scores).abs().max()) <= row.bound
