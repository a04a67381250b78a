"""The `Family` record: what `qkv.models.load` needs to know about one model family.

Each family file (`bert.py`, `gpt2.py`) defines `FAMILY = Family(...)`; the registry
([`qkv.models.registry`][qkv.models.registry]) maps `config.json`'s `model_type` to it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

import torch

Shapes = dict[str, tuple[int, ...]]
Tensors = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Family:
    """What `load` needs to know about one model family's Hugging Face checkpoints.

    Attributes:
        config_from_dict: `(config.json dict, where=file) → config` dataclass; unsupported
            variants raise `QkvError`.
        build: `(config, *, tokenizer, name, directory) → model` (an `nn.Module` built on
            whatever device is current; `load` makes it on the meta device).
        max_length: config → the most tokens the model takes (the tokenizer's limit).
        prefix: the prefix a checkpoint saved from a model *with a head* puts on the base
            model's tensors (`"bert."`, `"transformer."`); stripped when present.
        shapes: config → the expected tensors (names without prefix) and their shapes.
        ignored: tensors that may be present and are not used (buffers, unused heads).
        convert: tensors (Hugging Face names, shapes checked) → the model's state dict.
        tied: (parameter, parameter it is tied to) pairs, re-tied after loading.
        layers_key: the config field (and `config.json` key) holding the number of layers;
            `load` compares it with the layers the safetensors header holds *before*
            computing `shapes` (a `num_hidden_layers` of 10⁹ must fail at once, not
            after listing 10⁹ layers' tensors).
    """

    config_from_dict: Callable
    build: Callable
    max_length: Callable[[object], int]
    prefix: str
    shapes: Callable[[object], Shapes]
    ignored: re.Pattern
    convert: Callable[[Tensors, object], Tensors]
    tied: tuple[tuple[str, str], ...] = field(default=())
    layers_key: str = "num_hidden_layers"


