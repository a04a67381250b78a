"""Issue 42: a transformers model's forward stops after the layer asked for (`LayerRows`), as
qkv's own stack does — its later layers and its head never run, only the records asked for are
kept, and the answers are the whole trace's.

A tiny Llama (through the adapter, `via="hf"`: its native family is the float64 truth and the
float32 peer) and a tiny Qwen3.5 hybrid (Gated DeltaNet layers 0 and 2, softmax 1 and 3).
`trace(…, last_layer=)` traces the same rows in the same layers as the whole trace, so its
records are the whole trace's bit for bit; a layer's map (`trace_layer`: the earlier layers
untraced, the layer's lse) differs from the whole trace's rows by rounding only, bounded as
tests/tolerance.py derives it.
"""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")  # the qkv[hf] extra
import torch  # noqa: E402

import qkv  # noqa: E402
import qkv.explain as E  # noqa: E402
import qkv.hf  # noqa: E402
from archs import DECODERS, build  # noqa: E402
from hybrids import save_hybrid  # noqa: E402
from qkv.explain.circuits import score  # noqa: E402
from qkv.explain.forward import row_weights, stops_at_layer, trace, trace_layer  # noqa: E402
from qkv.modules import LSE, LayerRows  # noqa: E402
from qkv.modules.writes import AtPositions  # noqa: E402
from test_adapter import TEXT, save_tokenizer  # noqa: E402
from tolerance import assert_within  # noqa: E402

HYBRID_TEXT = "the cat sat on the mat . a red apple"


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """(native float64 — the truth, native float32 — the plain peer, the adapter float32)."""
    path = tmp_path_factory.mktemp("llama")
    config, model, extra = DECODERS["llama"]
    build({"llama": (config, model, extra | dict(num_hidden_layers=4))}, "llama").save_pretrained(path)
    save_tokenizer(path, encoder=False)
    return qkv.load(path, dtype=torch.float64), qkv.load(path), qkv.load(path, via="hf")


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3_5")
    save_hybrid("qwen3_5", path)
    return qkv.load(path)


def _runs(model):
    """layer index → how many times its block ran, and the head's count under key "head"."""
    counts = {i: 0 for i in range(len(model.layers))} | {"head": 0}
    handles = [layer.block.register_forward_hook(lambda *a, i=i: counts.__setitem__(i, counts[i] + 1))
               for i, layer in enumerate(model.layers)]
    head = model.hf.get_output_embeddings()
    handles.append(head.register_forward_hook(lambda *a: counts.__setitem__("head", counts["head"] + 1)))
    return counts, handles


def _hooks(model) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.hf.modules())


def test_the_adapter_stops_where_its_layers_allow(llama, hybrid):
    ours = llama[2]
    assert all(stops_at_layer(ours, i) for i in range(len(ours.layers)))
    answers = [stops_at_layer(hybrid, i) for i in range(4)]
    assert [bool(a) for a in answers] == [False, True, False, True]
    assert "gated_deltanet" in answers[0].reason and "transformers' own code" in answers[0].reason
    assert row_weights(hybrid, torch.tensor([[5, 6, 7]]), torch.tensor([2])) is None  # a whole trace then


@pytest.mark.parametrize("which,layer", [("llama", 1), ("hybrid", 1), ("hybrid", 3)])
def test_a_stopped_trace_is_the_whole_trace_and_the_later_layers_never_run(llama, hybrid, which, layer):
    model = llama[2] if which == "llama" else hybrid
    text = TEXT if which == "llama" else HYBRID_TEXT
    rows = torch.tensor([2, 5])
    whole = trace(model, text, rows)
    counts, handles = _runs(model)
    try:
        stopped = trace(model, text, rows, last_layer=layer)
    finally:
        for h in handles:
            h.remove()
    assert [counts[i] for i in range(len(model.layers))] == [1] * (layer + 1) + [0] * (len(model.layers) - layer - 1)
    assert counts["head"] == 0
    assert len(stopped.traces) == layer + 1 and len(stopped.hidden_states) == layer + 2
    for i in range(layer + 1):
        assert torch.equal(stopped.hidden_states[i + 1], whole.hidden_states[i + 1])
        if model.layers[i].self_attn is not None:  # the same rows traced: the same numbers
            assert torch.equal(stopped.weights(i), whole.weights(i))
            assert torch.equal(stopped.traces[i].self_attn.heads, whole.traces[i].self_attn.heads)


@pytest.mark.parametrize("which,layer,head", [("llama", 2, 3), ("hybrid", 3, 1)])
def test_a_layers_map_stops_there_and_is_the_whole_traces(llama, hybrid, which, layer, head):
    """The stopped map (earlier layers untraced, the layer's lse) against the whole trace's rows:
    both float32 computations of one map, each within the bound of the other's rounding — the
    float64 native model is the truth for Llama; for the hybrid (no native family) the two are
    held to each other within twice the float32 rounding of a softmax row over s keys."""
    model = llama[2] if which == "llama" else hybrid
    text = TEXT if which == "llama" else HYBRID_TEXT
    counts, handles = _runs(model)
    try:
        got = E.attention_map(model, text, layer=layer, head=head).weights  # (t, t)
        (rec,) = trace_layer(model, text, layer)
    finally:
        for h in handles:
            h.remove()
    assert [counts[i] for i in range(len(model.layers))] == \
        [2] * (layer + 1) + [0] * (len(model.layers) - layer - 1) and counts["head"] == 0
    whole = trace(model, text, slice(None)).weights(layer)[head]  # (t, t)
    if which == "llama":
        truth, native = (E.attention_map(m, text, layer=layer, head=head).weights for m in llama[:2])
        assert_within(got, truth, native, what="stopped map")
        assert_within(whole, truth, native, what="whole trace's map")
    else:
        s = whole.shape[-1]
        tol = 2 * (s + 1) * torch.finfo(torch.float32).eps
        assert float((got - whole).abs().max()) <= tol
    assert rec.layer == layer and tuple(rec.record.query.shape[2:3]) == (whole.shape[0],)


def test_row_weights_stop_with_the_whole_traces_numbers(llama):
    ours = llama[2]
    ids = torch.tensor([ours.tokenizer.encode(TEXT).ids])
    rows = torch.tensor([3, ids.shape[1] - 1])
    got = row_weights(ours, ids, rows)
    whole = trace(ours, TEXT, rows)
    assert len(got) == len(ours.layers)
    for i, w in enumerate(got):
        assert torch.equal(w, whole.weights(i))


def test_a_score_attribution_keeps_two_positions_of_each_earlier_layer(llama):
    truth, native, ours = llama
    ids = torch.tensor([ours.tokenizer.encode(TEXT).ids])
    with torch.no_grad():
        fwd = score._forward(ours, ids, torch.tensor([9]), 2, torch.tensor([9, 4]))
    assert len(fwd.traces) == 3 and len(fwd.hidden_states) == 3  # stopped after layer 2's attention
    for i in range(2):
        assert isinstance(fwd.hidden_states[i], AtPositions)
        assert isinstance(fwd.traces[i].self_attn.heads, AtPositions)
        assert fwd.traces[i].residual.values.shape[1] == 2
    got = [E.score_attribution(m, TEXT, layer=2, head=1, token=9, key=4) for m in llama]
    assert got[2].query_components == got[1].query_components
    assert_within(got[2].terms, got[0].terms, got[1].terms, what="score terms")
    assert abs(float(got[2].terms.sum()) - got[2].score) <= got[2].bound


@pytest.mark.parametrize("which", ["llama", "hybrid"])
@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_after_an_error_inside_a_stopped_forward_a_plain_forward_runs(llama, hybrid, which, error):
    model = llama[2] if which == "llama" else hybrid
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    with torch.no_grad():
        before = model(ids).logits
    hooks = _hooks(model)

    def fail(*args):
        raise error("inside the forward")

    handle = model.layers[1].block.register_forward_pre_hook(fail)
    try:
        with pytest.raises(error), torch.no_grad():
            model(ids, torch.ones_like(ids), trace_rows=LayerRows(3, LSE), output_hidden_states=True)
    finally:
        handle.remove()
    assert _hooks(model) == hooks  # none of the stopped forward's hooks left behind
    with torch.no_grad():
        after = model(ids, trace_rows=torch.tensor([2]))
    assert torch.equal(after.logits[0, :2], before[0, :2]) and after.logits.shape == before.shape
    assert len(after.traces) == len(model.layers)
