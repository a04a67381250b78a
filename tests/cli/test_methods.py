"""``--method``, ``--target`` and ``--compare`` on ``qkv explain`` / ``qkv heads``
(qkv.cli.methods): the output, the JSON, the picture, and one-line errors with exit 2."""

from __future__ import annotations

import json

import pytest

from qkv.cli import main

TEXT = "The dog found some pizza next to the baby and ate it"


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("method, per", [("norm", "head"), ("rollout", "layer")])
def test_explain_json(capsys, method, per):
    code, out, _ = run(capsys, "explain", TEXT, "--token", "it", "--method", method, "--json")
    assert code == 0
    d = json.loads(out)
    assert d["tokens"][d["token_index"]] == "it" and d["method"] == method and d["per"] == per
    depth = 3 if per == "head" else 2  # [layer][head][key] or [layer][key]
    x = d["scores"]
    for _ in range(depth - 1):
        x = x[0]
    assert len(x) == 14 and isinstance(x[0], float)


def test_explain_text_ranks_layers_and_draws(capsys, tmp_path):
    png = tmp_path / "alti.png"
    code, out, err = run(capsys, "explain", TEXT, "--token", "it", "--method", "alti", "--png", str(png))
    assert code == 0 and png.stat().st_size > 1000 and "wrote" in err
    assert "alti contributions into token 12 'it'" in out
    assert "where the largest share lands (6 layers)" in out


def test_grad_with_a_target(capsys):
    code, out, _ = run(capsys, "explain", TEXT, "--token", "it", "--method", "grad", "--target",
                       "a dog ate the pizza", "--top", "1")
    assert code == 0 and "y = the cosine similarity of the sentence embeddings to 'a dog ate the pizza'" in out


def test_compare(capsys):
    code, out, _ = run(capsys, "explain", TEXT, "--token", "it", "--compare", "--top", "2")
    assert code == 0
    header = next(line for line in out.splitlines() if line.startswith("rank"))
    assert header.split() == ["rank", "weight", "norm", "rollout", "flow", "alti", "value-zeroing", "attnlrp"]
    assert "grad: not run — --method 'grad' does not apply" in out and "--target TEXT" in out
    assert "on [CLS]/[SEP]/punctuation: weight" in out


def test_heads_by_method(capsys):
    code, out, _ = run(capsys, "heads", TEXT, "--from", "it", "--to", "pizza", "--method", "alti",
                       "--top", "2")
    assert code == 0 and "alti share from 'it'" in out and "every layer, largest first" in out
    code, out, _ = run(capsys, "heads", TEXT, "--from", "it", "--to", "pizza", "--method", "norm",
                       "--json")
    assert code == 0 and json.loads(out)[0] == {"layer": 3, "head": 1, "weight": pytest.approx(0.8624, abs=1e-3)}


@pytest.mark.parametrize("argv, message", [
    (["explain", TEXT, "--method", "attention"],
     "qkv: error: unknown --method 'attention'; known methods: weight, norm, rollout, flow, alti, value-zeroing, grad, attnlrp"),
    (["explain", TEXT, "--method", "grad"],
     "qkv: error: --method 'grad' does not apply to all-MiniLM-L6-v2 without a target: an encoder has no "
     "next token to score; give --target TEXT (the similarity of the two sentence embeddings is differentiated)"),
    (["explain", TEXT, "--method", "grad", "--target", " "],
     "qkv: error: --target is empty; give a second text, e.g. --target \"a dog ate the pizza\""),
    (["explain", TEXT, "--target", "a dog"],
     "qkv: error: --target is only read by --method grad (the text whose similarity is differentiated), "
     "not by --method weight"),
    (["explain", TEXT, "--compare", "--method", "norm"],
     "qkv: error: --compare runs every method itself; it takes no --method, --head, --no-projection, --png or --to"),
    (["explain", TEXT, "--method", "norm", "--layer", "1", "--head", "2"],
     "qkv: error: --method norm ranks the overview (every head or layer for --token); it takes no --head or "
     "--no-projection"),
    (["heads", "--probe", "coref", "--method", "grad"],
     "qkv: error: --method 'grad' does not apply to all-MiniLM-L6-v2 without a target: an encoder has no "
     "next token to score; give --target TEXT (the similarity of the two sentence embeddings is differentiated)"),
    (["explain", "the cat sleeps", "--model", "translate", "--method", "norm"],
     "qkv: error: --method, --compare and --target explain self-attention models; a translation model's "
     "cross-attention is shown per target token (--token, --layer, --head)"),
    (["heads", "--probe", "coref", "--method", "bogus"],
     "qkv: error: unknown --method 'bogus'; known methods: weight, norm, rollout, flow, alti, value-zeroing, grad, attnlrp"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, message):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == "" and err.strip() == message


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    """A random GPT-2 checkpoint with a byte-level BPE tokenizer trained here (a decoder)."""
    transformers = pytest.importorskip("transformers")
    import torch
    from tokenizers import ByteLevelBPETokenizer

    path = tmp_path_factory.mktemp("tiny-gpt2-methods")
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator([TEXT, "the cat sat on the mat", "a dog ate the pizza"] * 3,
                            vocab_size=300, min_frequency=1, special_tokens=["<|endoftext|>"])
    tok.save_model(str(path))
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_head=4, n_embd=32, vocab_size=300,
                                     n_positions=64, bos_token_id=None, eos_token_id=None)
    transformers.GPT2LMHeadModel(config).save_pretrained(str(path))
    return str(path)


def test_a_decoder_runs_every_method(capsys, gpt2_dir):
    code, out, err = run(capsys, "explain", TEXT, "--model", gpt2_dir, "--token", "it", "--compare")
    assert code == 0, err
    header = next(line for line in out.splitlines() if line.startswith("rank"))
    assert header.split()[1:] == ["weight", "norm", "rollout", "flow", "alti", "value-zeroing", "grad", "attnlrp"]
    code, out, err = run(capsys, "explain", TEXT, "--model", gpt2_dir, "--token", "it", "--method",
                         "grad", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert "the logit of the predicted next token" in d["target"]
    row = d["scores"][-1]  # causal: nothing from after the token
    assert all(v == 0 for v in row[d["token_index"] + 1:])
    code, _, err = run(capsys, "explain", TEXT, "--model", gpt2_dir, "--method", "grad",
                       "--target", "a text")
    assert code == 2 and "--target is for encoders" in err
