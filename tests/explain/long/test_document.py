"""qkv.explain.long.document: rows, received sums and tile sums of a ~1k-token text equal a dense
float64 recomputation (transformers eager, ``output_attentions``, on the same weights); the
overview equals ``explain``'s; the model's mask (causal, sliding window) is respected; bad input
gets one clear error.

Tolerances (tests/tolerance.py): the truth is transformers in float64; the document (float32)
may be at most twice as far from it as transformers in float32 is, plus 2 ulp.
"""

from __future__ import annotations

import math

import pytest
import torch

import qkv
from hf_decoders import make_checkpoint
from qkv.errors import QkvError
from qkv.explain import explain
from qkv.explain.long.document import FIRST_CALL_BYTES, document, estimate_bytes, tokenizing_bytes
from qkv.explain.wording import ArgumentError
from tolerance import assert_within, bound, twin

SENTENCE = "The quick brown fox jumps over the lazy dog. Attention is all you need, said the paper. "
TEXT = SENTENCE * 18  # ~1,100 tokens with the test tokenizer
SIZES = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=4096)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("llama"), "LlamaConfig", "LlamaForCausalLM",
                           **SIZES)


@pytest.fixture(scope="module")
def mistral(tmp_path_factory):  # a sliding window of 100 keys
    return make_checkpoint(tmp_path_factory.mktemp("mistral"), "MistralConfig",
                           "MistralForCausalLM", sliding_window=100, **SIZES)


def eager_attentions(hf, ids):
    """(float32, float64) transformers eager attentions: L tensors (h, t, t) each."""
    out = []
    for model in (hf, twin(hf, torch.float64)):
        with torch.no_grad():
            att = model(input_ids=ids, output_attentions=True).attentions
        out.append([a[0] for a in att])
    return out


def tiles(w: torch.Tensor, block: int) -> torch.Tensor:
    """(t, s) → (⌈t/b⌉, ⌈s/b⌉) tile sums."""
    t, s = w.shape
    nq, nk = math.ceil(t / block), math.ceil(s / block)
    padded = torch.nn.functional.pad(w, (0, nk * block - s, 0, nq * block - t))
    return padded.view(nq, block, nk, block).sum((1, 3))


@pytest.mark.parametrize("which", ["llama", "mistral"])
def test_rows_received_and_tiles_equal_eager_float64(which, request):
    path, hf = request.getfixturevalue(which)
    doc = document(qkv.load(path), TEXT)
    n = len(doc)
    assert 1000 < n < 2000
    plain, ref = eager_attentions(hf, torch.tensor([doc.encoding.ids]))
    rows = [0, 1, 137, n // 2, n - 1]
    for layer in range(SIZES["num_hidden_layers"]):
        for head in (0, 3):
            r, p = ref[layer][head], plain[layer][head]  # (t, t)
            assert_within(doc.weights(layer, head, rows), r[rows], p[rows],
                          what=f"{which} weights L{layer}H{head}")
            assert_within(doc.received(layer, head), r.sum(0), p.sum(0),
                          what=f"{which} received L{layer}H{head}")
            for block in (128, 100):
                assert_within(doc.block_map(layer, head, block=block), tiles(r, block),
                              tiles(p, block), what=f"{which} block map {block} L{layer}H{head}")
            assert_within(doc.column(layer, 0)[head], r[:, 0], p[:, 0], what="column 0")
    # the mask: nothing from the future; under the window nothing older than 100 keys either
    w = doc.weights(2, 1, [n - 1])[0]
    assert bool((doc.weights(2, 1, [5])[0, 6:] == 0).all())
    if which == "mistral":
        assert bool((w[: n - 1 - 100] == 0).all()) and bool((w[n - 1 - 99:] > 0).all())
        assert bool((doc.block_map(0, 0, block=128).tril(-2) == 0).all())  # the band's tiles only
    else:
        assert bool((w > 0).all())
    sinks = doc.sinks()
    assert sinks.shape == (3, 4)
    assert_within(sinks[1], ref[1][:, :, 0].mean(-1), plain[1][:, :, 0].mean(-1), what="sinks")


def ranked(ov):
    return [(r.layer, r.head) for r in ov.rows]


def assert_same_ranking(got, want, truth, plain):
    """Same rows, unit, focus and sink; the order equal except among heads whose largest weights
    lie within the derived tolerance of each other (their order is a rounding)."""
    assert (got.unit, got.focus, got.units.labels, got.method, got.per) == \
        (want.unit, want.focus, want.units.labels, want.method, want.per)
    assert str(got.sink) == str(want.sink) and str(got.focus_reason) == str(want.focus_reason)
    key = {(r.layer, r.head): r.max_weight for r in truth.rows}
    tol = bound(torch.tensor([r.max_weight for r in truth.rows], dtype=torch.float64),
                torch.tensor([key_of(plain, r) for r in truth.rows]))
    assert sorted(ranked(got)) == sorted(ranked(want))
    for a, b in zip(ranked(got), ranked(want)):
        assert a == b or abs(key[a] - key[b]) <= 2 * tol, (a, b, key[a], key[b], tol)


def key_of(ov, row):
    return next(r.max_weight for r in ov.rows if (r.layer, r.head) == (row.layer, row.head))


@pytest.mark.parametrize("token,words,method", [("paper", False, "weight"), ("fox@3", True, "weight"),
                                                (None, False, "norm"), ("dog", False, "rollout")])
def test_explain_is_explains_overview(llama, token, words, method):
    path, _ = llama
    model, model64 = qkv.load(path), qkv.load(path, dtype=torch.float64)
    doc = document(model, TEXT)
    got = doc.explain(token=token, words=words, method=method)
    want = explain(model, TEXT, token=token, words=words, method=method)
    truth = explain(model64, TEXT, token=token, words=words, method=method)
    assert_same_ranking(got, want, truth, want)
    assert_within(got.scores, truth.scores, want.scores, what=f"{method} scores")


def test_explain_on_a_native_encoder(model):
    """MiniLM (BERT, no causal mask): the document's overview is explain's."""
    text = " ".join(["the dog found some pizza next to the baby and ate it"] * 40)
    doc = document(model, text)
    got, want = doc.explain(token="pizza@7", top=5), explain(model, text, token="pizza@7", top=5)
    truth = explain(qkv.load("minilm", dtype=torch.float64), text, token="pizza@7", top=5)
    assert_same_ranking(got, want, truth, want)
    assert_within(got.scores, truth.scores, want.scores, what="encoder weights")
    assert bool((doc.weights(0, 0, [3])[0] > 0).all())  # every key visible


def test_explain_layer_and_to(llama):
    path, _ = llama
    model = qkv.load(path)
    doc = document(model, TEXT)
    got = doc.explain(token="paper", layer=1, to="the@5")
    want = explain(model, TEXT, token="paper", layer=1, to="the@5")
    assert ranked(got) == ranked(want) and got.focus == want.focus
    assert {r.layer for r in got.rows} == {1}


def test_bad_input_is_one_clear_error(llama):
    path, _ = llama
    model = qkv.load(path)
    with pytest.raises(QkvError, match="empty"):
        document(model, "   ")
    with pytest.raises(QkvError, match=r"not valid UTF-8 \(byte 0xff at position 4\)"):
        document(model, b"the \xff cat")
    with pytest.raises(QkvError, match="lone surrogate"):
        document(model, "the \ud800 cat")
    with pytest.raises(QkvError, match=r"the text is 6,100 tokens and llama\d+ takes at most 4,096; shorten it"):
        document(model, SENTENCE * 100)
    need = estimate_bytes(model, len(model.tokenizer.encode(TEXT).ids))
    with pytest.raises(QkvError, match=rf"needs about {need / 2**30:.2f} GiB .* but 0.00 GiB is available"):
        document(model, TEXT, memory_limit=tokenizing_bytes(TEXT))
    doc = document(model, SENTENCE * 3)
    with pytest.raises(ArgumentError, match="layer 3 is out of range"):
        doc.received(3, 0)
    with pytest.raises(ArgumentError, match="head 4 is out of range"):
        doc.block_map(0, 4)
    with pytest.raises(ArgumentError, match=r"block must be a whole number of tokens in 1–\d+ .*got 0"):
        doc.block_map(0, 0, block=0)
    with pytest.raises(ArgumentError, match="method 'alti' re-runs the model"):
        doc.explain(method="alti")
    with pytest.raises(ArgumentError, match="token 'cat' is not a token"):
        doc.explain(token="cat")


def test_bytes_decode_like_text(llama):
    path, _ = llama
    model = qkv.load(path)
    a, b = document(model, SENTENCE), document(model, "\ufeff".encode() + SENTENCE.encode())
    assert a.tokens == b.tokens and torch.equal(a.received(0, 0), b.received(0, 0))


def test_memory_is_linear_in_the_length(llama):
    """The record's size doubles with the text: O(N), no N × N part."""
    path, _ = llama
    model = qkv.load(path)
    small, large = document(model, SENTENCE * 6), document(model, SENTENCE * 12)
    assert small.nbytes / len(small) == pytest.approx(large.nbytes / len(large))
    slope = estimate_bytes(model, 2000) - estimate_bytes(model, 1000)
    assert estimate_bytes(model, 3000) - estimate_bytes(model, 2000) == slope  # a constant + O(N)


# -- issue 31 (6, 9): every size bounded by the document ------------------------------------------
def test_a_block_is_bounded_by_the_document(llama):
    """A tile wider than the text was nk · block float64s (block 2**31 − 1: ~17 GB; 10**12: the
    allocator's RuntimeError); now the limit is named, and any block's memory is the tiles'."""
    path, _ = llama
    doc = document(qkv.load(path), SENTENCE * 3)
    n = len(doc)
    for block in (2**31 - 1, 10**12, n + 129, True, 2.0):
        with pytest.raises(ArgumentError, match=rf"^block must be a whole number of tokens in 1–{max(n, 128)} "):
            doc.block_map(0, 0, block=block)
    whole = doc.block_map(0, 0, block=n)  # one tile: every row that sees a key, once
    assert whole.shape == (1, 1) and float(whole) == pytest.approx(n, rel=n * 2**-23)
    # a tile side that cuts the mask's 128-token blocks sums the same weights as the rows do
    w = doc.weights(0, 0, range(n)).double()  # (N, N)
    got = doc.block_map(0, 0, block=37)
    want = torch.nn.functional.pad(w, (0, -n % 37, 0, -n % 37)).view(-(-n // 37), 37, -(-n // 37), 37).sum((1, 3))
    assert torch.allclose(got.double(), want, atol=64 * n * 2**-23)


@pytest.mark.parametrize("rows, message", [
    (torch.tensor([1.0, 2.0]), "a torch.float32 tensor"),
    ([1.5], r"\[1.5\]"),
    (torch.tensor([True]), "a torch.bool tensor"),
    ("1", "'1'"),
    ([0] * 10_000, "at most"),
    ([10**6], "0–"),
])
def test_rows_must_be_token_indices(llama, rows, message):
    path, _ = llama
    doc = document(qkv.load(path), SENTENCE)
    with pytest.raises(QkvError, match=rf"^rows must be .*{message}"):
        doc.weights(0, 0, rows)


@pytest.mark.parametrize("limit", ["x", float("nan"), float("inf"), -1, 0, True, [1]])
def test_memory_limit_is_a_number_of_bytes(llama, limit):
    path, _ = llama
    with pytest.raises(ArgumentError, match=r"^memory_limit must be a positive, finite number of bytes"):
        document(qkv.load(path), SENTENCE, memory_limit=limit)


# -- issue 31 (12): what a run really holds, refused early, with progress --------------------------
def test_memory_is_refused_before_the_tokenizer_runs_then_before_the_forward(llama):
    path, _ = llama
    model = qkv.load(path)
    text = SENTENCE * 4
    tokenizer_runs = []
    encode = model.tokenizer.encode
    model.tokenizer.encode = lambda *a, **k: tokenizer_runs.append(1) or encode(*a, **k)
    try:
        with pytest.raises(QkvError, match=r"^tokenising a text of 0.0 MB needs about .* GiB but"):
            document(model, text, memory_limit=tokenizing_bytes(text) - 1)
        assert not tokenizer_runs  # refused from the text's size alone
        n = len(encode(text).ids)
        with pytest.raises(QkvError, match=rf"^a document of {n} tokens needs about .* \(its tokens; "):
            document(model, text, memory_limit=estimate_bytes(model, n) - 1)
        assert len(tokenizer_runs) == 1
    finally:
        del model.tokenizer.encode


def test_progress_is_told_stage_by_stage(llama):
    path, _ = llama
    model = qkv.load(path)
    told = []
    doc = document(model, SENTENCE * 4, progress=lambda *a: told.append(a))
    L = len(model.layers)
    assert told == [("tokenising", 0, 1), ("tokenising", 1, 1),
                    *[("forward", i, L) for i in range(L)], ("forward", L, L),
                    *[("recording", i, L) for i in range(1, L + 1)]]
    quiet = document(model, SENTENCE * 4)  # the same numbers whether told or not
    assert torch.equal(doc.received(1, 2), quiet.received(1, 2))


PEAK = """
import json, sys
import torch, qkv
from qkv.explain.long.document import document, estimate_bytes
def status(key):  # kB in /proc/self/status
    return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith(key))
torch.set_num_threads(1)
model = qkv.load(sys.argv[1])
text = sys.argv[2] * int(sys.argv[3])
document(model, sys.argv[2] * 4)  # torch's own first-call buffers are not the document's
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the peak resident set (VmHWM) starts again from now
before = status("VmRSS:")
doc = document(model, text)
print(json.dumps({"peak": status("VmHWM:") - before, "estimate": estimate_bytes(model, len(doc)),
                  "n": len(doc)}))
"""


def test_the_estimate_covers_the_peak_memory(llama, tmp_path):
    """The estimate said 4.6 GiB where RSS passed 10.9 GB (issue 31): it left out the tokens and
    most of a layer's work. Measured here in a fresh process (VmHWM, the peak resident set, reset first)
    on ~3.7k tokens, where the document's own memory dwarfs the allocator's noise."""
    import json
    import subprocess
    import sys

    path, _ = llama
    script = tmp_path / "peak.py"
    script.write_text(PEAK)
    out = subprocess.run([sys.executable, str(script), str(path), SENTENCE, "60"], check=True,
                         capture_output=True, text=True, timeout=300,
                         env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["n"] > 3000
    per_text = got["estimate"] - FIRST_CALL_BYTES  # the process above has paid the first call
    assert got["peak"] <= per_text, got  # never under the truth (the old estimate was 0.7 × it)
    assert per_text <= 3 * got["peak"], got  # nor so far over that it refuses a text that fits


def test_one_heads_rows_are_every_heads_rows_for_that_head(llama, mistral):
    """weights(layer, head, rows) reads one head (h times less memory) and gives its rows of
    row_weights exactly, causal and windowed alike, with grouped key heads."""
    for path, _ in (llama, mistral):
        doc = document(qkv.load(path), SENTENCE * 3)
        rows = [0, 7, len(doc) - 1]
        every = doc.row_weights(2, rows)  # (h, r, N)
        for head in range(every.shape[0]):
            assert torch.equal(doc.weights(2, head, rows), every[head])
