"""The head atlas (qkv.explain.atlas) against float64 references of its definitions, computed from
every window's whole attention maps, on the shipped lm and a tiny transformers Llama."""

from __future__ import annotations

import json

import pytest
import torch

import qkv
from qkv.explain.probes import induction
from qkv.explain.probes.atlas import METRICS, Atlas, atlas
from qkv.explain.probes.retrieval import retrieval_probe
from qkv.explain.wording import ArgumentError

EPS32 = torch.finfo(torch.float32).eps


def reference(model64, text: str, window: int, first: int):
    """{metric: (L, H)} by the definitions over the windows' dense float64 maps."""
    enc = model64.tokenizer.encode(text, max_length=1 << 30)
    ids = [i for i, s in zip(enc.ids, enc.special) if not s]
    prefix = induction.prefix_ids(model64)
    step = window - len(prefix)
    sums = {m: 0 for m in ("ind", "ind_n", "prev", "prev_n", "ent", "sink", "dist", "rows")}
    for start in range(0, len(ids), step):
        x = torch.tensor([prefix + ids[start:start + step]])
        with torch.no_grad():
            out = model64(x, torch.ones_like(x), trace_rows=slice(None))
        w = torch.stack([tr.self_attn.attention.weights[0] for tr in out.traces])  # (L, H, n, n)
        n = x.shape[1]
        i = torch.arange(n, dtype=torch.float64)
        ent = -(w * torch.where(w > 0, w.log2(), torch.zeros_like(w))).sum(-1)  # (L, H, n)
        sums["ent"] = sums["ent"] + ent.sum(-1)
        sums["sink"] = sums["sink"] + w[..., :first].sum(-1).sum(-1)
        sums["dist"] = sums["dist"] + (w * (i[:, None] - i[None, :])).sum(-1).sum(-1)
        sums["rows"] += n
        sums["prev"] = sums["prev"] + sum(w[..., q, q - 1] for q in range(1, n))
        sums["prev_n"] += n - 1
        toks = x[0].tolist()
        for q in range(n):
            earlier = [p for p in range(q - 1) if toks[p] == toks[q]]
            if earlier:
                sums["ind"] = sums["ind"] + w[..., q, earlier[-1] + 1]
                sums["ind_n"] += 1
    return {"induction": sums["ind"] / sums["ind_n"], "previous-token": sums["prev"] / sums["prev_n"],
            "sink": sums["sink"] / sums["rows"], "distance": sums["dist"] / sums["rows"],
            "entropy": sums["ent"] / sums["rows"]}


def check(model, model64, text: str, window: int, first: int = 1):
    got = atlas(model, text, window=window, first=first, retrieval_samples=2, rows_per_chunk=7)
    ref = reference(model64, text, window, first)
    # float32 weights w(1 + δ), |δ| ≲ a few eps: a mean of weights moves by ~eps, a distance by
    # eps · window, an entropy by eps · (log2 window + 1.5) per row
    bounds = {"induction": 1, "previous-token": 1, "sink": 1, "distance": window,
              "entropy": torch.log2(torch.tensor(float(window))).item() + 2}
    for name, scale in bounds.items():
        err = float((got.metrics[name] - ref[name]).abs().max())
        assert err <= 64 * EPS32 * scale, (name, err)
    assert torch.equal(got.metrics["retrieval"], retrieval_probe(
        model, samples=2, haystack=[i for i, s in zip(*(lambda e: (e.ids, e.special))(
            model.tokenizer.encode(text, max_length=1 << 30))) if not s]).scores)
    return got


def test_the_lm_against_the_definitions():
    text = "baka bela dima fona gisa doma feta " * 12
    got = check(qkv.load("lm"), qkv.load("lm", dtype=torch.float64), text, window=37, first=2)
    assert got.windows == 3 and set(got.metrics) == set(METRICS)
    # the lm's previous-token head (L0 H1) reads as one, and its top contexts look one back
    assert float(got.metrics["previous-token"][0, 1]) > 0.5
    assert all(c.query - c.key == 1 for c in got.contexts[0][1])
    d = got.to_dict()
    assert len(d["heads"]) == 4 and len(d["heads"][0]["contexts"]) == 3
    # read back from its JSON (qkv atlas --json → qkv view's /atlas): the same atlas
    back = Atlas.from_dict(json.loads(json.dumps(d)))
    assert back.to_dict() == d and back.contexts == got.contexts
    assert all(torch.equal(back.metrics[m], got.metrics[m]) for m in METRICS)


def test_a_transformers_llama(tmp_path):
    pytest.importorskip("transformers")
    from hf_decoders import make_checkpoint

    path, _ = make_checkpoint(tmp_path, "LlamaConfig", "LlamaForCausalLM", hidden_size=32,
                              intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                              num_key_value_heads=2, max_position_embeddings=256)
    text = "The quick brown fox jumps over the lazy dog. Attention is all you need. " * 3
    check(qkv.load(path, via="hf"), qkv.load(path, via="hf", dtype=torch.float64), text, window=29)


@pytest.mark.parametrize("kw, match", [
    (dict(window=66), "window must be a whole number of tokens in 3–65, got 66"),
    (dict(first=40), "first must be a whole number of tokens in 1–39"),
    (dict(contexts=-1), "contexts must be a whole number in 0–100"),
])
def test_bad_arguments(kw, match):
    with pytest.raises(ArgumentError, match=match):
        atlas(qkv.load("lm"), "baka bela", **(dict(window=40) | kw))


@pytest.mark.skipif(not __import__("os").path.isfile(__import__("os").path.join(
    __import__("qkv.models.registry", fromlist=["data_dir"]).data_dir("reader"), "config.json")),
    reason="no reader")
def test_the_reader_past_its_window():
    reader = qkv.load("reader")
    text = "The file is closed when the block ends, and the name still refers to it. " * 14
    got = check(reader, qkv.load("reader", dtype=torch.float64), text,
                window=reader.config.sliding_window + 37)
    # a windowed head looks no further back than its window
    assert float(got.metrics["distance"].max()) <= reader.config.sliding_window - 1
