"""A model with NaN weights is refused where its numbers would be shown, naming the first layer
and head; ``--json`` writes nothing rather than half a document (issue 9, item 4)."""

import json

import pytest
import torch

import qkv
import qkv.cli.explain as cli_explain
from qkv.cli import main
from qkv.explain.finite import NonFiniteError, check_layers

TEXT = "the dog found the pizza and ate it"
FIRST = "all-MiniLM-L6-v2 computes NaN at layer 2, head 3"


@pytest.fixture(scope="module")
def broken():
    """MiniLM with one NaN in layer 2's query projection, inside head 3's rows (32 per head)."""
    model = qkv.load("minilm")
    with torch.no_grad():
        model.layers[2].self_attn.q_proj.weight[3 * 32 + 5, 7] = float("nan")
    return model


@pytest.fixture
def cli_on(broken, monkeypatch):
    monkeypatch.setattr(cli_explain, "load_model", lambda args: broken)


@pytest.mark.parametrize("argv", [
    ["explain", TEXT], ["explain", TEXT, "--json"], ["explain", TEXT, "--words", "--json"],
    ["explain", TEXT, "--layer", "4", "--head", "0", "--json"],
    # another head of the NaN's layer (a layer before it is answered exactly: the forward stops
    # after the layer asked for and never runs the broken one — issue 42)
    ["explain", TEXT, "--layer", "2", "--head", "0"],
    ["heads", TEXT, "--from", "it", "--to", "pizza", "--json"], ["heads", TEXT, "--to", "dog"],
    ["explain", TEXT, "--no-projection", "--json"],
])
def test_nan_is_named_never_shown(capsys, cli_on, argv):
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2 and out == "", out[:200]
    assert err.startswith(f"qkv: error: {FIRST}: its query projection (q_proj) is not finite") or \
        err.startswith("qkv: error: all-MiniLM-L6-v2 computes a non-finite number"), err
    assert err.count("\n") == 1


def test_the_library_raises_valueerror_naming_the_head(broken):
    with pytest.raises(ValueError, match=f"^{FIRST}"):
        qkv.explain.explain_head(broken, TEXT, token="it", layer=2, head=3)


def test_nan_embeddings_and_nan_after_attention_are_told_apart():
    model = qkv.load("minilm")
    with torch.no_grad():
        model.layers[1].feed_forward.fc2.bias[0] = float("inf")  # after layer 1's attention
    ids = torch.tensor([model.tokenizer.encode(TEXT).ids])
    out = model(ids, torch.ones_like(ids), trace_rows=slice(None), output_hidden_states=True)
    with pytest.raises(NonFiniteError, match="layer 1's attention heads are finite but the next "
                                             "layer's input holds"):
        check_layers(out.traces, model="m", output=out.hidden_states[-1])


@pytest.mark.parametrize("part, where", [
    # one token's embedding row, not the explained token's: the whole layer input is checked
    (lambda m, ids: m.embeddings.word.weight[ids[2]], "the embeddings hold NaN"),
    (lambda m, ids: m.layers[1].self_attn.q_proj.weight[40], "NaN at layer 1, head 1: its query projection \\(q_proj\\)"),
    (lambda m, ids: m.layers[1].self_attn.k_proj.weight[40], "NaN at layer 1, head 1: its key projection \\(k_proj\\)"),
    (lambda m, ids: m.layers[1].self_attn.v_proj.weight[40], "NaN at layer 1, head 1: its value projection \\(v_proj\\)"),
    (lambda m, ids: m.layers[1].self_attn.out_proj.weight[4], "layer 1's attention heads are finite but the next "
                                                              r"layer's input holds NaN \(its output projection"),
    (lambda m, ids: m.layers[1].feed_forward.fc2.bias, "layer 1's attention heads are finite but the next "
                                                       r"layer's input holds NaN \(its feed-forward\)"),
])
def test_nan_is_blamed_where_it_was_made(broken, part, where):
    import copy

    model = copy.deepcopy(broken)
    with torch.no_grad():
        model.layers[2].self_attn.q_proj.weight.nan_to_num_(0.0)  # the fixture's NaN mended
        part(model, model.tokenizer.encode(TEXT).ids).fill_(float("nan"))
    with pytest.raises(NonFiniteError, match=where):
        qkv.explain.explain(model, TEXT, token="it")


def test_json_is_whole_or_absent(capsys):
    from qkv.cli.output import print_json

    with pytest.raises(ValueError, match=r"non-finite number at \['a'\]\[1\]\['b'\]"):
        print_json({"a": [1, {"b": float("nan")}], "z": 2})
    assert capsys.readouterr().out == ""
    print_json({"a": [1, 2]})
    assert json.loads(capsys.readouterr().out) == {"a": [1, 2]}


@pytest.fixture
def broken_translation(monkeypatch):
    import copy
    import dataclasses

    import qkv.translate.checkpoint as checkpoint

    real = checkpoint.load_checkpoint

    def load(path, *a, **kw):
        ckpt = real(path, *a, **kw)
        model = copy.deepcopy(ckpt.model)
        with torch.no_grad():
            model.decoder.layers[1].cross_attn.q_proj.weight[0, 0] = float("nan")
        return dataclasses.replace(ckpt, model=model)

    monkeypatch.setattr(checkpoint, "load_checkpoint", load)


@pytest.mark.parametrize("argv", [["translate", "the cat is red"], ["translate", "--vocab"],
                                  ["evaluate", "--json"]])
def test_a_nan_translation_model_is_refused(capsys, broken_translation, argv):
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == ("qkv: error: translate's weights hold NaN "
                                 "(decoder.layers.1.cross_attn.q_proj.weight): the model was saved "
                                 "broken (e.g. trained with a NaN loss); its output would mean nothing\n")


def test_cross_attention_names_the_decoder_layer_and_head():
    from qkv.translate.checkpoint import load_checkpoint

    ckpt = load_checkpoint("translate")
    model = ckpt.model
    with torch.no_grad():
        saved = model.decoder.layers[1].cross_attn.q_proj.weight[0, 0].item()
        model.decoder.layers[1].cross_attn.q_proj.weight[0, 0] = float("nan")
    try:
        src = torch.tensor([ckpt.vocab.encode_en("the cat is red")])
        _, trace = model.trace(src, torch.tensor([[1, 5, 6]]))
        check_layers(trace.encoder, part="encoder ")
        with pytest.raises(NonFiniteError, match=r"at decoder layer 1, head 0: its cross-attention query projection \(q_proj\)"):
            check_layers(trace.decoder, part="decoder ")
    finally:
        with torch.no_grad():
            model.decoder.layers[1].cross_attn.q_proj.weight[0, 0] = saved


def test_a_layer_that_kept_only_its_weights_is_named_at_or_before():
    """`trace_rows=Weights` keeps a row's weights alone: a NaN reaching them is named at that
    layer "or before" (where it started was not recorded)."""
    from qkv.modules import LayerRows, Weights

    model = qkv.load("minilm")
    with torch.no_grad():
        model.layers[1].self_attn.q_proj.weight[40] = float("nan")  # head 1's rows
    ids = torch.tensor([model.tokenizer.encode(TEXT).ids])
    rows = torch.tensor([ids.shape[1] - 1])
    out = model(ids, torch.ones_like(ids), trace_rows=LayerRows(3, Weights(rows), earlier=True))
    with pytest.raises(NonFiniteError, match="NaN at layer 1 or before, head 1: its attention weights"):
        check_layers(out.traces, model="m")


def test_finite_numbers_whose_sum_overflows_are_finite():
    """A tensor is cleared by its sum first: one that overflows is checked entry by entry."""
    from qkv.explain.finite import _finite

    assert _finite(torch.full((4,), 3e38))  # float32: the sum is inf, every entry finite
    assert not _finite(torch.tensor([1.0, float("inf"), -float("inf")]))  # the sum is NaN
    assert not _finite(torch.tensor([float("nan"), 0.0]))
