"""Every layer of a 2026 hybrid has a map (issue 39 items 2-3): ``attention_map`` on every layer
of every architecture of tests/hf/hybrids.py is causal; on a linear or state-space layer it is
the exact effective attention M (o = M·v), equal to the layer's own kernel run on one-hot values
in float64; the rankings, ``qkv why`` and the viewer take hybrids.

Tolerances (tests/tolerance.py): a short convolution's and lightning's one-hot runs compute in
float64 from the same recorded arguments as M, one answer two ways: ``assert_agree`` against the
same run in float32. transformers' delta-rule, Mamba-2 and Mamba-1 (Jamba) kernels compute in float32 whatever
they are given, so their one-hot run is compared with M by ``assert_within`` against the readers'
closed form in float32 from the same call, factor 4 (as tests/explain/mixers/test_delta_rule.py
derives: chunk-by-chunk solves and a carried state, the same roundings in another order).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("transformers")  # the qkv[hf] extra
import torch  # noqa: E402

import qkv  # noqa: E402
import qkv.explain as explain  # noqa: E402
from hybrids import HYBRIDS, save_hybrid  # noqa: E402
from mixer_layers import one_hot_values  # noqa: E402
from qkv.explain.mixer_maps import mixer_map  # noqa: E402
from qkv.explain.mixers import delta_rule, mamba1, mamba2, short_conv  # noqa: E402
from qkv.explain.mixers.capture import kernel_call  # noqa: E402
from qkv.models.protocol import MixerKind  # noqa: E402
from tolerance import assert_agree, assert_within  # noqa: E402

TEXT = "the cat sat on the mat . a red dog"  # 10 tokens: past the tiny configs' chunks of 4


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """name → (its checkpoint directory, the model qkv.load gives), each built once."""
    cache: dict = {}

    def get(name: str):
        if name not in cache:
            path = tmp_path_factory.mktemp(name)
            save_hybrid(name, path)
            cache[name] = (path, qkv.load(path))
        return cache[name]
    return get


def _mixer_input(model, layer: int, part) -> torch.Tensor:
    """(1, t, E) what the mixer read in the model's forward on TEXT (a hook for that call only)."""
    seen = []
    handle = part.module.register_forward_pre_hook(
        lambda m, args, kwargs: seen.append(args[0] if args else kwargs["hidden_states"]), with_kwargs=True)
    try:
        with torch.no_grad():
            model(torch.tensor([model.tokenizer.encode(TEXT).ids]))
    finally:
        handle.remove()
    return seen[0].detach()


@pytest.mark.parametrize("name", sorted(HYBRIDS))
def test_every_layer_has_a_causal_map(saved, name):
    _, model = saved(name)
    t = len(model.tokenizer.encode(TEXT).ids)
    for L, layer in enumerate(model.layers):
        kinds = [m.kind for m in layer.parts.mixers]
        if not kinds:  # Nemotron-H's MLP layers: one line naming what it is
            with pytest.raises(explain.ArgumentError, match=r"^layer \d of \S+ is a feed-forward-only layer[^\n]*$"):
                explain.attention_map(model, TEXT, layer=L, head=0)
            continue
        m = explain.attention_map(model, TEXT, layer=L, head=0)
        assert m.weights.shape == (t, t)
        assert torch.equal(m.weights.triu(1), torch.zeros_like(m.weights)), f"{name} layer {L}: causal"
        if any(k.softmax for k in kinds) and not m.to_dict().get("effective"):  # differential: signed
            assert torch.allclose(m.weights.sum(-1), torch.ones(t, dtype=m.weights.dtype), atol=1e-5)
        else:
            d = m.to_dict()
            assert d["effective"] and d["mixer"] == kinds[0].value and len(d["row_sums"]) == t
            assert m.error < 1e-4 * max(1.0, float(m.weights.abs().max()))  # checked in construction too


def test_a_differential_layers_map_is_its_two_softmax_maps_difference(saved):
    """DiffLlama's head pair p: M = A_p − λ·A_{p+H/2}, and M·[v_a | v_b] is the layer's own
    combination before its group norm (read here off a plain forward, v from its v_proj)."""
    _, model = saved("diffllama")
    layer = 1
    part = model.parts.layers[layer].mixers[0]
    x = _mixer_input(model, layer, part)  # (1, t, E)
    seen = []
    handle = part.module.groupnorm.register_forward_pre_hook(lambda m, args: seen.append(args[0].detach()))
    try:
        with torch.no_grad():
            model(torch.tensor([model.tokenizer.encode(TEXT).ids]))
    finally:
        handle.remove()
    o = seen[0][0]  # (t, p, 2d) float32: A_p·v_a − λ·A_{p+H/2}·v_b
    with torch.no_grad():
        v32 = part.module.v_proj(x)[0]  # (t, 2d): 2 kv heads, so every pair reads kv head 0 | kv head 1
    t, pairs = o.shape[0], o.shape[1]
    for p in range(pairs):
        m = explain.attention_map(model, TEXT, layer=layer, head=p)
        d = m.to_dict()
        assert d["effective"] and d["mixer"] == "differential" and d["heads"] == pairs == 2
        assert d["lambda"] == m.lam and 0 < m.lam < 1
        assert torch.equal(m.weights.triu(1), torch.zeros_like(m.weights))
        # each softmax row sums to 1, so a row of the difference sums to 1 − λ
        assert torch.allclose(m.row_sums, torch.full((t,), 1 - m.lam, dtype=torch.float64), atol=1e-6)
        assert_within(o[:, p], m.weights @ v32.double(), m.weights.float() @ v32, factor=4.0,
                      what=f"differential pair {p}: the layer's combination vs M·v")
    with pytest.raises(explain.ArgumentError, match=r"^head 2 is out of range: [^\n]*$"):
        explain.attention_map(model, TEXT, layer=layer, head=2)


def _one_hot_run(module, kind: MixerKind, x: torch.Tensor, heads: int, dtype: torch.dtype):
    """(t, heads, t): the layer's own kernel (its one-token-at-a-time reference where it has one)
    run in ``dtype`` on its recorded arguments with one-hot values: row i of head h is M_h[i];
    and, for a kernel that computes in float32 whatever it is given, the reader's closed form in
    float32 from the same call (the plain computation ``assert_within`` measures), else None."""
    t = x.shape[1]
    modeling = sys.modules[type(module).__module__]
    cast = lambda v: v.detach().to(dtype) if torch.is_tensor(v) and v.is_floating_point() else v  # noqa: E731
    if kind in (MixerKind.GATED_DELTANET, MixerKind.KDA):
        chunked, recurrent = {MixerKind.GATED_DELTANET: ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule"),
                              MixerKind.KDA: ("chunk_kimi_delta_attention", "recurrent_kimi_delta_attention")}[kind]
        a = {k: cast(v) for k, v in kernel_call(module, chunked, x).arguments.items()}
        call = kernel_call(module, chunked, x)
        out, _ = getattr(modeling, recurrent)(a["query"], a["key"], one_hot_values(t, heads).to(dtype), g=a["g"],
                                              beta=a["beta"], initial_state=None, output_final_state=False,
                                              use_qk_l2norm_in_kernel=a["use_qk_l2norm_in_kernel"])
        return out[0], delta_rule.from_call(kind.value, call, torch.float32)
    if kind is MixerKind.MAMBA1:  # Jamba: the scan, one text per one-hot column j
        call = kernel_call(module, mamba1.KERNEL, x)
        a = {k: cast(v) for k, v in call.arguments.items()}
        batch = lambda v: v.expand(t, *v.shape[1:]).contiguous()  # noqa: E731
        eye = torch.eye(t, dtype=dtype)[:, None, :].expand(t, heads, t).contiguous()  # (t texts, d, t)
        out = modeling.mamba_selective_scan(eye, batch(a["dt"]), a["A"], batch(a["B"]), batch(a["C"]), D=a["D"],
                                            delta_bias=a["delta_bias"], delta_softplus=a["delta_softplus"])
        ungated = modeling.mamba_selective_scan(**{**call.arguments, "z": None})
        return out.permute(2, 1, 0), mamba1.from_call(call, torch.float32, ungated=ungated)  # (t, d, t)
    if kind is MixerKind.MAMBA2:
        call = kernel_call(module, mamba2.KERNEL, x)
        a = {k: cast(v) for k, v in call.arguments.items()}
        a |= dict(hidden_states=one_hot_values(t, heads).to(dtype), chunk_size=3, return_final_states=False)
        out = modeling.mamba2_chunk_scan(**a)
        return (out[0] if isinstance(out, tuple) else out)[0], mamba2.from_call(call, torch.float32)
    if kind is MixerKind.SHORT_CONV:  # the layer's causal_conv1d_fn on B ⊙ e_j, channel by channel, times C
        conv = short_conv.read(module, x)
        cols = []
        for c in range(heads):
            basis = (one_hot_values(t, 1)[0, :, 0, :] * conv.B[:, c: c + 1]).to(dtype)  # (t tokens, t columns)
            out = modeling.causal_conv1d_fn(basis.T[None].contiguous(),
                                            conv.weight[c: c + 1].to(dtype).expand(t, -1).contiguous())
            cols.append(conv.C[:, c: c + 1].to(dtype) * out[0].T)  # (t, t)
        return torch.stack(cols, dim=1), None
    # lightning computes inline (no kernel function): its recurrence S_i = e^(−s)·S_(i−1) + k_i v_iᵀ,
    # o_i = q_i·S_i, on the layer's own q, k (qkv_proj, act_fn) and one-hot v
    h, d = module.num_attention_heads, module.head_dim
    with torch.no_grad():
        q, k, _ = module.act_fn(module.qkv_proj(x))[0].to(dtype).reshape(t, h, 3 * d).split(d, dim=-1)
    decay = torch.exp(-module.slope_rate.detach().to(dtype).reshape(h))
    S, rows = torch.zeros(h, d, t, dtype=dtype), []
    for i in range(t):
        S = decay[:, None, None] * S + k[i][:, :, None] * torch.eye(t, dtype=dtype)[i]  # (h, d, t)
        rows.append(torch.einsum("hd,hdt->ht", q[i], S))
    return torch.stack(rows), None


@pytest.mark.parametrize("name", sorted(HYBRIDS))
def test_an_effective_map_is_the_layers_one_hot_run(saved, name):
    _, model = saved(name)
    for L, layer in enumerate(model.layers):
        for part in layer.parts.mixers:
            if part.kind.softmax:
                continue
            x = _mixer_input(model, L, part)
            heads = mixer_map(model, TEXT, layer=L, head=0).heads
            (run, twin), (low, _) = (_one_hot_run(part.module, part.kind, x, heads, dt)
                                     for dt in (torch.float64, torch.float32))
            for h in {0, heads - 1}:
                M = mixer_map(model, TEXT, layer=L, head=h).weights  # (t, t) float64
                what = f"{name} layer {L} {part.kind.value} head {h}: one-hot run vs M"
                if twin is None:
                    assert_agree(M, run[:, h], low[:, h], what=what)
                else:  # the kernel's float32 numbers (.float() is exact on them) within float32's error of M
                    assert_within(run[:, h].float(), M, twin.matrix(h), factor=4.0, what=what)


def test_the_rankings_leave_the_linear_layers_out_by_name(saved):
    _, model = saved("nemotron_h")
    overview = explain.explain(model, TEXT)
    assert overview.unscored == (0, 2, 3) and {r.layer for r in overview.rows} == {1}
    note = str(overview.notes[-1])
    assert "0 (mamba2)" in note and "2 (feed-forward only)" in note
    assert overview.to_dict()["unscored"]["layers"] == [0, 2, 3]
    ranking = explain.heads(model, TEXT, target="cat")
    assert {h.layer for h in ranking.heads} == {1} and "not ranked" in str(ranking.notes[-1])


def test_why_splits_a_hybrids_softmax_score_and_refuses_a_linear_layer_by_kind(saved):
    _, model = saved("bamba")  # layers: mamba2, softmax, mamba2, softmax
    r = explain.score_attribution(model, TEXT, layer=3, head=0, key="cat")
    assert "L0.mamba2" in r.query_components and "L2.mamba2" in r.key_components
    assert abs(float(r.terms.sum()) - r.score) <= r.bound
    with pytest.raises(explain.ArgumentError, match=r"^layer 2 of \S+ mixes its tokens by mamba2 [^\n]*$"):
        explain.score_attribution(model, TEXT, layer=2, head=0, key="cat")


@pytest.mark.parametrize("name, kind", [("diffllama", "differential")])  # MLA and sparse: tests/explain/circuits/test_hybrid_scores.py
def test_why_names_a_layer_whose_scores_it_does_not_split(saved, name, kind):
    _, model = saved(name)
    with pytest.raises(explain.ArgumentError, match=rf"^layer 1 of \S+ mixes its tokens by {kind}: [^\n]*$"):
        explain.score_attribution(model, TEXT, layer=1, head=0, key="cat")


def test_the_cli_explains_a_hybrid(saved):
    path, _ = saved("nemotron_h")
    run = subprocess.run([sys.executable, "-m", "qkv", "explain", TEXT, "--model", str(path)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "not ranked: layers 0 (mamba2), 2 (feed-forward only), 3 (mamba2)" in run.stderr + run.stdout
    assert "Traceback" not in run.stderr


def test_the_viewer_draws_a_linear_layer_as_its_effective_map(saved):
    from starlette.testclient import TestClient

    from qkv.view.api import Api, Models
    from qkv.view.server import create_app

    path, model = saved("qwen3_5")
    with TestClient(create_app(Api(Models([str(path)])), hosts=None)) as c:
        ask = lambda endpoint, **body: c.post(f"/api/{endpoint}", json={"model": str(path), "text": TEXT, **body})  # noqa: E731
        assert ask("overview").json()["unscored"]["layers"] == [0, 2]
        assert ask("maps").status_code == 200
        d = ask("map", layer=0, head=1).json()
        want = explain.attention_map(model, TEXT, layer=0, head=1)
        assert d["effective"] and d["mixer"] == "gated_deltanet"
        assert d["row_sums"] == pytest.approx(want.row_sums.tolist(), abs=1e-12)
        assert ask("map", layer=1, head=0).json().get("effective") is None  # softmax rows as ever
        r = ask("received", layer=0, head=0)
        assert r.status_code == 422 and r.json()["error"]["field"] == "layer"


@pytest.mark.parametrize("name, args, field", [
    ("nemotron_h", dict(layer=0, head=99), "head"),
    ("nemotron_h", dict(layer=0, head=-1), "head"),
    ("nemotron_h", dict(layer=0, head=None), "head"),
    ("nemotron_h", dict(layer=True, head=0), "layer"),
    ("nemotron_h", dict(layer=2, head=0), "layer"),  # a feed-forward-only layer
    ("nemotron_h", dict(layer=1, head=0), "layer"),  # softmax rows: attention_map's
    ("falcon_h1", dict(layer=0, head=0, mixer=0), "mixer"),  # its attention, beside Mamba-2
    ("falcon_h1", dict(layer=0, head=0, mixer=2), "mixer"),
])
def test_bad_arguments_are_one_line_naming_the_argument(saved, name, args, field):
    _, model = saved(name)
    with pytest.raises(explain.ArgumentError, match=r"^[^\n]+$") as e:
        mixer_map(model, TEXT, **args)
    assert e.value.argument == field


def test_a_layer_beside_attention_gives_its_mamba_map_when_asked(saved):
    _, model = saved("falcon_h1")
    m = mixer_map(model, TEXT, layer=0, head=3, mixer=1)
    assert m.mixer == "mamba2" and m.mixer_index == 1
    assert torch.equal(m.weights.triu(1), torch.zeros_like(m.weights))


def test_a_pattern_probe_on_a_hybrid_scores_every_layer_it_can(saved):
    """The probes read a Mamba-2 layer through its effective map (tests/explain/probes/
    test_hybrid_probes.py checks the numbers) and name the feed-forward-only layer they skip."""
    _, model = saved("nemotron_h")
    r = explain.probe(model, "induction")
    assert {layer for layer, _, _ in r.ranked()} == {0, 1, 3} and [layer for layer, _ in r.unscored] == [2]


def test_the_exported_page_of_a_hybrid_opens_on_a_softmax_layer(saved):
    from qkv.view.api import Api, Models
    from qkv.view.export import collect

    path, _ = saved("qwen3_5")  # layers: gated_deltanet, softmax, gated_deltanet, softmax
    answers, state = collect(Api(Models([str(path)])), str(path), TEXT, probe=False)
    assert state["layer"] == 1
    assert not {fields.get("layer") for endpoint, fields, _ in answers if endpoint == "steps"} & {0, 2}
