"""Sinks and spans over a whole document (qkv.explain.document_heads) against a float64 reference of
their definitions, on qkv's own decoders (the lm; the reader, past its window) and on a
transformers Mistral (a sliding window) run through qkv's attention."""

from __future__ import annotations

import os

import pytest
import torch

import qkv
from qkv.explain.long.document import document
from qkv.explain.long.document_heads import head_spans
from qkv.explain.maps import attention_maps
from qkv.errors import QkvError
from qkv.explain.wording import ArgumentError
from qkv.models.registry import data_dir

EPS32 = torch.finfo(torch.float32).eps


def spans_of(weights: torch.Tensor, first: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The definitions on dense weights (L, H, t, t), in float64: (sink, distance), each (L, H)."""
    w = weights.double()
    i = torch.arange(w.shape[-1], dtype=torch.float64)
    sink = w[..., :first].sum(-1).mean(-1)
    distance = (w * (i[:, None] - i[None, :])).sum(-1).mean(-1)
    return sink, distance


def check(model, model64, text: str, first: int) -> None:
    doc = document(model, text)
    got = head_spans(doc, first=first)
    ref_sink, ref_dist = spans_of(attention_maps(model64, text).weights, first)
    plain_sink, plain_dist = spans_of(attention_maps(model, text).weights, first)
    # Bound: twice the plain float32 path's error (the model's own softmax weights), plus what
    # reading the weights back as exp(s − lse) adds: lse is stored in float32, a relative error of
    # |lse| · eps32 / 2 on every weight, which moves S by at most that (the weights sum to 1) and
    # D by at most that times the largest distance, N − 1.
    lse = max(float(rec.lse.abs().max()) for rec in doc.layers)
    n = len(doc)
    for name, g, ref, plain, scale in (("sink", got.sink, ref_sink, plain_sink, 1.0),
                                       ("distance", got.distance, ref_dist, plain_dist, n - 1.0)):
        extra = lse * EPS32 * scale
        err = float((g - ref).abs().max())
        allowed = 2 * float((plain - ref).abs().max()) + extra + 2 * EPS32 * float(ref.abs().max())
        assert err <= allowed, (name, err, allowed)
    assert bool((got.rows == n).all())  # every row of a decoder sees itself


def test_the_lm_against_the_definition():
    text = "baka bela dima fona gisa baka bela dima fona gisa doma feta"
    check(qkv.load("lm"), qkv.load("lm", dtype=torch.float64), text, first=1)
    check(qkv.load("lm"), qkv.load("lm", dtype=torch.float64), text, first=3)


@pytest.mark.skipif(not os.path.isfile(os.path.join(data_dir("reader"), "config.json")), reason="no reader")
def test_the_reader_past_its_window():
    text = "The file is closed when the block ends, and the name still refers to it. " * 20
    reader = qkv.load("reader")
    assert len(reader.tokenizer.encode(text).ids) > 2 * reader.config.sliding_window
    check(reader, qkv.load("reader", dtype=torch.float64), text, first=1)
    spans = head_spans(document(reader, text))
    # a windowed head cannot look further back than its window
    assert float(spans.distance.max()) <= reader.config.sliding_window - 1


def test_a_transformers_mistral(tmp_path):
    pytest.importorskip("transformers")
    from hf_decoders import make_checkpoint

    path, _ = make_checkpoint(tmp_path, "MistralConfig", "MistralForCausalLM", hidden_size=32,
                              intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                              num_key_value_heads=2, sliding_window=8, max_position_embeddings=256)
    text = "The quick brown fox jumps over the lazy dog. Attention is all you need."
    model, model64 = qkv.load(path, via="hf"), qkv.load(path, via="hf", dtype=torch.float64)
    check(model, model64, text, first=2)


def test_first_must_be_a_token_count():
    doc = document(qkv.load("lm"), "baka bela dima")
    for bad in (0, 5, 1.5, True):
        with pytest.raises(ArgumentError, match="first must be a whole number of tokens in 1–4"):
            head_spans(doc, first=bad)
    assert head_spans(doc).ranked("distance")[0][2] >= head_spans(doc).ranked("distance")[-1][2]
    with pytest.raises(QkvError, match="metric must be one of sink, distance, got 'entropy'"):
        head_spans(doc).ranked("entropy")
