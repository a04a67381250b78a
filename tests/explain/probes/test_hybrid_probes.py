"""The pattern probes on hybrid models: every layer ranked, a linear / SSM layer scored on the
absolute shares of its exact effective map (`qkv.explain.probes.effective`).

The reference for an effective layer is `attention_map` (the library's one answer for a layer's
map) on the same tokens; the probe's score is a mean of its rows' absolute shares, so the two
agree to float64 rounding of a mean over the probe's rows (a few ulp of 1).
"""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")  # the qkv[hf] extra
import torch  # noqa: E402
from rich.console import Console  # noqa: E402

import qkv  # noqa: E402
from hybrids import save_hybrid  # noqa: E402
from qkv.explain import attention_map  # noqa: E402
from qkv.explain.probes.effective import absolute_shares  # noqa: E402
from qkv.explain.probes.induction import INDUCTION_PATTERN, induction_probe, repeated_random_tokens  # noqa: E402
from qkv.explain.rendering.render_induction import render_head_scores  # noqa: E402


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3_5")
    save_hybrid("qwen3_5", path)
    return qkv.load(path)


def test_shares_are_the_weights_on_a_softmax_row_and_sum_to_one():
    w = torch.softmax(torch.randn(2, 5, 5, dtype=torch.float64), -1)
    assert torch.equal(absolute_shares(w), w / w.sum(-1, keepdim=True))
    M = torch.randn(3, 6, 6, dtype=torch.float64).tril()
    s = absolute_shares(M)
    assert (s >= 0).all() and torch.allclose(s.sum(-1), torch.ones(3, 6, dtype=torch.float64), atol=1e-15, rtol=0)


def _plain_seed(model, length: int) -> tuple[int, str]:
    """A seed whose random tokens, written as text, tokenise back to themselves (the word-level
    vocabulary's `[UNK]` would split): (seed, that text)."""
    for seed in range(100):
        ids = repeated_random_tokens(model, sequences=1, length=length, seed=seed)[0].tolist()
        text = " ".join(model.tokenizer.id_to_token(i) for i in ids)
        if model.tokenizer.encode(text).ids == ids:
            return seed, text
    raise AssertionError("no seed of 100 draws plain words")


def test_every_layer_is_ranked_and_a_linear_layer_is_its_effective_map(qwen):
    length = 4
    seed, text = _plain_seed(qwen, length)
    r = induction_probe(qwen, "induction", sequences=1, length=length, seed=seed)
    assert r.effective == (0, 2) and r.mixers == ("gated_deltanet", "softmax", "gated_deltanet", "softmax")
    assert {layer for layer, _, _ in r.ranked()} == {0, 1, 2, 3}  # no layer silently left out
    assert len(r.ranked()) == 16 and not torch.isnan(r.scores).any()
    for layer in (0, 2):
        for head in range(4):
            M = attention_map(qwen, text, layer=layer, head=head).weights  # (t, t) signed
            want = INDUCTION_PATTERN.scores(absolute_shares(M)[None, None], length)[0]
            assert abs(float(r.scores[layer, head]) - float(want)) <= 8 * torch.finfo(torch.float64).eps
    doc = r.to_dict()
    assert {h["mixer"] for h in doc["heads"]} == {"gated_deltanet", "softmax"}
    assert doc["effective"] == [0, 2]


def test_the_table_says_how_linear_layers_are_scored(qwen):
    out = Console(record=True, width=200)
    render_head_scores(out, induction_probe(qwen, "previous-token", sequences=1, length=3), top=16)
    text = out.export_text()
    assert "|M[i,k]| / Σ_j |M[i,j]|" in text and "gated_deltanet |M|" in text and "L0 H" in text


@pytest.mark.parametrize("name", ["diffllama", "nemotron_h", "falcon_h1"])
def test_what_is_scored_and_what_is_not_is_said(name, tmp_path):
    """A differential layer is scored on its signed map A₁ − λA₂; a feed-forward-only layer and a
    Mamba-2 beside attention are named as not scored — nothing is left out silently."""
    save_hybrid(name, tmp_path)
    r = induction_probe(qkv.load(tmp_path), "induction", sequences=1, length=3)
    layers = {layer for layer, _, _ in r.ranked()}
    said = {layer for layer, _ in r.unscored}
    if name == "diffllama":
        assert r.effective == (0, 1, 2, 3) and layers == {0, 1, 2, 3} and not said
    if name == "nemotron_h":  # layer 2: a feed-forward only
        assert layers == {0, 1, 3} and said == {2} and r.effective == (0, 3)
    if name == "falcon_h1":  # attention and Mamba-2 side by side in every layer
        assert layers == {0, 1, 2, 3} and said == {0, 1, 2, 3}
        assert all("mixer_map(…, layer=" in why for _, why in r.unscored)
