"""The one model protocol (qkv.models.protocol): every loader's output meets it.

One conformance test, parametrised over every way ``qkv.load`` makes a model — each native
family (tiny checkpoints transformers writes here), the shipped ``minilm``, ``lm`` and
``translate``, a transformers architecture without a native family (the adapter) and a
transformers encoder-decoder (seq2seq) — so explanations can read the attributes the protocol
names without guessing.
"""

from __future__ import annotations

import os

import pytest
import torch

import qkv
from qkv.models import FAMILIES
from qkv.models.protocol import (
    AttentionLayerLike, Capabilities, CrossAttentionModel, CrossPass, SelfAttentionModel,
    TokenizerLike,
)

transformers = pytest.importorskip("transformers")

TEXT = "the cat sat on the mat"
GRAMMAR = "the red apple is next to the black cats"  # one the shipped translation model knows
WORDS = "the cat sat on mat a dog . red apple".split()

# model_type → (config class, model class, sizes): one tiny checkpoint per native family
SIZES = dict(vocab_size=40, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=24, max_position_embeddings=32)
NATIVE = {
    "bert": ("BertConfig", "BertModel", SIZES),
    "roberta": ("RobertaConfig", "RobertaModel", SIZES | dict(pad_token_id=1)),
    "distilbert": ("DistilBertConfig", "DistilBertModel",
                   dict(vocab_size=40, dim=16, n_layers=2, n_heads=4, hidden_dim=24,
                        max_position_embeddings=32)),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(vocab_size=40, n_embd=16, n_layer=2, n_head=4,
                                                   n_positions=32)),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", SIZES | dict(rotary_pct=0.5)),
    "llama": ("LlamaConfig", "LlamaForCausalLM", SIZES | dict(num_key_value_heads=2)),
    "mistral": ("MistralConfig", "MistralForCausalLM", SIZES | dict(num_key_value_heads=2)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", SIZES | dict(num_key_value_heads=2)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", SIZES | dict(num_key_value_heads=2, head_dim=8)),
}


def save_tokenizer(path, *, wrap: bool) -> None:
    """A word-level tokenizer of ≤ 40 ids; [CLS] … [SEP] around the text when ``wrap``."""
    from tokenizers import Tokenizer as Raw, models, pre_tokenizers, processors

    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS])}
    tok = Raw(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    if wrap:
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tok.add_special_tokens(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    tok.save(os.path.join(path, "tokenizer.json"))


def test_every_native_family_is_covered():
    assert set(NATIVE) == set(FAMILIES)


@pytest.fixture(scope="module")
def directory(tmp_path_factory):
    """kind → a checkpoint directory (or a shipped name), written once per module."""
    made = {}

    def get(kind: str) -> str:
        if kind in made:
            return made[kind]
        if kind in ("minilm", "lm", "translate"):
            return kind
        path = tmp_path_factory.mktemp(kind)
        if kind == "seq2seq":
            from seq2seq_dirs import save

            made[kind] = save(path, "bart")[0]
            return made[kind]
        if kind == "transformers":
            config_class, model_class, sizes = "Olmo2Config", "Olmo2ForCausalLM", SIZES | dict(pad_token_id=0)
        else:
            config_class, model_class, sizes = NATIVE[kind]
        torch.manual_seed(0)
        config = getattr(transformers, config_class)(**sizes)
        getattr(transformers, model_class)(config).save_pretrained(path)
        save_tokenizer(path, wrap=kind in ("bert", "roberta", "distilbert"))
        made[kind] = str(path)
        return made[kind]
    return get


KINDS = sorted(NATIVE) + ["minilm", "lm", "transformers", "translate", "seq2seq"]


@pytest.mark.parametrize("kind", KINDS)
def test_every_loaders_model_meets_the_protocol(directory, kind):
    model = qkv.load(directory(kind))
    caps = model.capabilities
    assert isinstance(caps, Capabilities)
    assert isinstance(model.name, str) and model.name
    assert model.config is not None
    assert isinstance(model, SelfAttentionModel) == caps.self_attention
    assert isinstance(model, CrossAttentionModel) == caps.cross_attention
    if caps.self_attention:
        check_self_attention(model)
    if caps.cross_attention:
        check_cross_attention(model, GRAMMAR if kind == "translate" else TEXT)


def check_self_attention(model) -> None:
    tok = model.tokenizer
    assert isinstance(tok, TokenizerLike)
    assert tok.max_length is None or isinstance(tok.max_length, int)
    enc = tok.encode(TEXT)
    assert [tok.id_to_token(i) for i in enc.ids] == enc.tokens
    assert tok.token_to_id(enc.tokens[-1]) == enc.ids[-1]
    assert set(tok.ordinary_ids()).isdisjoint(tok.special_ids)
    assert len(tok.ordinary_ids()) + len(tok.special_ids) == tok.vocab_size
    assert all(i in tok.special_ids for i, s in zip(enc.ids, enc.special) if s)
    layers = model.layers
    assert len(layers) >= 1
    for layer in layers:
        assert isinstance(layer.self_attn, AttentionLayerLike)
    ids = torch.tensor([enc.ids])
    with torch.no_grad():
        out = model(ids, torch.ones_like(ids), trace_rows=slice(None), output_hidden_states=True)
    t, h = ids.shape[1], layers[0].self_attn.num_heads
    assert len(out.traces) == len(layers) and len(out.hidden_states) == len(layers) + 1
    weights = out.traces[0].self_attn.attention.weights  # (b, h, t, t)
    assert weights.shape == (1, h, t, t)
    torch.testing.assert_close(weights.sum(-1).double(), torch.ones(1, h, t, dtype=torch.double))


def check_cross_attention(model, text: str) -> None:
    layers, heads = model.cross_shape
    assert isinstance(layers, int) and isinstance(heads, int) and layers >= 1 and heads >= 1
    cp = model.cross_pass(text)
    assert isinstance(cp, CrossPass)
    assert cp.cross.shape == (layers, heads, len(cp.target), len(cp.source))
    assert len(cp.special) == len(cp.target)
    translated = model.translate([text])
    assert isinstance(translated, list) and len(translated) == 1 and isinstance(translated[0], str)
    gold = model.gold_alignment(text)
    assert gold is None or isinstance(gold, (str, tuple))
