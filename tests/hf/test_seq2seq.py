"""Encoder-decoders from transformers behind qkv's protocol (qkv.hf.seq2seq): attention_maps'
``.cross`` teacher-forced exactly as transformers' ``labels`` are, cross_attention, qkv translate,
qkv explain and the viewer's export, and each bad input refused by name.

The truth is transformers' eager attention in float64 on the same ids, ``labels=`` given to its
own forward (it shifts them); float32 eager is the plain peer (tolerance.py). ``cross_pass``'s
weights are the traced rows' (qkv.hf.trace: the reference path, 1.0× the plain error on all five
here); ``output_attentions`` ones are exp(scaled score − lse) with the lse of torch's fused CPU
kernel, so they carry that kernel's rounding: ``FUSED_FACTOR`` times the plain error (BART's
cross weights: 2.1× seen on this CPU), the bound every comparison here allows.
"""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("transformers")  # the qkv[hf] extra
import torch  # noqa: E402

import qkv  # noqa: E402
from qkv.errors import QkvError  # noqa: E402
from qkv.explain import attention_maps, cross_attention  # noqa: E402
from qkv.explain.wording import ArgumentError  # noqa: E402
from seq2seq_dirs import eager_pair, save  # noqa: E402
from tolerance import FUSED_FACTOR, assert_within  # noqa: E402

NAMES = ["bart", "m2m_100", "marian", "mbart", "t5"]
SOURCE = "the cat sat on the mat"
TARGET = "le chat est assis sur le tapis"
GRAMMAR_SENTENCE = "the red apple is next to the black cats"  # one the toy grammar aligns


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("seq2seq")
    return {name: save(root, name) for name in NAMES}


def eager_weights(model, **inputs):
    with torch.no_grad():
        out = model(**inputs, output_attentions=True, use_cache=False)
    return {f: torch.stack([w[0] for w in getattr(out, f)])  # (L, H, ·, ·)
            for f in ("cross_attentions", "encoder_attentions", "decoder_attentions")}


@pytest.mark.parametrize("name", NAMES)
def test_maps_cross_equals_eager_on_labels(dirs, name):
    path, eager = dirs[name]
    model = qkv.load(path)
    assert model.capabilities.cross_attention and not model.capabilities.self_attention
    tok = model.tokenizer
    src = torch.tensor([tok(SOURCE)["input_ids"]])
    labels = torch.tensor([tok(text_target=TARGET)["input_ids"]])  # (1, t), EOS last
    maps = attention_maps(model, SOURCE, target=TARGET)

    assert maps.target_units.labels == tok.convert_ids_to_tokens(labels[0].tolist())
    assert maps.target_units.labels[-1] == tok.eos_token
    t, s = labels.shape[1], src.shape[1]
    L, H = model.cross_shape
    assert maps.cross.shape == (L, H, t, s) and maps.decoder.shape == (L, H, t, t)
    truth, plain = (eager_weights(m, input_ids=src, labels=labels) for m in eager_pair(eager))
    for ours, field in ((maps.cross, "cross_attentions"), (maps.weights, "encoder_attentions"),
                        (maps.decoder, "decoder_attentions")):
        assert_within(ours, truth[field], plain[field], factor=FUSED_FACTOR, what=field)


@pytest.mark.parametrize("name", ["bart", "marian", "t5"])
def test_decoder_start_token_first(dirs, name):
    """The labels' shift written out: the decoder reads [start] + labels[:-1] (mBART's own rule
    moves its last token to the front instead; transformers' forward applies it in the test above)."""
    path, eager = dirs[name]
    model = qkv.load(path)
    tok = model.tokenizer
    src = torch.tensor([tok(SOURCE)["input_ids"]])
    labels = tok(text_target=TARGET)["input_ids"]
    shifted = torch.tensor([[eager.config.decoder_start_token_id] + labels[:-1]])
    truth, plain = (eager_weights(m, input_ids=src, decoder_input_ids=shifted) for m in eager_pair(eager))
    got = attention_maps(model, SOURCE, target=TARGET).cross
    assert_within(got, truth["cross_attentions"], plain["cross_attentions"], factor=FUSED_FACTOR,
                  what="cross")


@pytest.mark.parametrize("name", ["bart", "t5"])
def test_cross_attention_translates_and_teacher_forces_its_output(dirs, name):
    path, eager = dirs[name]
    model = qkv.load(path)
    tok = model.tokenizer
    src = torch.tensor([tok(SOURCE)["input_ids"]])
    ca = cross_attention(model, SOURCE)
    limit = {} if model.max_positions is None else {"max_length": model.max_positions}
    with torch.no_grad():
        generated = eager.generate(input_ids=src, do_sample=False, num_beams=1, **limit)[0]
    ids = generated[1:len(ca.target) + 1]  # after the decoder start token
    assert ca.target == tok.convert_ids_to_tokens(ids.tolist())
    assert ca.source == tok.convert_ids_to_tokens(src[0].tolist())
    assert ca.translation == tok.decode(ids, skip_special_tokens=True).strip()
    truth, plain = (eager_weights(m, input_ids=src, decoder_input_ids=generated[None, :len(ids)])
                    for m in eager_pair(eager))
    assert_within(ca.weights, truth["cross_attentions"], plain["cross_attentions"],
                  factor=FUSED_FACTOR, what="cross")
    doc = ca.to_dict()
    assert doc["kind"] == "cross" and len(doc["ranking"]) == len(ca.target)


def test_cross_attention_target_and_token(dirs):
    model = qkv.load(dirs["marian"][0])
    ca = cross_attention(model, SOURCE, target=TARGET, token="chat", top=2)
    assert ca.target[ca.token] == "chat" and ca.special[-1] and not any(ca.special[:-1])
    assert [len(h["top"]) for h in ca.to_dict()["heads"]] == [2] * 8


def test_too_long_target_and_text(dirs):
    model = qkv.load(dirs["bart"][0])
    limit = model.max_positions
    with pytest.raises(ArgumentError, match=rf"^target tokenises to {limit + 2} tokens, more than "
                                            rf"the {limit} positions bart has") as e:
        attention_maps(model, SOURCE, target=" ".join(["chat"] * limit))
    assert e.value.argument == "target"
    with pytest.raises(QkvError, match=rf"^text tokenises to {limit + 2} tokens"):
        cross_attention(model, " ".join(["cat"] * limit))


@pytest.mark.parametrize("target", ["", "  \u200b "])
def test_empty_target(dirs, target):
    model = qkv.load(dirs["t5"][0])
    with pytest.raises(ArgumentError, match="^target is empty") as e:
        attention_maps(model, SOURCE, target=target)
    assert e.value.argument == "target"


def test_target_on_a_model_without_cross_attention():
    lm = qkv.load("lm")  # the shipped decoder-only Llama
    for call in (attention_maps, cross_attention):
        with pytest.raises(ArgumentError, match="^target is for encoder-decoders") as e:
            call(lm, "a b c", target="x")
        assert e.value.argument == "target"


def test_marian_separate_vocabularies_refused(dirs, tmp_path):
    path = dirs["marian"][0]
    config = os.path.join(path, "tokenizer_config.json")
    raw = json.load(open(config))
    try:
        json.dump(raw | {"separate_vocabs": True}, open(config, "w"))
        with pytest.raises(QkvError, match="separate source and target vocabularies"):
            qkv.load(path)
    finally:
        json.dump(raw, open(config, "w"))


def corrupt(kind: str, path) -> None:
    """Damage the tokenizer of the model directory ``path`` as ``kind`` says."""
    if kind == "list":
        (path / "tokenizer.json").write_text("[]")
    elif kind == "not a tokenizer":
        (path / "tokenizer.json").write_text('{"version": "1.0"}')
    elif kind == "fifo":
        (path / "tokenizer_config.json").unlink()
        os.mkfifo(path / "tokenizer_config.json")
    elif kind == "directory":
        (path / "special_tokens_map.json").mkdir()
    else:  # "too many tokens": the tokenizer of a model with a larger vocabulary
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(path)
        tok.add_tokens([f"extra{i}" for i in range(5)])
        tok.save_pretrained(path)


@pytest.mark.parametrize(("kind", "message"), [
    ("list", r"tokenizer\.json holds a JSON list, not an object: it is not a tokenizer file$"),
    ("not a tokenizer", r"tokenizer\.json could not be read as a tokenizer"),
    ("fifo", r"tokenizer_config\.json is not a regular file"),
    ("directory", r"special_tokens_map\.json is not a regular file"),
    ("too many tokens", r"has 104 tokens but the model's vocab_size is 99 \(config\.json\): a "
                        r"tokenizer from another model\?$"),
])
def test_a_corrupt_tokenizer_is_refused_at_load(dirs, tmp_path, capsys, kind, message):
    """Checked when the model loads, one line naming the file (before: transformers read a
    ``[]`` tokenizer.json and failed at the first text with a TypeError, skipped a FIFO
    tokenizer_config.json, and a larger vocabulary indexed past the embedding)."""
    import shutil

    path = tmp_path / "bart"
    shutil.copytree(dirs["bart"][0], path)
    corrupt(kind, path)
    with pytest.raises(QkvError, match=message):
        qkv.load(path)
    assert qkv_cli("translate", SOURCE, "--model", str(path)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("qkv: error: ") and "Traceback" not in "".join(err)


def test_no_tokenizer(dirs, tmp_path):
    _, eager = dirs["t5"]
    eager.save_pretrained(tmp_path)
    with pytest.raises(QkvError, match="transformers cannot read the tokenizer of this t5 model"):
        qkv.load(tmp_path)


# -- the command line and the viewer ---------------------------------------------------------------
def qkv_cli(*argv):
    from qkv.cli import main

    return main(list(argv))


def test_cli_translate_greedy_and_beam(dirs, capsys):
    path = dirs["bart"][0]
    model = qkv.load(path)
    for beam in (1, 3):
        assert qkv_cli("translate", SOURCE, "--model", path, "--beam", str(beam)) == 0
        assert capsys.readouterr().out.strip() == model.translate([SOURCE], beam=beam)[0]


def test_cli_explain_json_is_the_cross_view(dirs, capsys):
    path = dirs["t5"][0]
    assert qkv_cli("explain", SOURCE, "--model", path, "--json") == 0
    doc = json.loads(capsys.readouterr().out)
    ca = cross_attention(qkv.load(path), SOURCE)
    assert doc["kind"] == "cross" and doc["target"] == ca.target and doc["source"] == ca.source


@pytest.mark.parametrize("name", ["bart", "marian"])
def test_no_gold_alignment_is_assumed(dirs, capsys, name):
    """The toy grammar's gold is the translation model's own, never applied to another
    encoder-decoder: a sentence of the grammar gets no gold and no note about it."""
    path = dirs[name][0]
    assert qkv.load(path).gold_alignment(GRAMMAR_SENTENCE) is None
    assert qkv_cli("explain", GRAMMAR_SENTENCE, "--model", path, "--json") == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["gold"] is None and doc["gold_note"] is None and "aligned" not in doc["heads"][0]
    assert qkv_cli("explain", GRAMMAR_SENTENCE, "--model", path) == 0
    out = capsys.readouterr().out
    assert "gold" not in out and "source: 0:" in out and "target: 0:" in out


def test_view_html_export(dirs, tmp_path):
    out = tmp_path / "page.html"
    assert qkv_cli("view", SOURCE, "--model", dirs["m2m_100"][0], "--html", str(out)) == 0
    assert '"cross"' in out.read_text()
