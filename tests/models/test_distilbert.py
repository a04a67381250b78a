"""qkv's DistilBERT against Hugging Face transformers, same weights.

A random ``DistilBertModel`` with odd sizes (learned and sinusoidal position tables) is built by
``transformers``, saved with ``save_pretrained`` next to a WordPiece ``vocab.txt`` trained here,
and loaded with ``qkv.load``: DistilBERT's names (``q_lin``, ``sa_layer_norm``, ``ffn.lin1`` …)
and no token types. Every hidden state and every attention probability equal transformers'
eager forward within derived tolerances (``tests/hf_encoders.py``).
"""

from __future__ import annotations

import pytest
import torch

from hf_encoders import (CORPUS, TEXTS, assert_equals_transformers,
                         assert_packed_embeddings_equal_transformers, save_model)
from qkv.errors import QkvError
from qkv.models import load
from qkv.models.distilbert import DistilBertConfig, DistilBertModel

transformers = pytest.importorskip("transformers")

SIZES = dict(vocab_size=211, dim=36, n_layers=2, n_heads=3, hidden_dim=50, max_position_embeddings=40)


@pytest.fixture(scope="module", params=[False, True], ids=["learned", "sinusoidal"])
def checkpoint(request, tmp_path_factory):
    """(directory, HF eager model, qkv model)."""
    from tokenizers import BertWordPieceTokenizer

    path = str(tmp_path_factory.mktemp("distilbert"))
    tok = BertWordPieceTokenizer(lowercase=True)
    tok.train_from_iterator(CORPUS, vocab_size=200, min_frequency=1)
    tok.save_model(path)  # vocab.txt
    hf = save_model(path, "DistilBertConfig", "DistilBertModel", sinusoidal_pos_embds=request.param,
                    activation="gelu", **SIZES)
    return path, hf, load(path)


def test_loaded_model_matches_the_config(checkpoint):
    _, hf, model = checkpoint
    assert isinstance(model, DistilBertModel) and not model.training
    assert model.config.n_layers == len(model.layers) == 2
    assert not hasattr(model.embeddings, "token_type")  # no token types
    assert torch.equal(model.layers[1].self_attn.q_proj.weight, hf.transformer.layer[1].attention.q_lin.weight)
    assert torch.equal(model.layers[0].norm1.bias, hf.transformer.layer[0].sa_layer_norm.bias)


@pytest.mark.parametrize("traced", [False, True], ids=["fused", "traced"])
def test_hidden_states_and_attention_equal_transformers(checkpoint, traced):
    _, hf, model = checkpoint
    batch = model.tokenizer.encode_batch(TEXTS)
    assert_equals_transformers(model, hf, batch.input_ids, batch.attention_mask, traced=traced)


def test_packed_sentence_embeddings_equal_the_padded_forward(checkpoint):
    _, hf, model = checkpoint
    assert_packed_embeddings_equal_transformers(model, hf, TEXTS)


def test_token_types_are_refused(checkpoint):
    _, _, model = checkpoint
    ids = torch.tensor([[2, 7, 8, 3]])
    with pytest.raises(ValueError, match="DistilBERT has no token types"):
        model(ids, token_type_ids=torch.tensor([[0, 0, 1, 1]]))
    with torch.no_grad():  # all zeros is the same as none
        assert torch.equal(model(ids, token_type_ids=torch.zeros_like(ids)).last_hidden_state,
                           model(ids).last_hidden_state)


@pytest.mark.parametrize("change, message", [
    ({"dim": 37}, r"dim \(37\) must be divisible by n_heads \(3\)"),
    ({"n_layers": 2.5}, "n_layers must be an integer >= 1, got 2.5"),
    ({"activation": "tanh"}, "activation 'tanh' is not supported"),
    ({"sinusoidal_pos_embds": "no"}, "sinusoidal_pos_embds must be true or false"),
    ({"architectures": "DistilBertModel"}, "architectures must be a list of class names"),
])
def test_config_rejects_unsupported(change, message):
    with pytest.raises(QkvError, match=message):
        DistilBertConfig.from_dict({"model_type": "distilbert", "dim": 36, "n_heads": 3} | change)


def test_explain_runs_on_distilbert(checkpoint, capsys):
    from qkv.cli import main

    path, _, _ = checkpoint
    assert main(["explain", "the dog found some pizza", "--model", path, "--words"]) == 0
    assert "words: 0:[CLS] 1:the 2:dog 3:found 4:some 5:pizza 6:[SEP]" in capsys.readouterr().out
