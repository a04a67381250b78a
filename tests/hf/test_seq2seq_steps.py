"""The cross-attention step panel on transformers encoder-decoders (qkv.hf.seq2seq):
``cross_attention_head`` redoes x·W_Q + b → q, memory·W_K + b → k_i, the scaled scores, the
softmax and Σ w·v in float64 with the model's own numbers, as on the shipped translation model.

Tolerances are derived (tests/tolerance.py). Each ``diffs`` stage is the rounding the float32
forward made at that stage; the same code on the model loaded in float64 makes the same
roundings 2⁻²⁹ times smaller (tests/hf_decoders.py's ``assert_explain_rounding`` rule). Against
transformers' eager attention in float64 (the truth, same ids, ``labels=`` shifted by its own
forward) the recomputed weights carry the float32 forward's roundings upstream (the encoder,
the decoder's earlier layers: qkv's attention, summed in its own order), an error of eager
float32's order (the plain peer) added to it: ``FUSED_FACTOR`` times the plain error, as
tests/hf/test_seq2seq.py allows qkv's forward (T5's weights: 2.04× seen on this CPU).
"""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")  # the qkv[hf] extra
import torch  # noqa: E402

import qkv  # noqa: E402
from qkv.explain import cross_attention_head  # noqa: E402
from qkv.explain.rendering.render_cross import render_cross_steps  # noqa: E402
from seq2seq_dirs import eager_pair, save  # noqa: E402
from tolerance import FUSED_FACTOR, assert_within, ulp, unit_roundoff_ratio  # noqa: E402

SOURCE = "the cat sat on the mat"
TARGET = "le chat est assis sur le tapis"
LAYER, HEAD = 1, 1
# name: (the projections' layout in hf/projections.py's table, the module holding W_Q, pre-norm?)
EXPECTED = {
    "bart": ("q_proj, k_proj, v_proj", "q_proj", False),  # post-norm, q_proj with a bias
    "marian": ("q_proj, k_proj, v_proj", "q_proj", False),  # post-norm, sinusoidal positions
    "t5": ("q, k, v", "q", True),  # pre-norm (RMS), no biases, scale 1, a position bias
    "mbart": ("q_proj, k_proj, v_proj", "q_proj", True),  # pre-norm
    "m2m_100": ("q_proj, k_proj, v_proj", "q_proj", True),  # pre-norm, sinusoidal positions
}
PEERS = ["bart", "marian", "t5"]  # also checked against transformers' eager attention


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("seq2seq_steps")
    return {name: save(root, name) for name in EXPECTED}


def steps(path, dtype=None):
    model = qkv.load(path, dtype=dtype)
    return model, cross_attention_head(model, SOURCE, target=TARGET, token="chat", layer=LAYER,
                                       head=HEAD)


@pytest.mark.parametrize("name", list(EXPECTED))
def test_every_step_is_the_forward_within_its_rounding(dirs, name):
    path, _ = dirs[name]
    model, cs = steps(path)
    _, fine = steps(path, torch.float64)
    layout, _, norm_first = EXPECTED[name]
    attn = model.decoder[LAYER].cross_attn
    assert model.capabilities.head_weights and attn.parts.layout == layout
    assert attn.parts.q_scale == 1.0 and attn.out_proj is not None
    assert cs.norm_first == norm_first and ("pre-norm" in cs.x_source) == norm_first
    st = cs.steps
    assert st.projection == "" and st.qk_transform == ""
    d = st.head_dim
    assert st.scale == (1.0 if name == "t5" else d ** -0.5)  # T5 leaves 1/√d out
    assert cs.target_index == cs.attention.target.index("chat") and st.tokens == cs.attention.source
    s = len(cs.attention.source)
    assert st.keys.shape == (s, d) and st.weights.shape == (s,)
    ratio = unit_roundoff_ratio(torch.float32, torch.float64)  # 2²⁹
    for stage, diff in st.diffs.items():  # each stage against the float32 forward's own tensor
        tol = 4 * fine.steps.diffs[stage] * ratio + 2 * ulp(getattr(st, stage), torch.float32)
        assert diff <= tol, f"{name} {stage}: float32 forward vs float64 recomputation {diff:.3g} > {tol:.3g}"
    assert abs(float(st.weights.sum()) - 1) <= 64 * torch.finfo(torch.float64).eps


@pytest.mark.parametrize("name", PEERS)
def test_q_and_k_are_x_and_memory_times_the_modules_own_weights(dirs, name):
    """Written out from the transformers module itself (not through qkv's table): q = x·W_Qᵀ + b
    for this head's rows, k_i = m_i·W_Kᵀ + b with m the encoder's output — which is
    transformers' own encoder output (float64 eager: the truth; float32 eager: the plain peer)."""
    path, eager = dirs[name]
    model, cs = steps(path)
    st, d = cs.steps, cs.steps.head_dim
    module = model.decoder[LAYER].cross_attn.module
    _, attribute, _ = EXPECTED[name]
    rows = slice(HEAD * d, (HEAD + 1) * d)

    @torch.no_grad()
    def by_hand(linear, x):
        b = linear.bias[rows].double() if linear.bias is not None else 0.0
        return x.double() @ linear.weight[rows].double().T + b

    k_attribute = attribute.replace("q", "k")
    memory = torch.tensor(cs.to_dict()["memory"], dtype=torch.float64)  # (s, E)
    eps = torch.finfo(torch.float64).eps
    for got, want in ((st.query, by_hand(getattr(module, attribute), st.x)),
                      (st.keys, by_hand(getattr(module, k_attribute), memory))):
        assert float((got - want).abs().max()) <= 64 * eps * max(float(want.abs().max()), 1.0)
    tok = model.tokenizer
    src = torch.tensor([tok(SOURCE)["input_ids"]])
    truth, plain = (m.get_encoder()(input_ids=src).last_hidden_state[0] for m in eager_pair(eager))
    assert_within(memory, truth, plain, what="memory")


@pytest.mark.parametrize("name", PEERS)
def test_weights_equal_transformers_eager(dirs, name):
    path, eager = dirs[name]
    model, cs = steps(path)
    tok = model.tokenizer
    src = torch.tensor([tok(SOURCE)["input_ids"]])
    labels = torch.tensor([tok(text_target=TARGET)["input_ids"]])
    j = cs.target_index

    def row(m):
        with torch.no_grad():
            out = m(input_ids=src, labels=labels, output_attentions=True, use_cache=False)
        return out.cross_attentions[LAYER][0, HEAD, j]  # (s,)

    truth, plain = (row(m) for m in eager_pair(eager))
    assert_within(cs.steps.weights, truth, plain, factor=FUSED_FACTOR, what=f"{name} cross weights")
    assert_within(torch.tensor(cs.to_dict()["model_weights"]), truth, plain, factor=FUSED_FACTOR,
                  what="forward weights")


def test_the_panel_renders_and_nothing_stays_hooked(dirs):
    from rich.console import Console

    model, cs = steps(dirs["t5"][0])
    out = Console(width=200, record=True)
    render_cross_steps(out, cs)
    text = out.export_text()
    assert "q = x·W_Q + b_Q" in text and "the model's scale, not 1/√" in text
    assert "not shown" not in text
    for m in model.hf.modules():
        assert not m._forward_hooks and not m._forward_pre_hooks, type(m).__name__


def test_projections_that_cannot_be_read_are_named(dirs):
    """A cross-attention whose q_proj is no Linear (here wrapped in a Sequential: the table's
    names fit, the map is not read as a matrix): the steps start from the kernel's q, k, v and
    say why, by name; head_weights is false; from the scores on the arithmetic is the forward's."""
    from qkv.hf.seq2seq import Seq2SeqModel

    loaded = qkv.load(dirs["bart"][0])
    attn = loaded.hf.model.decoder.layers[LAYER].encoder_attn
    attn.q_proj = torch.nn.Sequential(attn.q_proj)
    model = Seq2SeqModel(loaded.hf, loaded.tokenizer, name="bart")
    assert not model.capabilities.head_weights and model.decoder[0].cross_attn.parts is not None
    cs = cross_attention_head(model, SOURCE, target=TARGET, token="chat", layer=LAYER, head=HEAD)
    st = cs.steps
    assert "BartAttention" in st.projection and "x·W_Q, x·W_K and x·W_V are not shown" in st.projection
    assert st.diffs["query"] == 0 and st.diffs["keys"] == 0  # the kernel's own
    top = float(st.values.abs().max())
    s = len(cs.attention.source)
    assert st.max_abs_diff <= 4 * s * torch.finfo(torch.float32).eps * max(top, 1.0)
    from rich.console import Console

    out = Console(width=200, record=True)
    render_cross_steps(out, cs)
    assert "x·W_Q, x·W_K and x·W_V are not shown" in out.export_text()
