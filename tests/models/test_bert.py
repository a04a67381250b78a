"""qkv's BERT against Hugging Face transformers and sentence-transformers, same weights.

all-MiniLM-L6-v2 (6 layers, 12 heads, E = 384): every layer's hidden states and attention
probabilities against ``transformers`` (eager attention) over a padded batch of different
lengths; sentence embeddings against ``sentence-transformers``. Also: padding and batching change
nothing, tracing changes nothing, the packed path equals the padded one; and a tiny random BERT
whose packed (varlen) forward equals its padded one and each text alone.

Tolerances are derived (``tests/tolerance.py``): the exact answer is the peer (``transformers``,
``sentence-transformers``) in float64, and qkv in float32 (or bfloat16) may be at most twice as
far from it as the peer in the same dtype is.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

from qkv.attention import VarLen
from qkv.errors import QkvError
from qkv.models import BertConfig, BertModel, EncoderOutput, load
from qkv.models.loading import minilm_dir
from tolerance import assert_within, bound, max_err, softmax_sum_tolerance, twin

SENTENCES = [
    "The dog found some pizza next to the baby and ate it.",
    "Attention is all you need.",
    "Tokenizers split unbelievably long words into pieces: antidisestablishmentarianism!",
    "Hi",
    "A sentence-transformers model maps sentences & paragraphs to a 384-dimensional dense "
    "vector space and can be used for tasks like clustering or semantic search.",
]


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
    hf64 = twin(hf_model, torch.float64)
    with torch.no_grad():
        kw = dict(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                  output_hidden_states=True, output_attentions=True)
        return hf_model(**kw), hf64(**kw)


@pytest.fixture(scope="module")
def st_model():
    st = pytest.importorskip("sentence_transformers")
    return st.SentenceTransformer(minilm_dir(), device="cpu")


@pytest.fixture(scope="module")
def st_model64(st_model):
    """sentence-transformers in float64: the truth for sentence embeddings."""
    return twin(st_model, torch.float64)


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
        assert (w.sum(-1) - 1).abs().max() <= softmax_sum_tolerance(w.shape[-1], w.dtype)


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
            w, b = proj.weight[H * d:(H + 1) * d], proj.bias[H * d:(H + 1) * d]
            q = x @ w.T + b  # (b, t, d): the plain path, by hand in fp32
            truth = x.double() @ w.double().T + b.double()
            assert_within(trace.self_attn.attention.query[:, H], truth, q, what=f"layer {L} head {H}")


def test_trace_rows_subset(model, batch, ours):
    rows = torch.tensor([0, 2])
    with torch.no_grad():
        out = model(batch.input_ids, batch.attention_mask, trace_rows=rows)
    for full, part in zip(ours.traces, out.traces):
        assert torch.equal(part.self_attn.rows, rows)
        assert part.self_attn.attention.weights.shape[-2] == 2
    # a trace of 2 rows runs other matrix shapes than the full trace (and the untraced rows the fast
    # path): both are fp32 answers, each as close to the fp64 truth as the plain computation is
    with torch.no_grad():
        truth = twin(model, torch.float64)(batch.input_ids, batch.attention_mask, trace_rows=rows)
    for full, part, ref in zip(ours.traces, out.traces, truth.traces):
        w = ref.self_attn.attention.weights
        assert_within(part.self_attn.attention.weights.double(), w,
                      full.self_attn.attention.weights[:, :, rows].double(), factor=4.0, what="weights")


def test_padding_and_batching_change_nothing(model, batch, ours, hf_ref):
    """Each text alone is as close to the truth (transformers in fp64 on the padded batch: padding
    changes nothing there either) as transformers' padded fp32 forward — and so is the batch."""
    plain, ref = hf_ref
    for i, text in enumerate(SENTENCES[:3]):
        enc = model.tokenizer.encode(text)
        with torch.no_grad():
            alone = model(torch.tensor([enc.ids])).last_hidden_state[0]  # (t_i, E)
        n = len(enc)
        truth, p = ref.last_hidden_state[i, :n], plain.last_hidden_state[i, :n]
        assert_within(alone, truth, p, what=f"text {i} alone")
        assert_within(ours.last_hidden_state[i, :n], truth, p, what=f"text {i} in the batch")


def test_embed_equals_sentence_transformers(model, st_model, st_model64):
    texts = SENTENCES + [" ".join(SENTENCES)] + ["short", "x " * 150]
    plain = st_model.encode(texts, batch_size=3, convert_to_tensor=True)
    truth = st_model64.encode(texts, batch_size=3, convert_to_tensor=True)
    got = model.embed(texts, batch_size=3)
    assert got.shape == plain.shape == (len(texts), 384)
    assert_within(got, truth, plain, what="sentence embeddings")
    # unit length, to within what the peer's own float32 normalisation leaves (+ 2 ulp of 1)
    ones = torch.ones(len(texts), dtype=torch.float64)
    norms, peer_norms = got.double().norm(dim=-1), plain.double().norm(dim=-1)
    assert max_err(norms, ones) <= bound(ones, peer_norms, dtype=torch.float32)


def _mean_pooled(last_hidden_state, attention_mask):
    real = attention_mask[..., None].to(last_hidden_state.dtype)  # (b, t, 1)
    mean = (last_hidden_state * real).sum(1) / real.sum(1)
    return torch.nn.functional.normalize(mean, dim=-1)  # (b, E)


def test_embed_is_mean_pooled_forward(model, batch, hf_ref):
    """embed (packed fast path) = normalise(mean over real tokens of the forward): as close to
    that recipe on transformers' fp64 forward as the recipe on its fp32 forward is."""
    plain, ref = hf_ref
    truth = _mean_pooled(ref.last_hidden_state, batch.attention_mask)
    expected = _mean_pooled(plain.last_hidden_state, batch.attention_mask)
    assert_within(model.embed(SENTENCES, batch_size=2), truth, expected)
    assert model.embed([]).shape == (0, 384)


def test_packed_forward_equals_padded_forward(model, batch, hf_ref):
    """varlen: the texts' tokens one after another, (1, N); the same forward, no padding."""
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


# -- packed sequences on a tiny random BERT ----------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_bert() -> BertModel:
    torch.manual_seed(0)
    model = BertModel(BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2,
                                 num_attention_heads=4, intermediate_size=48,
                                 max_position_embeddings=16))
    with torch.no_grad():  # random LayerNorms and biases too, so nothing wired wrong can hide
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return model.eval()


TINY_LENGTHS = [5, 1, 13, 7]  # awkward, one of a single token, one longer than the others


def test_tiny_bert_packed_equals_padded_and_each_text_alone(tiny_bert):
    """The truth: each text alone in float64; the plain path: each alone in float32. The packed
    (1, N) forward and the padded (b, t) one must each be within the rule of it, layer by layer."""
    gen = torch.Generator().manual_seed(1)
    texts = [torch.randint(1, 50, (n,), generator=gen) for n in TINY_LENGTHS]
    types = [torch.randint(0, 2, (n,), generator=gen) for n in TINY_LENGTHS]
    model64 = twin(tiny_bert, torch.float64)
    varlen = VarLen.from_lengths(TINY_LENGTHS)
    t = max(TINY_LENGTHS)
    padded_ids = torch.zeros(len(texts), t, dtype=torch.long)
    padded_types = torch.zeros(len(texts), t, dtype=torch.long)
    mask = torch.zeros(len(texts), t, dtype=torch.long)
    for i, (ids, tt) in enumerate(zip(texts, types)):
        padded_ids[i, : len(ids)], padded_types[i, : len(ids)], mask[i, : len(ids)] = ids, tt, 1
    with torch.no_grad():
        packed = tiny_bert(torch.cat(texts)[None], token_type_ids=torch.cat(types)[None],
                           varlen=varlen, output_hidden_states=True)
        padded = tiny_bert(padded_ids, mask, padded_types, output_hidden_states=True)
        for i, (ids, tt) in enumerate(zip(texts, types)):
            alone = tiny_bert(ids[None], token_type_ids=tt[None], output_hidden_states=True)
            truth = model64(ids[None], token_type_ids=tt[None], output_hidden_states=True)
            start, end = varlen.cu_seqlens[i].item(), varlen.cu_seqlens[i + 1].item()
            for L in range(len(truth.hidden_states)):
                r, p = truth.hidden_states[L][0], alone.hidden_states[L][0]
                assert_within(packed.hidden_states[L][0, start:end], r, p, what=f"packed text {i} [{L}]")
                assert_within(padded.hidden_states[L][i, : len(ids)], r, p, what=f"padded text {i} [{L}]")
    assert packed.last_hidden_state.shape == (1, varlen.total, 32)


def test_tiny_bert_packed_arguments_are_checked(tiny_bert):
    varlen = VarLen.from_lengths([3, 2])
    ids = torch.ones(1, 5, dtype=torch.long)
    with pytest.raises(ValueError, match=r"with varlen, input_ids must be \(1, N\) = \(1, 5\), got \(1, 4\)"):
        tiny_bert(ids[:, :4], varlen=varlen)
    with pytest.raises(ValueError, match=r"with varlen, input_ids must be \(1, N\) = \(1, 5\), got \(5, 1\)"):
        tiny_bert(ids.T.contiguous(), varlen=varlen)
    with pytest.raises(ValueError, match="packed sequences .* pass attention_mask=None"):
        tiny_bert(ids, torch.ones(1, 5), varlen=varlen)
    # each text must fit the position table, however long the packed row is
    tiny_bert(torch.ones(1, 30, dtype=torch.long), varlen=VarLen.from_lengths([15, 15]))
    with pytest.raises(QkvError, match="input is 17 tokens; bert takes at most 16"):
        tiny_bert(torch.ones(1, 20, dtype=torch.long), varlen=VarLen.from_lengths([17, 3]))


def test_embed_length_limit(model, st_model, st_model64):
    long_text = "word " * 300  # 302 tokens: above all-MiniLM-L6-v2's 256
    with pytest.raises(QkvError, match=r"text is 302 tokens; all-MiniLM-L6-v2 takes at most 256"):
        model.embed([long_text])
    with pytest.warns(UserWarning, match="302 tokens.*256"):
        e = model.embed([long_text], truncate=True)
    # sentence-transformers cuts at 256 too
    assert_within(e, st_model64.encode([long_text], convert_to_tensor=True),
                  st_model.encode([long_text], convert_to_tensor=True))


def test_forward_rejects_too_many_positions(model):
    with pytest.raises(QkvError, match="513 tokens.*at most 512"):
        model(torch.zeros(1, 513, dtype=torch.long))


def test_forward_rejects_bad_ids(model):
    with pytest.raises(QkvError, match="30522"):
        model(torch.tensor([[101, 30522]]))
    with pytest.raises(ValueError, match="integer tensor"):
        model(torch.zeros(1, 3))


def test_bf16_is_as_close_to_the_truth_as_sentence_transformers_in_bf16(st_model, st_model64):
    m16 = load("minilm", dtype=torch.bfloat16)
    assert m16.embeddings.word.weight.dtype == torch.bfloat16
    e16 = m16.embed(SENTENCES)
    assert e16.dtype == torch.bfloat16
    plain = twin(st_model, torch.bfloat16).encode(SENTENCES, convert_to_tensor=True)
    truth = st_model64.encode(SENTENCES, convert_to_tensor=True)
    assert_within(e16, truth, plain, what="bf16 sentence embeddings")


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


def test_a_string_is_one_text_as_sentence_transformers_reads_it(model, st_model):
    """issue 23: embed("the cat") embedded each character ((7, 384)); a str is one text."""
    one = model.embed("the cat")
    assert one.shape == (384,)
    torch.testing.assert_close(one, model.embed(["the cat"])[0], rtol=0, atol=0)
    peer = st_model.encode("the cat", convert_to_tensor=True)  # (E,) for a str, too
    assert peer.shape == one.shape
    for bad in (None, 3, b"the cat"):
        with pytest.raises(ValueError, match="texts must be a string or a list of strings"):
            model.embed(bad)
