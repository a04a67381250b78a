"""qkv's RoBERTa against Hugging Face transformers, same weights.

A random ``RobertaModel`` with odd sizes is built by ``transformers``, saved with
``save_pretrained`` next to a byte-level BPE ``tokenizer.json`` with RoBERTa's ``<s> … </s>``
template trained here, and loaded with ``qkv.load``. Every hidden state and every attention
probability equal transformers' eager forward within derived tolerances
(``tests/hf_encoders.py``); positions start at ``pad_token_id + 1`` (a checkpoint with another
pad id proves it); packed sentence embeddings equal the padded forward.
"""

from __future__ import annotations

import os

import pytest
import torch

from hf_encoders import (CORPUS, TEXTS, assert_equals_transformers,
                         assert_packed_embeddings_equal_transformers, save_model)
from qkv.errors import QkvError
from qkv.models import load
from qkv.models.roberta import RobertaConfig, RobertaModel

transformers = pytest.importorskip("transformers")

SIZES = dict(vocab_size=311, hidden_size=36, num_hidden_layers=2, num_attention_heads=3,
             intermediate_size=50, max_position_embeddings=40, type_vocab_size=1)


def save_tokenizer(path: str, *, pad_first: bool = False) -> None:
    """A byte-level BPE with RoBERTa's specials (<s>=0, <pad>=1, </s>=2; or <pad>=0 first)."""
    from tokenizers import ByteLevelBPETokenizer, processors

    specials = ["<pad>", "<s>", "</s>", "<unk>", "<mask>"] if pad_first else ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(CORPUS, vocab_size=300, min_frequency=1, special_tokens=specials)
    tok._tokenizer.post_processor = processors.RobertaProcessing(
        ("</s>", tok.token_to_id("</s>")), ("<s>", tok.token_to_id("<s>")), trim_offsets=True)
    tok.save(os.path.join(path, "tokenizer.json"))


@pytest.fixture(scope="module", params=[1, 0], ids=["pad1", "pad0"])
def checkpoint(request, tmp_path_factory):
    """(directory, HF eager model, qkv model); pad_token_id 1 (RoBERTa's) or 0."""
    pad = request.param
    path = str(tmp_path_factory.mktemp(f"roberta-pad{pad}"))
    save_tokenizer(path, pad_first=pad == 0)
    hf = save_model(path, "RobertaConfig", "RobertaModel", pad_token_id=pad, **SIZES)
    return path, hf, load(path)


def test_loaded_model_matches_the_config(checkpoint):
    path, hf, model = checkpoint
    assert isinstance(model, RobertaModel) and not model.training
    c = model.config
    assert c.position_offset == c.pad_token_id + 1 and c.max_tokens == 40 - c.pad_token_id - 1
    assert model.tokenizer.max_length == c.max_tokens and model.tokenizer.pad_id == c.pad_token_id
    assert torch.equal(model.embeddings.position.weight, hf.embeddings.position_embeddings.weight)


@pytest.mark.parametrize("traced", [False, True], ids=["fused", "traced"])
def test_hidden_states_and_attention_equal_transformers(checkpoint, traced):
    _, hf, model = checkpoint
    batch = model.tokenizer.encode_batch(TEXTS)  # right-padded with <pad>
    assert batch.encodings[0].tokens[0] == "<s>" and batch.encodings[0].tokens[-1] == "</s>"
    assert_equals_transformers(model, hf, batch.input_ids, batch.attention_mask, traced=traced)


def test_packed_sentence_embeddings_equal_the_padded_forward(checkpoint):
    _, hf, model = checkpoint
    assert_packed_embeddings_equal_transformers(model, hf, TEXTS)


def test_too_long_input_names_the_reserved_rows(checkpoint):
    _, _, model = checkpoint
    limit = model.config.max_tokens
    with pytest.raises(QkvError, match=f"input is {limit + 1} tokens; .* takes at most {limit} "
                                       r"\(max_position_embeddings 40 − \d reserved rows\)"):
        model(torch.zeros(1, limit + 1, dtype=torch.long))
    with pytest.raises(QkvError, match=f"takes at most {limit}"):
        model.tokenizer.encode("a" + " a" * limit)


@pytest.mark.parametrize("change, message", [
    ({"position_embedding_type": "relative_key"}, "position_embedding_type='relative_key' is not supported"),
    ({"is_decoder": True}, "is_decoder=True is not supported"),
    ({"architectures": ["RobertaForCausalLM"]}, "'RobertaForCausalLM' is not supported"),
    ({"max_position_embeddings": 2, "pad_token_id": 1}, r"leaves no position after the pad_token_id \+ 1 = 2"),
    ({"layer_norm_eps": "small"}, "layer_norm_eps must be a positive finite number, got 'small'"),
])
def test_config_rejects_unsupported(change, message):
    with pytest.raises(QkvError, match=message):
        RobertaConfig.from_dict({"model_type": "roberta", "hidden_size": 36,
                                 "num_attention_heads": 3} | change)


def test_explain_and_heads_run_on_an_encoder(checkpoint, capsys):
    """An encoder's token attends to every token, later ones included."""
    from qkv.cli import main

    path, _, model = checkpoint
    text = "The dog found some pizza next to the baby and ate it"
    assert main(["explain", text, "--model", path, "--words", "--token", "dog", "--json"]) == 0
    capsys.readouterr()
    assert main(["explain", text, "--model", path, "--words", "--token", "dog"]) == 0
    assert "decoder:" not in capsys.readouterr().out  # an encoder: no causal note
    assert main(["heads", text, "--model", path, "--from", "it", "--to", "dog"]) == 0
    assert "weight from 'it'" in capsys.readouterr().out
    enc = model.tokenizer.encode(text)
    with torch.no_grad():
        w = model(torch.tensor([enc.ids]), trace_rows=torch.tensor([1])).traces[0].self_attn.attention.weights
    assert bool((w[0, :, 0, 2:] > 0).all())  # token 1 attends to every later token
