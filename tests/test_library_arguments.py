"""Library arguments of the wrong type are ValueErrors naming the argument (issue 9), not a
TypeError or IndexError from deep inside."""

import pytest
import torch

import qkv
from qkv.attention.functional import scaled_dot_product_attention
from qkv.modules import MultiHeadAttention

Q = torch.randn(1, 2, 5, 4)


@pytest.mark.parametrize("kw, message", [
    (dict(dropout_p=None), r"dropout_p must be in \[0, 1\), got None"),
    (dict(dropout_p="0.1"), r"dropout_p must be in \[0, 1\), got '0.1'"),
    (dict(dropout_p=True), r"dropout_p must be in \[0, 1\), got True"),
    (dict(dropout_p=float("nan")), r"dropout_p must be in \[0, 1\), got nan"),
    (dict(scale="x"), r"scale must be a finite number, got 'x'"),
    (dict(scale=[1.0]), r"scale must be a finite number, got \[1.0\]"),
    (dict(scale=float("inf")), r"scale must be a finite number, got inf"),
])
def test_sdpa_scalars(kw, message):
    with pytest.raises(ValueError, match=message):
        scaled_dot_product_attention(Q, Q, Q, **kw)


def test_sdpa_numeric_scalars_still_accepted():
    ref = scaled_dot_product_attention(Q, Q, Q, scale=0.5)
    assert torch.equal(scaled_dot_product_attention(Q, Q, Q, scale=torch.tensor(0.5)), ref)
    assert torch.equal(scaled_dot_product_attention(Q, Q, Q, scale=1 / 2, dropout_p=0), ref)


@pytest.mark.parametrize("rows", [[99], torch.tensor([5]), "abc", 7.5])
def test_trace_rows_out_of_range(rows):
    mha = MultiHeadAttention(8, 2)
    x = torch.randn(1, 5, 8)
    with pytest.raises(ValueError, match=r"^trace_rows must pick query positions among the 5 \(0…4\)"):
        mha(x, trace_rows=rows)


def test_trace_rows_through_a_model(model):
    ids = torch.tensor([model.tokenizer.encode("the cat").ids])
    with pytest.raises(ValueError, match="trace_rows must pick query positions"):
        model(ids, torch.ones_like(ids), trace_rows=[99])


@pytest.mark.parametrize("arg", [None, 5, b"minilm"])
def test_load_names_its_argument(arg):
    with pytest.raises(ValueError, match="name_or_path"):
        qkv.load(arg)


def test_explain_token_as_a_python_int(model):
    from qkv.explain import explain

    text = "the cat sat on the mat"
    assert explain(model, text, token=2).to_dict() == explain(model, text, token="2").to_dict()
    with pytest.raises(ValueError, match="token 99 is out of range"):
        explain(model, text, token=99)
    with pytest.raises(ValueError, match="token must be a word or an index, got 2.5"):
        explain(model, text, token=2.5)
