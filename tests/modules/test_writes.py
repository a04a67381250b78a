"""`trace_rows=Writes(positions)`: a layer records what it wrote at those positions only — the
heads' outputs and the residual exactly as a full trace holds them there — and a score
attribution's forward keeps O(layers × positions) numbers of its earlier layers.

Tolerances: `torch.equal` — the record is the forward's own tensors, indexed.
"""

from __future__ import annotations

import doctest

import pytest
import torch

import qkv
import qkv.modules.writes
from qkv.explain import score_attribution
from qkv.explain.circuits import score
from qkv.explain.finite import NonFiniteError
from qkv.models.llama import LlamaConfig, LlamaModel
from qkv.models.tokenizer import Tokenizer
from qkv.modules import AtPositions, LayerRows, Writes, WritesTrace

TEXT = "baka bela dima fona baka bela dima fona kuru lipa moto"


def test_doctests():
    assert doctest.testmod(qkv.modules.writes).failed == 0


@pytest.fixture(scope="module")
def gqa():
    """A small GQA llama (4 layers, 8 query heads over 2 kv heads) on the lm's tokenizer."""
    lm = qkv.load("lm")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=lm.config.vocab_size, hidden_size=64, intermediate_size=96,
                         num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                         max_position_embeddings=256)
    tokenizer = Tokenizer(lm.tokenizer._tok, name="llama-gqa", max_length=256)
    return LlamaModel(config, tokenizer=tokenizer, name="llama-gqa (random)").double().eval()


def _ids(model, text=TEXT):
    return torch.tensor([model.tokenizer.encode(text).ids])


def test_writes_are_the_full_traces_rows(gqa):
    ids = _ids(gqa)
    keep = torch.tensor([6, 2])
    last = torch.tensor([ids.shape[1] - 1])  # traced: rows 2 and 6 (causal) never read its change
    with torch.no_grad():
        full = gqa(ids, torch.ones_like(ids), trace_rows=LayerRows(2, last, earlier=True),
                   output_hidden_states=True)
        lean = gqa(ids, torch.ones_like(ids), trace_rows=LayerRows(2, last, earlier=Writes(keep)),
                   output_hidden_states=True)
    for ell in range(2):
        rec = lean.traces[ell]
        assert isinstance(rec.self_attn, WritesTrace) and isinstance(rec.residual, AtPositions)
        assert rec.self_attn.heads.positions.tolist() == [2, 6]  # sorted, once each
        assert torch.equal(rec.self_attn.heads[0, keep], full.traces[ell].self_attn.heads[0, keep])
        assert torch.equal(rec.residual[0, keep], full.traces[ell].residual[0, keep])


def test_a_position_not_kept_is_named():
    rows = Writes(torch.tensor([3, 1])).keep(torch.randn(1, 5, 2))
    with pytest.raises(ValueError, match=r"positions \[2\] are not all among those kept \(\[1, 3\]\)"):
        rows[0, torch.tensor([2])]


def _earlier_numbers(fwd, layer: int) -> int:
    """Numbers held by the records of the layers before `layer`, and by what entered them."""
    n = 0
    for trace, entering in zip(fwd.traces[:layer], fwd.hidden_states[:layer]):
        n += trace.self_attn.heads.values.numel() + trace.residual.values.numel() + entering.values.numel()
    return n


@pytest.mark.parametrize("length", [12, 40])
def test_an_attribution_keeps_two_positions_of_each_earlier_layer(gqa, length):
    """O(layers × positions kept): the earlier layers' records do not grow with the text."""
    text = " ".join(TEXT.split() * 8)
    ids = _ids(gqa, text)[:, :length]
    with torch.no_grad():
        fwd = score._forward(gqa, ids, torch.tensor([length - 1]), 3, torch.tensor([length - 1, 1]))
    E, hd = 64, 64  # residual width, heads' width (8 × 8)
    assert _earlier_numbers(fwd, 3) == 3 * 2 * (E + hd + E)


def test_the_gqa_attribution_sums_to_the_score(gqa):
    a = score_attribution(gqa, TEXT, layer=3, head=5, token=9, key=2)
    assert abs(float(a.terms.sum()) - a.score) <= a.bound
    row = score_attribution(gqa, TEXT, layer=3, head=5, token=9)
    assert abs(float(row.terms[2].sum()) - a.score) <= max(a.bound, row.bound)


@pytest.mark.parametrize("layer", [1, 3])
def test_a_nan_is_named_where_it_was_made(gqa, layer):
    broken = LlamaModel(gqa.config, tokenizer=gqa.tokenizer, name="broken").double().eval()
    broken.load_state_dict(gqa.state_dict())
    with torch.no_grad():
        broken.layers[layer].self_attn.v_proj.weight[0, 0] = float("nan")
    with pytest.raises(NonFiniteError, match=f"layer {layer}, head 0: its value"):
        score_attribution(broken, TEXT, layer=3, head=0, token=9, key=2)
