"""``qkv explain TEXT --model <translation model>``: the cross-attention it shows is the model's own."""

from __future__ import annotations

import json

import pytest
import torch
from tolerance import bound, softmax_sum_tolerance, twin

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


def torch_attention(att, dtype: torch.dtype) -> torch.nn.MultiheadAttention:
    """A qkv MultiHeadAttention's weights in torch.nn.MultiheadAttention (the peer), in ``dtype``."""
    E = att.q_proj.weight.shape[1]
    peer = torch.nn.MultiheadAttention(E, att.num_heads, batch_first=True, dtype=dtype)
    with torch.no_grad():
        peer.in_proj_weight.copy_(torch.cat([att.q_proj.weight, att.k_proj.weight, att.v_proj.weight]))
        peer.in_proj_bias.copy_(torch.cat([att.q_proj.bias, att.k_proj.bias, att.v_proj.bias]))
        peer.out_proj.weight.copy_(att.out_proj.weight)
        peer.out_proj.bias.copy_(att.out_proj.bias)
    return peer


def peer_cross_weights(ckpt, src: torch.Tensor, tgt: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(L, H, t, s) cross-attention weights with every attention run by torch.nn.MultiheadAttention
    (qkv's embeddings, norms and feed-forwards, in ``dtype``): the shipped model is post-norm,
    x = norm(x + block(x)) for each block, the decoder's self-attention causal."""
    model = twin(ckpt.model, dtype)
    def post_norm(x, norm, y):
        return norm(x + y)
    with torch.no_grad():
        x = model.embed(model.src_embed, src)  # (1, s, E); one sentence: no padding
        for layer in model.encoder.layers:
            sa = torch_attention(layer.self_attn, dtype)
            x = post_norm(x, layer.norm1, sa(x, x, x, need_weights=False)[0])
            x = post_norm(x, layer.norm3, layer.feed_forward(x))
        memory, y, weights = x, model.embed(model.tgt_embed, tgt), []
        t = tgt.shape[1]
        causal = torch.ones(t, t, dtype=torch.bool).triu(1)  # True: may not attend
        for layer in model.decoder.layers:
            sa, ca = torch_attention(layer.self_attn, dtype), torch_attention(layer.cross_attn, dtype)
            y = post_norm(y, layer.norm1, sa(y, y, y, attn_mask=causal, need_weights=False)[0])
            out, w = ca(y, memory, memory, need_weights=True, average_attn_weights=False)
            weights.append(w[0])  # (H, t, s)
            y = post_norm(y, layer.norm2, out)
            y = post_norm(y, layer.norm3, layer.feed_forward(y))
    return torch.stack(weights).double()  # (L, H, t, s)


def model_cross_weights(ckpt, text: str) -> tuple[torch.Tensor, float]:
    """Independently of qkv.explain.cross: the French the model produces (greedy decoding), then
    (torch's float64 cross-attention weights over it, the derived bound on qkv's float32 ones:
    2 × torch's own float32 error + 2 ulp)."""
    src = torch.tensor([ckpt.vocab.encode_en(text)])
    gen = greedy_decode(ckpt.model, src)[0].tolist()
    gen = gen[: gen.index(EOS_ID) + 1]
    tgt = torch.tensor([[BOS_ID] + gen[:-1]])
    ref = peer_cross_weights(ckpt, src, tgt, torch.float64)
    return ref, bound(ref, peer_cross_weights(ckpt, src, tgt, torch.float32), dtype=torch.float32)


def test_json_weights_are_the_models_cross_attention(capsys, ckpt):
    code, out, _ = run(capsys, SENTENCE, "--model", MODEL, "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["translation"] == "la pomme rouge est à côté des chats noirs"
    assert doc["source"] == SENTENCE.split() + ["[EOS]"]
    assert doc["target"][-1] == "[EOS]" and len(doc["target"]) == 10
    weights = torch.tensor(doc["weights"], dtype=torch.float64)  # (L, H, t, s)
    ref, tol = model_cross_weights(ckpt, SENTENCE)
    torch.testing.assert_close(weights, ref, atol=tol, rtol=0)
    # The gold alignment is the model's own (its grammar's), and each head's count is re-derivable from the weights.
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
    assert doc["target_token"] == "rouge" and doc["target_index"] == 2 and doc["gold"] == [1]
    ref, tol = model_cross_weights(ckpt, SENTENCE)
    torch.testing.assert_close(torch.tensor(doc["weights"], dtype=torch.float64), ref[2, 1, 2],
                               rtol=0, atol=tol)
    # the float64 redo's output against torch's float64 cross-attention of the same query:
    q, k, v = (torch.tensor(doc[n], dtype=torch.float64) for n in ("query", "keys", "values"))
    w = torch.softmax(k @ q * doc["scale"], -1)
    torch.testing.assert_close(torch.tensor(doc["output"], dtype=torch.float64), w @ v)
    assert abs(doc["weights_sum"] - 1) <= softmax_sum_tolerance(len(doc["source"]), torch.float64)
    # q·k_i / √d is what the softmax saw.
    q, k = torch.tensor(doc["query"]), torch.tensor(doc["keys"])
    torch.testing.assert_close(torch.tensor(doc["scaled"]), (k @ q) * doc["scale"])


def test_text_overview_and_token_view(capsys):
    code, out, _ = run(capsys, SENTENCE, "--model", MODEL)
    assert code == 0
    assert "source: 0:the 1:red 2:apple" in out and "aligned" in out and "best aligned head" in out
    assert "9/9 target words on a gold source token" in out
    code, out, _ = run(capsys, SENTENCE, "--model", MODEL, "--token", "chats", "--layer", "1")
    assert code == 0 and "target token 7 'chats'" in out and "L1 H0" in out and "L0 H0" not in out


def test_png_overview_and_single_head(capsys, tmp_path):
    for argv, name in (([], "all.png"), (["--layer", "0", "--head", "2"], "head.png")):
        path = tmp_path / name
        code, _, err = run(capsys, SENTENCE, "--model", MODEL, "--png", str(path), *argv)
        assert code == 0 and f"wrote {path}" in err
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp left


def test_the_gold_alignment_is_the_models_own(model, ckpt):
    """The translation model provides its grammar's gold alignment (the protocol's
    ``gold_alignment``); the caller's gold replaces it, a string turns it off."""
    assert model.gold_alignment(SENTENCE) == GOLD
    ca = cross_attention(ckpt, SENTENCE)
    assert ca.gold == GOLD[1] and ca.gold_note is None and ca.alignment()[1, 0] == 9
    ca = cross_attention(ckpt, "the cat the dog")
    assert ca.gold is None and "not a sentence of the grammar" in ca.gold_note
    assert ca.alignment() is None
    ca = cross_attention(ckpt, SENTENCE, gold="no gold, please")
    assert ca.gold is None and ca.gold_note == "no gold, please"


def test_gold_for_another_translation_is_not_used(ckpt):
    french, links = GOLD
    ca = cross_attention(ckpt, SENTENCE, gold=(["le", *french[1:]], links))
    assert ca.gold is None and "differs from the gold's" in ca.gold_note


@pytest.mark.parametrize(("argv", "message"), [
    (["--layer", "3", "--head", "0"], "--layer 3 is out of range: the decoder has 3 layers (0–2)"),
    (["--layer", "0", "--head", "4"], "--head 4 is out of range: each layer has 4 heads (0–3)"),
    (["--token", "zebre"], "--token 'zebre' is not a token of the text"),
    (["--to", "cat"], "--to, --words and --no-projection are for self-attention models"),
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
    assert cs.target_index == 2 and cs.gold == (1,) and cs.steps.tokens == cs.attention.source
    ref, tol = model_cross_weights(ckpt, SENTENCE)
    torch.testing.assert_close(cs.steps.weights, ref[2, 1, 2], rtol=0, atol=tol)
    assert "position 2 reads 'pomme' and produces 'rouge'" in cs.x_source
    default = cross_attention_head(ckpt, SENTENCE, layer=0, head=0)  # the last target word
    assert default.attention.target[default.target_index] == "noirs" and default.gold == (7,)  # ← "black"


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
