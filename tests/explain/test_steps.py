"""Step by step: the float64 recomputation equals the model's own head output, and its weights
equal Hugging Face's; also on GQA, rotary and causal heads built from qkv's modules."""

import json

import pytest
import torch
from explain_peers import reference
from tolerance import assert_agree, assert_within, softmax_sum_tolerance, twin, ulp, unit_roundoff_ratio

import qkv
from qkv.explain import explain_head, forward
from qkv.explain.steps import head_steps

TEXT = "The dog found some pizza next to the baby and ate it"


@pytest.fixture(scope="module")
def model():
    return qkv.load("minilm")


def head_by_hand(att, x: torch.Tensor, head: int, i: int, *, causal: bool = False
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights (t,), output (d,)) of ``head`` for query row ``i`` from the layer input x (t, E),
    in x's dtype, straight from the projection matrices: softmax(q·Kᵀ/√d)·V (``causal``: the
    keys after ``i`` left out)."""
    d = att.head_dim
    rows = slice(head * d, (head + 1) * d)

    def project(linear):
        return x @ linear.weight[rows].to(x.dtype).T + linear.bias[rows].to(x.dtype)  # (t, d)

    q, k, v = project(att.q_proj)[i], project(att.k_proj), project(att.v_proj)
    scores = k @ q / d ** 0.5  # (t,)
    if causal:
        scores[i + 1:] = float("-inf")
    w = torch.softmax(scores, -1)  # (t,)
    return w, w @ v


@pytest.mark.parametrize("layer, head", [(0, 0), (3, 1), (5, 11)])
def test_steps_equal_the_head_computed_by_hand(model, layer, head):
    enc = forward.encode(model, TEXT)
    i = enc.tokens.index("it")
    traced = forward.trace(model, TEXT, torch.tensor([i]))
    st = head_steps(model.layers[layer].self_attn, traced.traces[layer].self_attn, layer=layer,
                    head=head, row=0, tokens=traced.tokens, model="minilm", text=TEXT)
    att, x = model.layers[layer].self_attn, traced.hidden_states[layer][0]  # (t, E): post-norm input
    with torch.no_grad():
        ref_w, ref = head_by_hand(att, x.double(), head, i)
        low_w, low = head_by_hand(att, x, head, i)  # the same arithmetic in float32
    # float64 steps and the float64 oracle: one answer, two orders of summation
    assert_agree(st.weights, ref_w, low_w, what="weights")
    assert_agree(st.output, ref, low, what="head output")
    # the forward's own float32 output: as close to the truth as plain float32 arithmetic is
    model_out = traced.traces[layer].self_attn.attention.output[0, head, 0]
    assert_within(model_out, ref, low, what="the forward's head output")
    assert abs(float(st.weights.sum()) - 1) <= softmax_sum_tolerance(len(enc.ids), torch.float64)
    torch.testing.assert_close(st.x, x[i].double(), rtol=0, atol=0)  # post-norm: x is the input
    # 1/√32 however it is spelled (√ then ÷, or a power): each way one or two roundings apart
    assert st.scale == pytest.approx(32 ** -0.5, rel=2 * torch.finfo(torch.float64).eps)
    # the head output is also what the layer's out_proj consumed: rebuild the layer's attention
    # block from all heads' traced outputs and compare with the layer run in float64.
    heads = traced.traces[layer].self_attn.attention.output[0, :, 0].reshape(-1)  # (h·d,)
    layer64 = twin(model.layers[layer], torch.float64)
    with torch.no_grad():
        rebuilt = model.layers[layer].norm1(x[i] + att.out_proj(heads))
        plain = model.layers[layer].norm1(x[i] + att(x[None]).output[0, i])
        truth = layer64.norm1(x[i].double() + layer64.self_attn(x[None].double()).output[0, i])
    assert_within(rebuilt, truth, plain, what="the rebuilt attention block")


def test_steps_weights_equal_hugging_face(model, hf):
    enc = forward.encode(model, TEXT)
    i = enc.tokens.index("it")
    captured = {}
    ref, tol = reference(hf, enc.ids)  # float64 peer's weights, derived bound
    for dtype, peer in ((torch.float32, hf), (torch.float64, twin(hf, torch.float64))):
        hook = peer.encoder.layer[3].attention.self.query.register_forward_hook(
            lambda m, inp, out, dtype=dtype: captured.__setitem__(dtype, out[0, i, 32:64]))
        with torch.no_grad():
            peer(input_ids=torch.tensor([enc.ids]))
        hook.remove()
    st = explain_head(model, TEXT, token="it", layer=3, head=1)
    assert st.token_index == i and st.x_is_layer_input is True  # BERT is post-norm
    torch.testing.assert_close(st.weights, ref[3, 1, i], atol=tol, rtol=0)
    assert_within(st.query, captured[torch.float64], captured[torch.float32], what="query")


@pytest.mark.parametrize("kw", [dict(num_kv_heads=2), dict(rotary=qkv.RotaryEmbedding(8)),
                                dict(alibi=qkv.ALiBi(4))])
def test_steps_on_other_heads(kw):
    """GQA (keys shared by heads), rotary positions and ALiBi biases, under a causal mask and
    key padding: the recomputation still matches the module's own trace."""
    torch.manual_seed(0)
    mha = qkv.MultiHeadAttention(32, 4, **kw).double()
    x = torch.randn(1, 7, 32, dtype=torch.float64)
    padding = torch.tensor([[True] * 6 + [False]])
    rows = torch.tensor([2, 5])
    tr = mha(x, is_causal=True, key_padding_mask=padding, trace_rows=rows).trace
    mha32 = twin(mha, torch.float32)  # the same head one precision down: its rounding, measured
    tr32 = mha32(x.float(), is_causal=True, key_padding_mask=padding, trace_rows=rows).trace
    steps = dict(layer=0, row=1, tokens=list("abcdefg"), model="mha", text="a b c d e f g")
    for head in range(4):
        st = head_steps(mha, tr, head=head, **steps)
        st32 = head_steps(mha32, tr32, head=head, **steps)
        assert st.token_index == 5
        # The float64 forward and its float64 recomputation differ by rounding alone. The
        # float32 twin's difference at each stage, rescaled by eps64/eps32, measures that
        # rounding; ×4 and + 2 ulp as tests/tolerance.py's assert_agree derives them.
        for stage, diff in st.diffs.items():
            bound = (4 * st32.diffs[stage] * unit_roundoff_ratio(torch.float64, torch.float32)
                     + 2 * ulp(getattr(st, stage), torch.float64))
            assert diff <= bound, (stage, diff, bound)
        assert st.weights[6:].abs().max() == 0  # causal: nothing after position 5
        # six keys take part (position 6 is padding, its exact 0 adds nothing to the sum)
        assert abs(float(st.weights.sum()) - 1) <= softmax_sum_tolerance(6, torch.float64)
        assert torch.isinf(st.mask[6:]).all() and (st.mask[6:] < 0).all()
        if "alibi" in kw:  # the bias the forward added: its slope times the distance, not 0
            assert st.mask[:6].abs().max() > 0 and torch.isfinite(st.mask[:6]).all()
        else:
            assert st.mask[:6].abs().max() == 0


def test_steps_to_dict_has_every_number(model):
    st = explain_head(model, TEXT, token="it", layer=3, head=1)
    d = json.loads(json.dumps(st.to_dict(), allow_nan=False))
    for key in ("tokens", "layer", "head", "token_index", "x", "query", "keys", "values", "scores",
                "scaled", "weights", "output", "model_output", "max_abs_diff"):
        assert key in d
    assert len(d["x"]) == 384 and len(d["keys"]) == 14 and len(d["keys"][0]) == 32
    assert d["tokens"][d["token_index"]] == "it" and d["layer"] == 3 and d["head"] == 1
    assert d["model"] == "all-MiniLM-L6-v2" and d["text"] == TEXT
    assert d["x"] == st.x.tolist() and d["weights"] == st.weights.tolist()


def test_a_split_word_is_explained_at_its_last_token(model):
    text = "The pizzeria's owner found it"
    st = explain_head(model, text, token="pizzeria", words=True, layer=0, head=0)
    assert st.word == "pizzeria" and [st.tokens[i] for i in st.word_tokens] == ["pi", "##zz", "##eria"]
    assert st.token_index == st.word_tokens[-1] and st.notes == ()
    st = explain_head(model, text, token="pizzeria", layer=0, head=0)  # tokens: a note says which
    assert st.word is None and st.tokens[st.token_index] == "##eria"
    assert "Add words=True to treat it as one word." in str(st.notes[0])


@pytest.mark.parametrize("kwargs, message", [
    (dict(token="cat", layer=0, head=0), "token 'cat' is not a token of the text"),
    (dict(layer=6, head=0), "layer 6 is out of range: all-MiniLM-L6-v2 has 6 layers (0–5)"),
    (dict(layer=0, head=12), "head 12 is out of range: all-MiniLM-L6-v2 has 12 heads per layer (0–11)"),
])
def test_errors_name_the_arguments(model, kwargs, message):
    with pytest.raises(ValueError) as e:
        explain_head(model, TEXT, **kwargs)
    assert str(e.value).startswith(message), str(e.value)


def normed_all(model, traced, layer: int) -> torch.Tensor:
    """(t, E): what a pre-norm layer projects, norm1 of its input, for every token."""
    with torch.no_grad():
        return model.layers[layer].norm1(traced.hidden_states[layer][0])


def test_explain_a_pre_norm_causal_decoder():
    """GPT-2 (pre-norm, causal): the traced query input is norm1(hidden_states[L]), keys after
    the token are masked out, and the recomputation still equals the head output. A small
    random GPT-2 with the minilm tokenizer stands in for the real one (no weights offline)."""
    from qkv.explain import explain
    from qkv.models import GPT2Config, GPT2Model

    torch.manual_seed(0)
    model = GPT2Model(GPT2Config(vocab_size=30522, n_positions=64, n_embd=32, n_layer=2, n_head=4),
                      tokenizer=qkv.load("minilm").tokenizer).eval()
    text = "the cat sat on the mat"
    enc = forward.encode(model, text)
    i = 3
    traced = forward.trace(model, text, torch.tensor([i]))
    for layer in range(2):
        tr = traced.traces[layer].self_attn
        with torch.no_grad():
            normed = model.layers[layer].norm1(traced.hidden_states[layer][0, i])
        torch.testing.assert_close(tr.query_input[0, 0], normed)
        att, x = model.layers[layer].self_attn, normed_all(model, traced, layer)  # (t, E)
        for head in range(4):
            st = head_steps(att, tr, layer=layer, head=head, row=0, tokens=traced.tokens,
                            model="gpt2", text=text)
            with torch.no_grad():
                ref_w, ref = head_by_hand(att, x.double(), head, i, causal=True)
                low_w, low = head_by_hand(att, x, head, i, causal=True)  # plain float32
            # the float64 recomputation and the float64 oracle: one answer summed two ways; the
            # forward's float32 output as close to it as plain float32 arithmetic is
            assert_agree(st.output, ref, low, what="head output")
            assert_within(st.model_output.float(), ref, low, what="the forward's head output")
            assert st.weights[i + 1:].abs().max() == 0 and torch.isinf(st.mask[i + 1:]).all()
    st = explain_head(model, text, token=str(i), layer=1, head=2)
    assert st.x_is_layer_input is False  # pre-norm: x is norm1 of the layer's input
    assert json.loads(json.dumps(st.to_dict(), allow_nan=False))["mask"][i + 1:] == ["-inf"] * (len(enc.ids) - i - 1)
    ov = explain(model, text, token=str(i))
    assert len(ov.rows) == 8 and all(r.weights[i + 1:].abs().max() == 0 for r in ov.rows)
