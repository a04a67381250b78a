"""``qkv explain TEXT --model <translation model>``: the cross-attention it shows is the model's own."""

from __future__ import annotations

import json

import pytest
import torch

import qkv
from qkv.cli import main
from qkv.explain import cross_attention, cross_attention_head
from qkv.translate.checkpoint import default_model_dir, load_checkpoint
from qkv.translate.gold import grammar_gold
from qkv.translate.decode import greedy_decode
from qkv.translate.vocab import BOS_ID, EOS_ID

SENTENCE = "the red apple is next to the black cats"
MODEL = str(default_model_dir())


GOLD = grammar_gold(SENTENCE)


@pytest.fixture(scope="module")
def ckpt():
    return load_checkpoint(MODEL)


@pytest.fixture(scope="module")
def model():
    return qkv.load("translate")


def test_qkv_load_gives_the_translation_model_described_by_capabilities(model, ckpt):
    assert model.capabilities.cross_attention and not model.capabilities.self_attention
    assert model.name == "translate (shipped)" and model.vocab is not None
    for (name, a), (_, b) in zip(model.state_dict().items(), ckpt.model.state_dict().items()):
        assert torch.equal(a, b), name
    ca = cross_attention(model, SENTENCE, gold=GOLD)
    assert ca.translation == "la pomme rouge est à côté des chats noirs" and ca.gold is not None


def test_a_self_attention_model_is_refused_naming_the_argument():
    with pytest.raises(ValueError, match="^model 'qkv-lm' has no cross-attention"):
        cross_attention(qkv.load("lm"), SENTENCE)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["explain", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def model_cross_weights(ckpt, text: str) -> torch.Tensor:
    """Independently: translate, run the model's forward over its output, stack the weights."""
    src = torch.tensor([ckpt.vocab.encode_en(text)])
    gen = greedy_decode(ckpt.model, src)[0].tolist()
    gen = gen[: gen.index(EOS_ID) + 1]
    with torch.no_grad():
        _, trace = ckpt.model.trace(src, torch.tensor([[BOS_ID] + gen[:-1]]))
    return torch.stack([t.cross_attn.attention.weights[0] for t in trace.decoder])  # (L, H, t, s)


def test_json_weights_are_the_models_cross_attention(capsys, ckpt):
    code, out, _ = run(capsys, SENTENCE, "--model", MODEL, "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["translation"] == "la pomme rouge est à côté des chats noirs"
    assert doc["english"] == SENTENCE.split() + ["[EOS]"]
    assert doc["french"][-1] == "[EOS]" and len(doc["french"]) == 10
    weights = torch.tensor(doc["weights"])  # (L, H, t, s)
    assert torch.equal(weights, model_cross_weights(ckpt, SENTENCE))
    # The gold alignment is the grammar's, and each head's count is re-derivable from the weights.
    assert doc["gold"][6] == [5, 6]  # "des" ← "to" + "the"
    for head in doc["heads"]:
        argmax = weights[head["layer"], head["head"]].argmax(-1)
        hits = sum(int(argmax[j]) in g for j, g in enumerate(doc["gold"]))
        assert head["aligned"] == hits and head["argmax"] == argmax.tolist()


def test_steps_json_recomputes_the_head_in_float64(capsys, ckpt):
    code, out, _ = run(capsys, SENTENCE, "--model", MODEL, "--layer", "2", "--head", "1",
                       "--token", "rouge", "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["french_token"] == "rouge" and doc["french_index"] == 2 and doc["gold"] == [1]
    model_row = model_cross_weights(ckpt, SENTENCE)[2, 1, 2]
    torch.testing.assert_close(torch.tensor(doc["weights"], dtype=torch.float64), model_row.double(),
                               rtol=0, atol=1e-5)
    assert doc["max_abs_diff"] < 1e-4 and abs(doc["weights_sum"] - 1) < 1e-12
    # q·k_i / √d is what the softmax saw.
    q, k = torch.tensor(doc["query"]), torch.tensor(doc["keys"])
    torch.testing.assert_close(torch.tensor(doc["scaled"]), (k @ q) * doc["scale"])


def test_text_overview_and_token_view(capsys):
    code, out, _ = run(capsys, SENTENCE, "--model", MODEL)
    assert code == 0
    assert "English: 0:the 1:red 2:apple" in out and "aligned" in out and "best aligned head" in out
    code, out, _ = run(capsys, SENTENCE, "--model", MODEL, "--token", "chats", "--layer", "1")
    assert code == 0 and "French token 7 'chats'" in out and "L1 H0" in out and "L0 H0" not in out


def test_png_overview_and_single_head(capsys, tmp_path):
    for argv, name in (([], "all.png"), (["--layer", "0", "--head", "2"], "head.png")):
        path = tmp_path / name
        code, _, err = run(capsys, SENTENCE, "--model", MODEL, "--png", str(path), *argv)
        assert code == 0 and f"wrote {path}" in err
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp left


def test_gold_is_absent_for_text_outside_the_grammar(ckpt):
    ca = cross_attention(ckpt, "the cat the dog", gold=grammar_gold("the cat the dog"))
    assert ca.gold is None and "not a sentence of the grammar" in ca.gold_note
    assert ca.alignment() is None
    ca = cross_attention(ckpt, SENTENCE)  # no gold given: none used
    assert ca.gold is None and ca.gold_note is None


def test_gold_for_another_translation_is_not_used(ckpt):
    french, links = GOLD
    ca = cross_attention(ckpt, SENTENCE, gold=(["le", *french[1:]], links))
    assert ca.gold is None and "differs from the gold's" in ca.gold_note


@pytest.mark.parametrize(("argv", "message"), [
    (["--layer", "3", "--head", "0"], "--layer 3 is out of range: the decoder has 3 layers (0–2)"),
    (["--layer", "0", "--head", "4"], "--head 4 is out of range: each layer has 4 heads (0–3)"),
    (["--token", "zebre"], "--token 'zebre' is not a token of the text"),
    (["--to", "cat"], "--to and --no-projection are for self-attention models"),
])
def test_bad_options(capsys, argv, message):
    code, _, err = run(capsys, SENTENCE, "--model", MODEL, *argv)
    assert code == 2 and err.startswith(f"qkv: error: {message}"), err


def test_unknown_words(capsys):
    code, _, err = run(capsys, "the zebra is red", "--model", MODEL)
    assert code == 2 and "unknown English word 'zebra'" in err


def test_library_results_are_what_the_cli_prints(capsys, ckpt):
    """to_dict() is JSON without NaN/inf and equals ``--json``; a checkpoint or its name works."""
    for argv, result in (
        ([], cross_attention(ckpt, SENTENCE, gold=GOLD)),
        (["--token", "chats", "--layer", "1", "--top", "2"],
         cross_attention("translate", SENTENCE, token="chats", layer=1, top=2, gold=GOLD)),
        (["--layer", "2", "--head", "1", "--token", "rouge"],
         cross_attention_head(ckpt, SENTENCE, token="rouge", layer=2, head=1, gold=GOLD)),
    ):
        code, out, _ = run(capsys, SENTENCE, "--model", MODEL, "--json", *argv)
        assert code == 0
        assert json.loads(json.dumps(result.to_dict(), allow_nan=False)) == json.loads(out)
    ca = cross_attention(ckpt, SENTENCE, token="chats", layer=1, top=2)
    assert ca.token == 7 and ca.layers == (1,) and ca.model == "translate (shipped)"
    assert [len(ca.top_weights(1, h, 7)) for h in range(4)] == [2] * 4


def test_the_head_is_the_decoders_own(ckpt):
    cs = cross_attention_head(ckpt, SENTENCE, token="rouge", layer=2, head=1, gold=GOLD)
    assert cs.french_index == 2 and cs.gold == (1,) and cs.steps.tokens == cs.attention.english
    torch.testing.assert_close(cs.steps.weights, model_cross_weights(ckpt, SENTENCE)[2, 1, 2].double(),
                               rtol=0, atol=1e-5)
    assert "position 2 reads 'pomme' and produces 'rouge'" in cs.x_source
    default = cross_attention_head(ckpt, SENTENCE, layer=0, head=0)  # the last French word
    assert default.attention.french[default.french_index] == "noirs"


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(layer=3), "layer 3 is out of range: the decoder has 3 layers (0–2)"),
    (dict(token="zebre"), "token 'zebre' is not a token of the text"),
    (dict(top=0), "top must be at least 1, got 0"),
])
def test_library_errors_name_the_arguments(ckpt, kwargs, message):
    with pytest.raises(ValueError) as e:
        cross_attention(ckpt, SENTENCE, **kwargs)
    assert str(e.value).startswith(message), str(e.value)
    with pytest.raises(ValueError, match="^head 4 is out of range: each layer has 4 heads"):
        cross_attention_head(ckpt, SENTENCE, layer=0, head=4)
