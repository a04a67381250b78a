"""Step by step: the float64 recomputation equals the model's own head output, and its weights
equal Hugging Face's; also on GQA, rotary and causal heads built from qkv's modules."""

import json

import pytest
import torch
import transformers

import qkv
from qkv.explain import explain_head, forward
from qkv.explain.steps import head_steps
from qkv.models.loading import minilm_dir

TEXT = "The dog found some pizza next to the baby and ate it"


@pytest.fixture(scope="module")
def model():
    return qkv.load("minilm")


@pytest.mark.parametrize("layer, head", [(0, 0), (3, 1), (5, 11)])
def test_steps_sum_equals_model_head_output(model, layer, head):
    enc = forward.encode(model, TEXT)
    i = enc.tokens.index("it")
    traced = forward.trace(model, TEXT, torch.tensor([i]))
    st = head_steps(model.layers[layer].self_attn, traced.traces[layer].self_attn, layer=layer,
                    head=head, row=0, tokens=traced.tokens, model="minilm", text=TEXT)
    model_out = traced.traces[layer].self_attn.attention.output[0, head, 0]
    assert st.max_abs_diff < 1e-5
    torch.testing.assert_close(st.output, model_out.double(), atol=1e-5, rtol=0)
    assert float(st.weights.sum()) == pytest.approx(1.0, abs=1e-12)
    # each step is what the docstring says, in float64
    torch.testing.assert_close(st.x, traced.hidden_states[layer][0, i].double())  # post-norm
    assert st.scale == pytest.approx(32 ** -0.5)
    torch.testing.assert_close(st.scaled, st.scores * st.scale)
    torch.testing.assert_close(st.output, (st.weights[:, None] * st.values).sum(0))
    # the head output is also what the layer's out_proj consumed: rebuild the layer's attention
    # block from all heads' traced outputs and compare with the layer's own result.
    att = model.layers[layer].self_attn
    heads = traced.traces[layer].self_attn.attention.output[0, :, 0].reshape(-1)  # (h·d,)
    with torch.no_grad():
        block = att.out_proj(heads)
        rebuilt = model.layers[layer].norm1(traced.hidden_states[layer][0, i] + block)
        full = att(traced.hidden_states[layer]).output
        ref = model.layers[layer].norm1(traced.hidden_states[layer][0, i] + full[0, i])
    torch.testing.assert_close(rebuilt, ref, atol=1e-5, rtol=0)


def test_steps_weights_equal_hugging_face(model):
    hf = transformers.BertModel.from_pretrained(minilm_dir(), attn_implementation="eager").eval()
    enc = forward.encode(model, TEXT)
    i = enc.tokens.index("it")
    ids = torch.tensor([enc.ids])
    captured = {}
    hook = hf.encoder.layer[3].attention.self.query.register_forward_hook(
        lambda m, inp, out: captured.__setitem__("q", out))
    with torch.no_grad():
        out = hf(input_ids=ids, output_attentions=True)
    hook.remove()
    st = explain_head(model, TEXT, token="it", layer=3, head=1)
    assert st.token_index == i and st.x_is_layer_input is True  # BERT is post-norm
    torch.testing.assert_close(st.weights, out.attentions[3][0, 1, i].double(), atol=2e-6, rtol=0)
    torch.testing.assert_close(st.query, captured["q"][0, i, 32:64].double(), atol=2e-5, rtol=0)


@pytest.mark.parametrize("kw", [dict(num_kv_heads=2), dict(rotary=qkv.RotaryEmbedding(8)),
                                dict(alibi=qkv.ALiBi(4))])
def test_steps_on_other_heads(kw):
    """GQA (keys shared by heads), rotary positions and ALiBi biases, under a causal mask and
    key padding: the recomputation still matches the module's own trace."""
    torch.manual_seed(0)
    mha = qkv.MultiHeadAttention(32, 4, **kw).double()
    x = torch.randn(1, 7, 32, dtype=torch.float64)
    padding = torch.tensor([[True] * 6 + [False]])
    tr = mha(x, is_causal=True, key_padding_mask=padding, trace_rows=torch.tensor([2, 5])).trace
    for head in range(4):
        st = head_steps(mha, tr, layer=0, head=head, row=1, tokens=list("abcdefg"), model="mha",
                        text="a b c d e f g")
        assert st.token_index == 5
        assert st.max_abs_diff < 1e-12
        assert st.weights[6:].abs().max() == 0  # causal: nothing after position 5
        assert float(st.weights.sum()) == pytest.approx(1.0)
        assert all(v < 1e-12 for v in st.diffs.values())
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
        for head in range(4):
            st = head_steps(model.layers[layer].self_attn, tr, layer=layer, head=head, row=0,
                            tokens=traced.tokens, model="gpt2", text=text)
            assert st.max_abs_diff < 1e-5
            assert st.weights[i + 1:].abs().max() == 0 and torch.isinf(st.mask[i + 1:]).all()
    st = explain_head(model, text, token=str(i), layer=1, head=2)
    assert st.x_is_layer_input is False  # pre-norm: x is norm1 of the layer's input
    assert json.loads(json.dumps(st.to_dict(), allow_nan=False))["mask"][i + 1:] == ["-inf"] * (len(enc.ids) - i - 1)
    ov = explain(model, text, token=str(i))
    assert len(ov.rows) == 8 and all(r.weights[i + 1:].abs().max() == 0 for r in ov.rows)
