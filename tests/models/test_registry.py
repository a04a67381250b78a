"""The family registry: every family's checkpoint mapping fills its model's state dict exactly,
names follow the layer stack (``encoder.layers.N…``, ``decoder.layers.N…``, ``decoder.norm``),
and a taken ``model_type`` cannot be registered again."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from qkv.models import FAMILIES, BertConfig, GPT2Config, register_family
from qkv.models import bert, gpt2

SMALL = {
    "bert": BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
                       intermediate_size=24, max_position_embeddings=12),
    "gpt2": GPT2Config(vocab_size=40, n_positions=12, n_embd=16, n_layer=2, n_head=4),
}


def test_the_registry_holds_the_family_files_records():
    assert FAMILIES["bert"] is bert.FAMILY and FAMILIES["gpt2"] is gpt2.FAMILY
    assert set(SMALL) <= set(FAMILIES)


@pytest.mark.parametrize("model_type", sorted(SMALL))
def test_a_checkpoint_of_the_expected_shapes_fills_the_model_exactly(model_type):
    """shapes → convert → load_state_dict(strict): no name missing, none left over, and every
    tensor of the checkpoint lands somewhere (distinct values trace each one)."""
    family, config = FAMILIES[model_type], SMALL[model_type]
    shapes = family.shapes(config)
    gen = torch.Generator().manual_seed(0)
    tensors = {name: torch.randn(shape, generator=gen) for name, shape in shapes.items()}
    model = family.build(config, name=f"tiny-{model_type}")
    state = family.convert(tensors, config)
    model.load_state_dict(state, strict=True)
    for param, source in family.tied:
        assert torch.equal(model.get_parameter(param), model.get_parameter(source))
    assert model.name == f"tiny-{model_type}" and model.tokenizer is None


def test_state_dict_names_follow_the_layer_stack():
    bert_names = set(FAMILIES["bert"].build(SMALL["bert"]).state_dict())
    assert "encoder.layers.1.self_attn.q_proj.weight" in bert_names
    assert "encoder.layers.0.norm3.bias" in bert_names
    assert not any(n.startswith("encoder.norm") for n in bert_names)  # post-norm: no final norm
    gpt2_names = set(FAMILIES["gpt2"].build(SMALL["gpt2"]).state_dict())
    assert "decoder.layers.1.feed_forward.fc2.weight" in gpt2_names
    assert {"decoder.norm.weight", "decoder.norm.bias", "lm_head.weight"} <= gpt2_names


def test_registering_a_taken_name_raises_and_keeps_the_first():
    first = FAMILIES["bert"]
    other = dataclasses.replace(first, prefix="other.")
    with pytest.raises(ValueError, match=r"model family .bert. is already registered \(registered: bert, distilbert, gpt2"):
        register_family("bert", other)
    assert FAMILIES["bert"] is first


def test_a_new_family_is_found_by_its_model_type(tmp_path):
    """A checkpoint whose config.json names an unknown model_type loads once a family is
    registered for it, and is built by that family (its build is the one called)."""
    import json

    transformers = pytest.importorskip("transformers")
    from qkv.models import load

    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=24,
                                     max_position_embeddings=12)
    transformers.BertModel(config).save_pretrained(tmp_path)
    (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a"]))
    path = tmp_path / "config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | {"model_type": "tiny-test-bert"}))
    with pytest.raises(Exception, match="tiny-test-bert"):  # unknown before it is registered
        load(str(tmp_path))
    built = []

    def build(*args, **kw):
        built.append(args[0])
        return bert.FAMILY.build(*args, **kw)

    try:
        # BERT's own config reader insists on model_type "bert": the new family reads it as one
        read = lambda d, **kw: bert.FAMILY.config_from_dict(d | {"model_type": "bert"}, **kw)  # noqa: E731
        register_family("tiny-test-bert", dataclasses.replace(bert.FAMILY, build=build,
                                                              config_from_dict=read))
        model = load(str(tmp_path))
        assert len(built) == 1 and built[0].hidden_size == 16 and len(model.layers) == 2
        with pytest.raises(ValueError, match="'tiny-test-bert' is already registered"):
            register_family("tiny-test-bert", bert.FAMILY)
    finally:
        FAMILIES.pop("tiny-test-bert", None)


def test_only_family_records_are_registered():
    with pytest.raises(ValueError, match="family must be a qkv.models.family.Family, got dict"):
        register_family("not-a-family", {"build": None})
    assert "not-a-family" not in FAMILIES


def test_every_family_file_is_registered():
    """A family file whose line in the registry is missing would load its checkpoints through
    transformers without a word (route's last row): every ``FAMILY`` in models/ is registered."""
    import importlib
    import pkgutil

    import qkv.models
    from qkv.models.family import Family

    found = {}
    for info in pkgutil.iter_modules(qkv.models.__path__):
        family = getattr(importlib.import_module(f"qkv.models.{info.name}"), "FAMILY", None)
        if isinstance(family, Family):
            found[info.name] = family
    assert len(found) >= 9
    for name, family in found.items():
        assert any(f is family for f in FAMILIES.values()), f"models/{name}.py's FAMILY is not registered"


@pytest.mark.parametrize("raw, via, loader", [
    ({"model_type": "qkv-translation"}, None, "translation"),
    ({"model_type": "bert"}, None, "native"),
    ({"model_type": "bert"}, "native", "native"),
    ({"model_type": "bert"}, "hf", "transformers"),
    ({"model_type": "bart", "is_encoder_decoder": True}, None, "seq2seq"),
    ({"model_type": "olmo2"}, None, "transformers"),
])
def test_route_is_the_one_table(raw, via, loader):
    from qkv.models.registry import route

    pytest.importorskip("transformers")
    assert route(raw, via, "config.json") == loader


@pytest.mark.parametrize("raw, via, message", [
    ({"model_type": "olmo2"}, "native", r"model_type 'olmo2' is not supported natively"),
    ({"model_type": "bart", "is_encoder_decoder": True}, "native", r"'bart' is not supported natively"),
    ({"model_type": ["bert"]}, None, r"model_type must be a non-empty string"),
    ({"model_type": "bert", "is_encoder_decoder": "yes"}, None, r"is_encoder_decoder must be true or false"),
])
def test_route_refuses_by_name(raw, via, message):
    from qkv.errors import QkvError
    from qkv.models.registry import route

    with pytest.raises(QkvError, match=message):
        route(raw, via, "config.json")


def test_models_import_nothing_above_them():
    """models/ sits below hf/, translate/, explain/ …: loaders are named in the registry by module
    path, so no module of models/ imports them (counting imports inside functions)."""
    from test_imports import import_graph

    below = ("qkv.models", "qkv.modules", "qkv.attention", "qkv.errors", "qkv.files", "qkv.text")
    graph, _ = import_graph()
    reaching = {m: sorted(d for d in deps if d != "qkv" and not d.startswith(below))
                for m, deps in graph.items() if m.startswith("qkv.models")}
    reaching = {m: deps for m, deps in reaching.items() if deps}
    assert not reaching, reaching
