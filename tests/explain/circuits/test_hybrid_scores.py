"""Score attribution on the layers of 2026's models (issue 39): an MLA head's score split through
its latents into content + RoPE parts, a sparse layer's selected keys (and an unselected one
refused with the indexer's miss margin), a gated softmax head, the residual forms of OLMo hybrid
(a norm on the branch), MiniMax (scaled) and Zamba2 (a shared block reading [x; e]) — each sum
of terms equal to the forward's own score within the result's derived ``bound``.

Tolerance: each result's ``bound`` is derived from the forward's measured rounding of q and k
(test_circuits.py's module doc). transformers runs RMSNorms and RoPE tables in float32 even in a
float64 model, so the bound there is float32-sized: it must stay below 1e-5 relative (LOOSE), so
a loose bound cannot hide a wrong split.
"""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")  # the qkv[hf] extra
import torch  # noqa: E402

import qkv  # noqa: E402
from hybrids import save_hybrid  # noqa: E402
from qkv.explain import ArgumentError, score_attribution  # noqa: E402
from qkv.explain.contributions.base import run  # noqa: E402

TEXT = "the cat sat on the mat . a red apple"
DIRECT = "deepseek_v3 without a query latent"
SCALED = "minimax with its residual factors"
#: MiniMax's factors (its config's defaults are 1): y = α₁·n₁(x) + β₁·attn, out = α₃·n₃(y) + β₃·f
FACTORS = dict(linear_attn_alpha_factor=0.5, linear_attn_beta_factor=1.5, full_attn_alpha_factor=2.0,
               full_attn_beta_factor=0.75, mlp_alpha_factor=1.25, mlp_beta_factor=0.5)
LOOSE = 1e-5


@pytest.fixture(scope="module")
def hybrid64(tmp_path_factory):
    """name → the tiny random checkpoint of tests/hf/hybrids.py through qkv.load, in float64
    (experts as a plain loop: the grouped kernel takes no float64)."""
    cache: dict = {}

    def get(name: str):
        if name not in cache:
            path = tmp_path_factory.mktemp(name)
            if name == DIRECT:
                save_direct_query(path)
            elif name == SCALED:
                save_scaled(path)
            else:
                save_hybrid(name, path)
            model = qkv.load(path)
            if getattr(model.hf.config, "_experts_implementation", None) not in (None, "eager"):
                model.hf.set_experts_implementation("eager")
            cache[name] = model.double()
        return cache[name]
    return get


def save_direct_query(path) -> None:
    """DeepSeek-V3 with no query latent (q_lora_rank None: one q_proj) and dense feed-forwards."""
    import transformers
    from hybrids import BASE, MLA, save_tokenizer

    config = transformers.DeepseekV3Config(**(BASE | MLA | dict(q_lora_rank=None, first_k_dense_replace=4)))
    torch.manual_seed(0)
    model = transformers.DeepseekV3ForCausalLM._from_config(config, attn_implementation="eager")
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model.save_pretrained(path)
    save_tokenizer(path)


def save_scaled(path) -> None:
    """tests/hf/hybrids.py's MiniMax with `FACTORS` in its config (the weights do not depend on
    them)."""
    import json

    save_hybrid("minimax", path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(config | FACTORS))


def check_sum(a) -> None:
    assert abs(float(a.terms.sum()) - a.score) <= a.bound, (float(a.terms.sum()), a.score, a.bound)
    assert a.bound <= LOOSE * max(1.0, abs(a.score))


def forward_parts(model, layer: int, head: int, i: int, j: int, dn: int) -> tuple[float, float]:
    """The forward's own content and RoPE parts of the score: its traced q and k (as the
    attention call got them: [q_nope | rotated q_rope]) split at dn."""
    ids = torch.tensor([model.tokenizer.encode(TEXT).ids])
    att = run(model, ids, torch.tensor([i])).traces[layer].self_attn.attention
    q, k, scale = att.query[0, head, 0].double(), att.key[0, head, j].double(), float(att.scale)
    return scale * float(q[:dn] @ k[:dn]), scale * float(q[dn:] @ k[dn:])


@pytest.mark.parametrize("name,pairs,upstream", [
    ("deepseek_v3", ((0, 1, 2), (1, 3, 0), (3, 0, 5)), "L0.H3"),  # layer 0 dense; later: earlier MLA heads
    ("deepseek_v2", ((0, 1, 2), (3, 0, 5)), "L0.H3"),              # RoPE as complex numbers, in float32
    (DIRECT, ((2, 2, 1),), "L1.H0"),                                # q = x·W_Q, no query latent
    ("kimi_linear", ((1, 2, 4), (3, 1, 5)), "L0.kda"),             # MLA without RoPE beside KDA layers
])
def test_an_mla_score_splits_into_content_and_rope_parts(hybrid64, name, pairs, upstream):
    """Each part against the forward's own (its traced q and k split at dn), within the score's
    bound: the same q and k roundings bound both."""
    model = hybrid64(name)
    for layer, head, key in pairs:
        a = score_attribution(model, TEXT, layer=layer, head=head, token=5, key=key)
        check_sum(a)
        assert upstream in a.key_components if layer else a.key_components[0] == "embed.token"
        split = a.latent
        assert torch.equal(split.content + split.position, a.terms)
        dn = model.layers[layer].self_attn.module.qk_nope_head_dim
        content, position = forward_parts(model, layer, head, 5, key, dn)
        assert abs(float(split.content.sum()) - content) <= a.bound
        assert abs(float(split.position.sum()) - position) <= a.bound
        assert a.to_dict()["latent"]["content"] == float(split.content.sum())


def test_an_mla_row_matches_one_key_at_a_time(hybrid64):
    model = hybrid64("deepseek_v3")
    row = score_attribution(model, TEXT, layer=2, head=2, token=7)
    assert row.keys.tolist() == list(range(8))
    assert float((row.terms.sum(1) - row.scores).abs().max()) <= row.bound <= LOOSE
    one = score_attribution(model, TEXT, layer=2, head=2, token=7, key=3)
    assert torch.allclose(row.terms[3], one.key_totals(), rtol=0, atol=2 * one.bound)


def test_a_sparse_layers_selected_key_splits_and_an_unselected_one_is_one_line(hybrid64):
    """The indexer keeps 4 keys per query (tests/hf/hybrids.py): of the 6 a query at 5 sees,
    2 are left out — their weight is 0, refused with how far their index score missed the cut."""
    model = hybrid64("glm_moe_dsa")
    att = run(model, torch.tensor([model.tokenizer.encode(TEXT).ids]), torch.tensor([5])).traces[0].self_attn.attention
    finite = torch.isfinite(att.additive()[0, 0, 0, :6])
    chosen, left = finite.nonzero().flatten().tolist(), (~finite).nonzero().flatten().tolist()
    assert len(chosen) == 4 and len(left) == 2
    for key in chosen:
        a = score_attribution(model, TEXT, layer=0, head=1, token=5, key=key)
        check_sum(a)
        assert a.indexed and a.latent is not None
    with pytest.raises(ArgumentError, match=r"^key .* was left out by layer 0's indexer for the query at 5: "
                                            r"its weight is 0 \(its index score missed the top-4 cut by [0-9.e-]+\)$"):
        score_attribution(model, TEXT, layer=0, head=1, token=5, key=left[0])


@pytest.mark.parametrize("name,gated,layers", [
    ("qwen3_5", True, ((1, "L0.gated_deltanet"), (3, "L1.H3"))),
    ("lfm2", False, ((1, "L0.short_conv"), (3, "L1.H3"))),
    ("nemotron_h", False, ((1, "L0.mamba2"),)),
])
def test_a_hybrids_softmax_heads_split_through_the_layers_before(hybrid64, name, gated, layers):
    """Layer 1 reads layer 0's Gated DeltaNet (short convolution, Mamba-2) branch as one
    component; layer 3 also layer 1's heads. Qwen3.5's gate multiplies each head's output after
    the weights: the score is q·k as any head's, the result says the head is gated, and layer 1's
    heads are read through their gates (their writes must rebuild its x + attn: the stream checks
    it). LFM2 normalises q and k per head (q_layernorm, k_layernorm), frozen like Qwen3's.
    Nemotron-H's Mamba-2 layer is x + mix and nothing after it: its feed-forward part is 0."""
    model = hybrid64(name)
    for layer, upstream in layers:
        a = score_attribution(model, TEXT, layer=layer, head=1, token=5, key=2)
        check_sum(a)
        assert a.gated is gated and a.latent is None and upstream in a.key_components
        assert a.to_dict()["gated"] is gated
    if name == "nemotron_h":
        assert not a.terms[:, a.key_components.index("L0.ffn")].any()


@pytest.mark.parametrize("name,layers", [
    ("olmo_hybrid", ((1, "L0.gated_deltanet"), (3, "L1.H3"))),  # x + norm(attn(x)): a norm on the branch
    (SCALED, ((1, "L0.lightning"), (3, "L1.H3"))),               # α₁·n₁(x) + β₁·attn, α₃·n₃(y) + β₃·f
])
def test_a_branch_norm_or_scaled_hybrid_splits_through_its_branches(hybrid64, name, layers):
    """OLMo hybrid's attention layers normalise the attention's (and the feed-forward's) output
    before adding it: each head's write is carried through that norm frozen at the branch it
    read. MiniMax takes its residual after the norm and scales both: each part goes through n₁
    (n₃) frozen, times its factor (the config's own, read by the adapter)."""
    model = hybrid64(name)
    if name == SCALED:
        scales = model.parts.layers[1].scales
        assert (scales.mixer_residual, scales.mixer, scales.feed_forward_residual, scales.feed_forward) \
            == (2.0, 0.75, 1.25, 0.5) and scales.normed
        assert model.parts.layers[0].scales.mixer == 1.5
    for layer, upstream in layers:
        a = score_attribution(model, TEXT, layer=layer, head=1, token=5, key=2)
        check_sum(a)
        assert upstream in a.key_components


def test_zamba2s_shared_block_reads_the_stream_and_the_embeddings(hybrid64):
    """Zamba2's hybrid layer runs its shared attention over n₁([x; e]) (2E: the stream and what
    entered layer 0) and adds its output only through a feed-forward, a linear map and Mamba-2's
    input: its score splits over [x's part; e's part] per component (the embedding's tables
    have both), and upstream the whole layer writes as one component."""
    model = hybrid64("zamba2")
    assert model.parts.layers[1].reads_embeddings and not model.parts.layers[0].reads_embeddings
    for layer, upstream in ((1, "L0.mamba2"), (3, "L1.softmax+mamba2")):
        a = score_attribution(model, TEXT, layer=layer, head=1, token=5, key=2)
        check_sum(a)
        assert upstream in a.key_components
    assert not any(name.startswith("L1.H") or name == "L1.ffn" for name in a.key_components)
    row = score_attribution(model, TEXT, layer=3, head=1, token=5)  # every key at once
    assert float((row.terms.sum(1) - row.scores).abs().max()) <= row.bound <= LOOSE
