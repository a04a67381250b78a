"""qkv's BERT against Hugging Face transformers and sentence-transformers, same weights.

all-MiniLM-L6-v2 (6 layers, 12 heads, E = 384): every layer's hidden states and attention
probabilities within 1e-5 of ``transformers`` (eager attention) in fp32 over a padded batch of
different lengths; sentence embeddings within 1e-5 of ``sentence-transformers``. Also: padding
and batching change nothing, tracing changes nothing, the packed path equals the padded one.

Tolerances are derived (``tests/tolerance.py``): the exact answer is ``transformers`` in float64,
and qkv in float32 may be at most twice as far from it as ``transformers`` in float32 is.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

from qkv.errors import QkvError
from qkv.models import BertConfig, BertModel, EncoderOutput, load
from qkv.models.loading import minilm_dir
from tolerance import assert_within

SENTENCES = [
    "The dog found some pizza next to the baby and ate it.",
    "Attention is all you need.",
    "Tokenizers split unbelievably long words into pieces: antidisestablishmentarianism!",
    "Hi",
    "A sentence-transformers model maps sentences & paragraphs to a 384-dimensional dense "
    "vector space and can be used for tasks like clustering or semantic search.",
]
TOL = 1e-5  # only against sentence-transformers, whose fp64 run is not offered: see below


@pytest.fixture(scope="module")
def model() -> BertModel:
    return load("minilm")


@pytest.fixture(scope="module")
def hf_model():
    transformers = pytest.importorskip("transformers")
    m = transformers.BertModel.from_pretrained(minilm_dir(), attn_implementation="eager")
    return m.eval()


@pytest.fixture(scope="module")
def hf_ref(hf_model, batch):
    """(float32 output, float64 output) of transformers on the batch: the plain path and the truth."""
    import copy

    hf64 = copy.deepcopy(hf_model).double()
    with torch.no_grad():
        kw = dict(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                  output_hidden_states=True, output_attentions=True)
        return hf_model(**kw), hf64(**kw)


@pytest.fixture(scope="module")
def st_model():
    st = pytest.importorskip("sentence_transformers")
    return st.SentenceTransformer(minilm_dir(), device="cpu")


@pytest.fixture(scope="module")
def batch(model):
    return model.tokenizer.encode_batch(SENTENCES)


@pytest.fixture(scope="module")
def ours(model, batch) -> EncoderOutput:
    with torch.no_grad():
        return model(batch.input_ids, batch.attention_mask, output_hidden_states=True,
                     trace_rows=slice(None))


def test_batch_has_padding(batch):
    lengths = batch.attention_mask.sum(1)
    assert len(set(lengths.tolist())) == len(SENTENCES)  # all different: padding is exercised
    assert int(lengths.min()) == 3 and int(lengths.max()) > 30


def test_hidden_states_and_attention_equal_transformers(model, batch, ours, hf_ref):
    plain, ref = hf_ref
    real = batch.attention_mask.bool()  # (b, t)
    assert len(ours.hidden_states) == len(ref.hidden_states) == model.config.num_hidden_layers + 1
    for L, (a, p, r) in enumerate(zip(ours.hidden_states, plain.hidden_states, ref.hidden_states)):
        assert_within(a[real], r[real], p[real], what=f"hidden_states[{L}]")
    assert torch.equal(ours.last_hidden_state, ours.hidden_states[-1])
    pair = real[:, None, :, None] & real[:, None, None, :]  # (b, 1, t, t) real row and column
    for L, (trace, p, r) in enumerate(zip(ours.traces, plain.attentions, ref.attentions)):
        w = trace.self_attn.attention.weights  # (b, h, t, t)
        assert w.shape == r.shape
        assert_within(w, r, p, where=pair, what=f"layer {L} attention probabilities")


def test_padded_keys_get_zero_weight(batch, ours):
    pad_keys = ~batch.attention_mask.bool()[:, None, None, :]  # (b, 1, 1, t)
    for trace in ours.traces:
        w = trace.self_attn.attention.weights
        assert w.masked_select(pad_keys.expand_as(w)).abs().max() == 0
        torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1]))


def test_tracing_does_not_change_the_forward(model, batch, ours, hf_ref):
    """The traced forward (reference attention) and the plain one (fused) differ by roundings
    only: each is as close to float64 truth as transformers' own float32 forward (×2)."""
    with torch.no_grad():
        fused = model(batch.input_ids, batch.attention_mask, output_hidden_states=True)
    assert fused.traces is None
    plain, ref = hf_ref
    real = batch.attention_mask.bool()
    for L, (a, b, p, r) in enumerate(zip(fused.hidden_states, ours.hidden_states,
                                         plain.hidden_states, ref.hidden_states)):
        assert_within(a[real], r[real], p[real], what=f"fused hidden_states[{L}]")
        assert_within(b[real], r[real], p[real], what=f"traced hidden_states[{L}]")


def test_trace_holds_what_each_layer_projected(model, ours):
    """Post-norm: the query input of layer L is hidden_states[L]; W_Q of head H is a row block."""
    d = model.config.head_dim
    for L, trace in enumerate(ours.traces):
        x = ours.hidden_states[L]  # (b, t, E)
        assert torch.equal(trace.self_attn.query_input, x)
        for H in (0, 7):
            proj = model.layers[L].self_attn.q_proj
            q = x @ proj.weight[H * d:(H + 1) * d].T + proj.bias[H * d:(H + 1) * d]  # (b, t, d)
            torch.testing.assert_close(trace.self_attn.attention.query[:, H], q, atol=1e-5, rtol=0)


def test_trace_rows_subset(model, batch, ours):
    rows = torch.tensor([0, 2])
    with torch.no_grad():
        out = model(batch.input_ids, batch.attention_mask, trace_rows=rows)
    for full, part in zip(ours.traces, out.traces):
        assert torch.equal(part.self_attn.rows, rows)
        assert part.self_attn.attention.weights.shape[-2] == 2
        torch.testing.assert_close(part.self_attn.attention.weights,
                                   full.self_attn.attention.weights[:, :, rows], atol=1e-6, rtol=0)


def test_padding_and_batching_change_nothing(model, batch, ours):
    for i, text in enumerate(SENTENCES[:3]):
        enc = model.tokenizer.encode(text)
        with torch.no_grad():
            alone = model(torch.tensor([enc.ids])).last_hidden_state[0]  # (t_i, E)
        torch.testing.assert_close(ours.last_hidden_state[i, : len(enc)], alone, atol=1e-5, rtol=0)


def test_embed_equals_sentence_transformers(model, st_model):
    texts = SENTENCES + [" ".join(SENTENCES)] + ["short", "x " * 150]
    ref = st_model.encode(texts, batch_size=3, convert_to_tensor=True)
    got = model.embed(texts, batch_size=3)
    assert got.shape == ref.shape == (len(texts), 384)
    assert (got - ref).abs().max() < TOL
    torch.testing.assert_close(got.norm(dim=-1), torch.ones(len(texts)))


def test_embed_is_mean_pooled_forward(model, batch, ours):
    """embed (packed fast path) = normalise(mean over real tokens of the ordinary forward)."""
    real = batch.attention_mask[..., None].float()  # (b, t, 1)
    mean = (ours.last_hidden_state * real).sum(1) / real.sum(1)
    expected = torch.nn.functional.normalize(mean, dim=-1)
    torch.testing.assert_close(model.embed(SENTENCES, batch_size=2), expected, atol=1e-6, rtol=0)
    assert model.embed([]).shape == (0, 384)


def test_packed_forward_equals_padded_forward(model, batch, hf_ref):
    """varlen: the texts' tokens one after another, (1, N); the same forward, no padding."""
    from qkv.attention import VarLen

    ids = [e.ids for e in batch.encodings]
    varlen = VarLen.from_lengths([len(i) for i in ids])
    with torch.no_grad():
        packed = model(torch.tensor([[i for s in ids for i in s]]), varlen=varlen,
                       output_hidden_states=True)
    real = batch.attention_mask.bool()
    plain, ref = hf_ref
    for L, (a, p, r) in enumerate(zip(packed.hidden_states, plain.hidden_states, ref.hidden_states)):
        assert a.shape == (1, varlen.total, model.config.hidden_size)
        assert_within(a[0], r[real], p[real], what=f"packed hidden_states[{L}]")


def test_embed_length_limit(model, st_model):
    long_text = "word " * 300  # 302 tokens: above all-MiniLM-L6-v2's 256
    with pytest.raises(QkvError, match=r"text is 302 tokens; all-MiniLM-L6-v2 takes at most 256"):
        model.embed([long_text])
    with pytest.warns(UserWarning, match="302 tokens.*256"):
        e = model.embed([long_text], truncate=True)
    ref = st_model.encode([long_text], convert_to_tensor=True)
    assert (e - ref).abs().max() < TOL  # sentence-transformers cuts at 256 too


def test_forward_rejects_too_many_positions(model):
    with pytest.raises(QkvError, match="513 tokens.*at most 512"):
        model(torch.zeros(1, 513, dtype=torch.long))


def test_forward_rejects_bad_ids(model):
    with pytest.raises(QkvError, match="30522"):
        model(torch.tensor([[101, 30522]]))
    with pytest.raises(ValueError, match="integer tensor"):
        model(torch.zeros(1, 3))


def test_bf16_is_close_to_fp32(model):
    m16 = load("minilm", dtype=torch.bfloat16)
    assert m16.embeddings.word.weight.dtype == torch.bfloat16
    e16 = m16.embed(SENTENCES).float()
    e32 = model.embed(SENTENCES)
    cos = (e16 * e32).sum(-1)
    assert cos.min() > 0.99, cos


@pytest.mark.parametrize("change, message", [
    ({"hidden_act": "quick_gelu"}, "hidden_act 'quick_gelu' is not supported"),
    ({"architectures": ["BertForQuestionAnswering"]}, "architecture 'BertForQuestionAnswering'"),
    ({"position_embedding_type": "relative_key"}, "position_embedding_type='relative_key'"),
    ({"model_type": "roberta"}, "model_type 'roberta'"),
    ({"hidden_size": 100, "num_attention_heads": 12}, r"hidden_size \(100\).*\(12\)"),
    ({"num_hidden_layers": 0}, "num_hidden_layers must be an integer >= 1, got 0"),
])
def test_config_rejects_unsupported(change, message):
    with pytest.raises(QkvError, match=message):
        BertConfig.from_dict({"model_type": "bert", "architectures": ["BertModel"], **change})


def test_config_reads_hf_keys():
    import json

    with open(os.path.join(minilm_dir(), "config.json")) as f:
        c = BertConfig.from_dict(json.load(f))
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.intermediate_size) == (384, 6, 12, 1536)
    assert (c.layer_norm_eps, c.max_position_embeddings, c.hidden_act) == (1e-12, 512, "gelu")
