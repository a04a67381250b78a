"""Library arguments of the wrong type are ValueErrors naming the argument (issue 9), not a
TypeError or IndexError from deep inside."""

import pytest
import torch

import qkv
import qkv.explain
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


# -- issue 23: every library argument error is a ValueError naming the argument ------------------
def _lse_of_causal():
    bm = qkv.create_block_mask(qkv.masks.causal(), None, None, 5, 5)
    return qkv.scaled_dot_product_attention(Q, Q, Q, block_mask=bm, return_lse=True)[1]


def _mha_call(x):
    return MultiHeadAttention(8, 2)(x)


LIBRARY_ERRORS = {
    "1-D attn_mask": (lambda: scaled_dot_product_attention(Q, Q, Q, attn_mask=torch.ones(5, dtype=torch.bool)),
                      r"attn_mask must have at least 2 dims \(\.\.\., t, s\), got shape \(5,\)"),
    "scale 10**400": (lambda: scaled_dot_product_attention(Q, Q, Q, scale=10**400), r"^scale must be a finite number"),
    "softcap 10**400": (lambda: scaled_dot_product_attention(Q, Q, Q, softcap=10**400), r"^softcap must be a finite"),
    "meta tensors": (lambda: scaled_dot_product_attention(*[torch.empty(1, 2, 5, 4, device="meta")] * 3),
                     r"query, key and value are meta tensors"),
    "enable_gqa='no'": (lambda: scaled_dot_product_attention(Q, Q, Q, enable_gqa="no"),
                        r"enable_gqa must be True or False, got 'no'"),
    "is_causal=None": (lambda: scaled_dot_product_attention(Q, Q, Q, is_causal=None), r"is_causal must be True or False"),
    "rows='1'": (lambda: qkv.attention_weights(Q, Q, _lse_of_causal(), rows="1"), r"^rows must be None, an int"),
    "rows=[2**70]": (lambda: qkv.attention_weights(Q, Q, _lse_of_causal(), rows=[2**70]), r"^rows must be None, an int"),
    "weights scale=nan": (lambda: qkv.attention_weights(Q, Q, _lse_of_causal(), scale=float("nan")),
                          r"^scale must be a finite number, got nan"),
    "integer lse": (lambda: qkv.attention_weights(Q, Q, _lse_of_causal().long()), r"^lse must be a floating-point"),
    "0 key heads, enable_gqa": (lambda: qkv.attention_weights(Q, Q[:, :0], _lse_of_causal(), enable_gqa=True),
                                r"query has 2 heads and key 0"),
    "2-argument mask_mod": (lambda: qkv.create_block_mask(lambda q, k: q >= k, None, None, 8, 8),
                            r"mask_mod must take four arguments \(b, h, q_idx, kv_idx\), got <lambda>\(q, k\)"),
    "10⁹ × 10⁹ block mask": (lambda: qkv.create_block_mask(lambda b, h, q, k: q >= k, None, None, 10**9, 10**9),
                             r"needs about [\d.]+ TB \(7812500 × 7812500 blocks\), more than the"),
    "int input to MultiHeadAttention": (lambda: _mha_call(torch.ones(1, 5, 8, dtype=torch.long)),
                                        r"^query must be a floating-point tensor \(embeddings\), got dtype torch.int64"),
    "from_torch(nn.Linear)": (lambda: MultiHeadAttention.from_torch(torch.nn.Linear(2, 2)),
                              r"^from_torch takes a torch.nn.MultiheadAttention, got Linear"),
}


@pytest.mark.parametrize("case", list(LIBRARY_ERRORS))
def test_library_errors_are_valueerrors_naming_the_argument(case):
    call, message = LIBRARY_ERRORS[case]
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize("call, message", [
    (lambda m: qkv.explain.explain(None, "the cat sat"), r"^model must be a model from qkv.load .*got NoneType"),
    (lambda m: qkv.explain.explain_head(m, "the cat sat", layer=0, head=True), r"^head must be an int, got True"),
    (lambda m: qkv.explain.explain_head(m, "the cat sat", layer=0.0, head=1), r"^layer must be an int, got 0.0"),
    (lambda m: qkv.explain.explain(m, "the cat sat", top="3"), r"^top must be an int, got '3'"),
])
def test_explain_arguments_are_named(model, call, message):
    with pytest.raises(ValueError, match=message):
        call(model)


@pytest.mark.parametrize("ids, kv_ids, t, s, offsets, message", [
    (torch.tensor([0, 0, 1, 1, 1]), None, 8, 8, {}, "document ids have length 5 but the mask has 8 queries"),
    (torch.zeros(10, dtype=torch.long), None, 8, 8, {}, "document ids have length 10 but the mask has 8 queries"),
    (torch.zeros(8, dtype=torch.long), torch.zeros(6, dtype=torch.long), 8, 8, {}, "have length 6 but the mask has 8 keys"),
    (torch.zeros(8, dtype=torch.long), None, 4, 4, dict(q_offset=2), "have length 8 but the mask has 6 queries"),
    (torch.zeros(2, 8, dtype=torch.long), None, 8, 9, {}, "have length 8 but the mask has 9 keys"),
])
def test_a_mask_mods_own_length_must_be_the_masks(ids, kv_ids, t, s, offsets, message):
    with pytest.raises(ValueError, match=message):
        qkv.create_block_mask(qkv.masks.document(ids, kv_ids), None, None, t, s, **offsets)


def test_a_chunk_of_a_bound_mask_may_be_shorter_but_not_beyond_it():
    whole = qkv.masks.document(torch.arange(8) // 3).bind(8, 8)
    first = qkv.create_block_mask(whole, None, None, 4, 4, block_size=2)  # chunk 0 of 2
    last = qkv.create_block_mask(whole, None, None, 4, 8, block_size=2, q_offset=4)
    assert first.t == 4 and last.t == 4
    with pytest.raises(ValueError, match=r"bound to 8 × 8 scores, but this mask reaches query 8"):
        qkv.create_block_mask(whole, None, None, 4, 8, q_offset=5)


def test_attention_weights_verify_refuses_an_lse_from_another_mask():
    q, k = torch.randn(1, 2, 113, 16), torch.randn(1, 2, 113, 16)
    causal = qkv.create_block_mask(qkv.masks.causal(), None, None, 113, 113)
    window = qkv.create_block_mask(qkv.masks.sliding_window(3, 0), None, None, 113, 113)
    for bm in (causal, window):  # each with its own lse: every row sums to 1 within the bound
        lse = qkv.scaled_dot_product_attention(q, k, k, block_mask=bm, return_lse=True)[1]
        qkv.attention_weights(q, k, lse, block_mask=bm, verify=True)
    with pytest.raises(ValueError, match=r"^lse does not fit these scores: row \d+ of head \d sums to"):
        qkv.attention_weights(q, k, lse, block_mask=causal, verify=True)


# -- issue 31 (8, 9): the causal API and documents keep the ValueError promise, never NaN ---------
@pytest.fixture(scope="module")
def lm():
    return qkv.load("lm")


def _lm_ids(lm):
    return lm.tokenizer.encode("the cat sat on the mat").ids


CAUSAL_ERRORS = {
    "heads=None": (lambda lm: qkv.explain.ablate(lm, _lm_ids(lm), heads=None),
                   r"^heads must be a list of \(layer, head\) pairs \(\[\] for none\), got None"),
    "heads=5": (lambda lm: qkv.explain.ablate(lm, _lm_ids(lm), heads=5), r"^heads must be a list .*got 5"),
    "heads='0'": (lambda lm: qkv.explain.ablate(lm, _lm_ids(lm), heads="0"), r"^heads must be a list .*got '0'"),
    "bytes text": (lambda lm: qkv.explain.ablate(lm, b"the cat", heads=[]),
                   r"^text_or_ids must be a text \(str\) or token ids, got bytes"),
    "float ids": (lambda lm: qkv.explain.ablate(lm, [1.5, 2.0], heads=[]), r"^text_or_ids must be .*torch.float32"),
    "ids of strings": (lambda lm: qkv.explain.ablate(lm, ["the", "cat"], heads=[]),
                       r"^text_or_ids must be a text or one sequence of token ids, got \['the', 'cat'\]"),
    "patch of 1 token": (lambda lm: qkv.explain.patch(lm, [5], [6], heads=[(0, 0)]),
                         r"^clean has 1 token: .* no next token to score in it \(nothing to measure\)"),
    "sequences=0": (lambda lm: qkv.explain.head_effects(lm, "induction", sequences=0),
                    r"^sequences must be a whole number in 1–1000, got 0"),
    "sequences=-1": (lambda lm: qkv.explain.head_effects(lm, "induction", sequences=-1), r"^sequences must be .*got -1"),
    "sequences=1.5": (lambda lm: qkv.explain.head_effects(lm, "induction", sequences=1.5), r"^sequences must be .*got 1.5"),
    # 10**9 sequences: 24 GB of ids before any check, OOM-killed; the CLI's bound is the library's
    "sequences=10**9": (lambda lm: qkv.explain.head_effects(lm, "induction", sequences=10**9),
                        r"^sequences must be a whole number in 1–1000, got 1000000000"),
    "length=0": (lambda lm: qkv.explain.head_effects(lm, "induction", sequences=2, length=0), r"^length must be .*got 0"),
    "induction length=1": (lambda lm: qkv.explain.head_effects(lm, "induction", sequences=2, length=1),
                           r"^length must be a whole number in 2–4096 \(a span of one random token leaves nothing to measure"),
    "previous-token length=1": (lambda lm: qkv.explain.head_effects(lm, "previous-token", sequences=2, length=1),
                                r"^length must be .*nothing to measure"),
    "faithfulness methods='weight'": (lambda lm: qkv.explain.faithfulness(lm, methods="weight"),
                                      r"^methods must be a non-empty list of method names .*got 'weight'"),
    "faithfulness methods=[]": (lambda lm: qkv.explain.faithfulness(lm, methods=[]), r"^methods must be .*got \[\]"),
    "faithfulness sequences=10**9": (lambda lm: qkv.explain.faithfulness(lm, methods=["weight"], sequences=10**9),
                                     r"^sequences must be a whole number in 1–1000"),
}


@pytest.mark.parametrize("case", list(CAUSAL_ERRORS))
def test_causal_arguments_are_valueerrors(lm, case):
    call, message = CAUSAL_ERRORS[case]
    with pytest.raises(ValueError, match=message):
        call(lm)


def test_the_cli_bounds_sequences_by_the_librarys_bound(capsys):
    from qkv.cli import main
    from qkv.explain.probes.induction import MAX_SEQUENCES

    assert main(["faithfulness", "--model", "lm", "--sequences", str(MAX_SEQUENCES + 1)]) == 2
    assert f"{MAX_SEQUENCES + 1}" in capsys.readouterr().err


def test_a_metric_that_is_nan_is_refused_not_reported(lm):
    """A metric that gives NaN (here on purpose) used to come back as NaN fractions."""
    nan = lambda y, ids: float("nan")  # noqa: E731
    with pytest.raises(ValueError, match=r"^<lambda> is nan on the clean run of qkv-lm"):
        ids = _lm_ids(lm)
        qkv.explain.patch(lm, ids, ids[::-1], heads=[(0, 0)], metric=nan)


DOCUMENT_ERRORS = {
    "memory_limit='x'": (lambda m: _document(m, memory_limit="x"), r"^memory_limit must be a positive, finite number of bytes"),
    "memory_limit=nan": (lambda m: _document(m, memory_limit=float("nan")), r"^memory_limit must be .*got nan"),
    "memory_limit=inf": (lambda m: _document(m, memory_limit=float("inf")), r"^memory_limit must be .*got inf"),
    "float rows": (lambda m: _document(m).weights(0, 0, torch.tensor([1.0, 2.0])),
                   r"^rows must be at most \d+ token indices .*got a torch.float32 tensor"),
    "block=10**12": (lambda m: _document(m).block_map(0, 0, block=10**12),
                     r"^block must be a whole number of tokens in 1–128 .*got 1000000000000"),
}


def _document(model, **kw):
    from qkv.explain.long.document import document

    return document(model, "the cat sat on the mat", **kw)


@pytest.mark.parametrize("case", list(DOCUMENT_ERRORS))
def test_document_arguments_are_valueerrors(model, case):
    call, message = DOCUMENT_ERRORS[case]
    with pytest.raises(ValueError, match=message):
        call(model)
