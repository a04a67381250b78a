"""A test-sized native family written by following docs/architecture.md's family recipe.

"Toy": a pre-norm causal decoder with LayerNorm, RoPE on a 2-of-4 GQA attention, a GELU
feed-forward and a tied read-out, whose checkpoints name their tensors in a layout of their own
(`blocks.N.attn.wq.weight` …), so that every step of the recipe does real work:

1. the config dataclass, read from config.json by `ToyConfig.from_dict`;
2. the model, a `DecoderLM` built from `TransformerLayer`s (its parts come with them);
3. the checkpoint mapping: `toy_shapes` (names and shapes) and `toy_convert` (→ the state dict);
4. the `Family` record, `FAMILY`;
5. `register_family(MODEL_TYPE, FAMILY)` — by the test (`test_family_recipe.py`), never on import.

`save(path)` writes a checkpoint directory of it (config.json, model.safetensors, tokenizer.json).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, fields

import torch
from torch import nn

from qkv.errors import QkvError
from qkv.models import config as cfg
from qkv.models.decoder import DecoderLM
from qkv.models.family import Family, Shapes, Tensors
from qkv.modules import MultiHeadAttention, TransformerLayer, TransformerStack
from qkv.modules.feedforward import FeedForward
from qkv.modules.positional import RotaryEmbedding

MODEL_TYPE = "qkv-toy"


# -- 1. the config ------------------------------------------------------------------------------
@dataclass(frozen=True)
class ToyConfig:
    """The sizes of a toy decoder; field names are its config.json keys."""

    vocab_size: int = 64
    width: int = 24  # E
    depth: int = 2  # layers
    heads: int = 4  # h; head dim d = E / h
    kv_heads: int = 2  # h_kv (GQA)
    ff_width: int = 40
    max_positions: int = 48  # the most tokens the model takes
    rope_base: float = 500.0

    def __post_init__(self):
        if self.width % self.heads or self.heads % self.kv_heads:
            raise QkvError(f"width ({self.width}) must be divisible by heads ({self.heads}) and "
                           f"heads by kv_heads ({self.kv_heads})")

    @property
    def head_dim(self) -> int:
        return self.width // self.heads

    @classmethod
    def from_dict(cls, d: dict, *, where: str = "config.json") -> "ToyConfig":
        cfg.check_architecture(d, MODEL_TYPE, ("ToyForCausalLM",), where=where)
        return cls(**cfg.read_fields(cls, d, [f.name for f in fields(cls)], where=where))


# -- 2. the model -------------------------------------------------------------------------------
class ToyModel(DecoderLM):
    """The toy decoder: `DecoderLM`'s forward, caches and generation; its layers are qkv's."""

    max_length_field = "max_positions"

    def __init__(self, config: ToyConfig, *, tokenizer=None, name: str = MODEL_TYPE):
        super().__init__()
        self.config, self.name, self.tokenizer = config, name, tokenizer
        c, E = config, config.width
        self.embed_tokens = nn.Embedding(c.vocab_size, E)
        self.decoder = TransformerStack((self._layer(c) for _ in range(c.depth)), norm=nn.LayerNorm(E))
        self.lm_head = None  # tied: the logits read embed_tokens.weight

    @staticmethod
    def _layer(c: ToyConfig) -> TransformerLayer:
        attn = MultiHeadAttention(c.width, c.heads, num_kv_heads=c.kv_heads, bias=False,
                                  rotary=RotaryEmbedding(c.head_dim, c.rope_base))
        ff = FeedForward(c.width, c.ff_width, activation="gelu")
        return TransformerLayer(attn, ff, nn.LayerNorm(c.width), nn.LayerNorm(c.width), norm_first=True)

    @property
    def max_length(self) -> int:
        return self.config.max_positions


# -- 3. the checkpoint mapping ------------------------------------------------------------------
# checkpoint module (after "blocks.N.") → qkv's module (after "decoder.layers.N.")
LAYER_NAMES = {"attn.wq": "self_attn.q_proj", "attn.wk": "self_attn.k_proj", "attn.wv": "self_attn.v_proj",
               "attn.wo": "self_attn.out_proj", "ff.w_in": "feed_forward.fc1", "ff.w_out": "feed_forward.fc2",
               "ln_a": "norm1", "ln_m": "norm3"}


def toy_shapes(c: ToyConfig) -> Shapes:
    E, F, q, kv = c.width, c.ff_width, c.heads * c.head_dim, c.kv_heads * c.head_dim
    shapes = {"tokens.weight": (c.vocab_size, E), "ln_out.weight": (E,), "ln_out.bias": (E,)}
    for i in range(c.depth):
        p = f"blocks.{i}."
        shapes |= {p + "attn.wq.weight": (q, E), p + "attn.wk.weight": (kv, E), p + "attn.wv.weight": (kv, E),
                   p + "attn.wo.weight": (E, q), p + "ff.w_in.weight": (F, E), p + "ff.w_in.bias": (F,),
                   p + "ff.w_out.weight": (E, F), p + "ff.w_out.bias": (E,)}
        for norm in ("ln_a", "ln_m"):
            shapes |= {p + norm + ".weight": (E,), p + norm + ".bias": (E,)}
    return shapes


def toy_convert(tensors: Tensors, c: ToyConfig) -> Tensors:
    state = {"embed_tokens.weight": tensors["tokens.weight"],
             "decoder.norm.weight": tensors["ln_out.weight"], "decoder.norm.bias": tensors["ln_out.bias"]}
    layer = re.compile(r"^blocks\.(\d+)\.(.+)\.(weight|bias)$")
    for name, x in tensors.items():
        if m := layer.match(name):
            state[f"decoder.layers.{m[1]}.{LAYER_NAMES[m[2]]}.{m[3]}"] = x
    return state


def build(config: ToyConfig, *, tokenizer=None, name: str = MODEL_TYPE, directory: str | None = None) -> ToyModel:
    return ToyModel(config, tokenizer=tokenizer, name=name)


# -- 4. the Family record -----------------------------------------------------------------------
FAMILY = Family(config_from_dict=ToyConfig.from_dict, build=build, max_length=lambda c: c.max_positions,
                prefix="toy.", shapes=toy_shapes, ignored=re.compile(r"^$"), convert=toy_convert,
                layers_key="depth")


# -- a checkpoint of it -------------------------------------------------------------------------
def save(path: str, config: ToyConfig, words: list[str], *, seed: int = 0) -> None:
    """A checkpoint directory: config.json, random weights in the checkpoint's own names, a
    word-level tokenizer.json over `words` (ids 0, 1 `[PAD]`, `[UNK]`)."""
    from safetensors.torch import save_file
    from tokenizers import Tokenizer, models, pre_tokenizers

    g = torch.Generator().manual_seed(seed)
    tensors = {name: torch.randn(shape, generator=g) * (0.3 if len(shape) > 1 else 0.1)
               for name, shape in toy_shapes(config).items()}
    for name in tensors:  # norms near 1, as trained ones are
        if re.search(r"ln_\w+\.weight$", name):
            tensors[name] = 1 + tensors[name]
    save_file({"toy." + k: v.contiguous() for k, v in tensors.items()}, os.path.join(path, "model.safetensors"))
    raw = {"model_type": MODEL_TYPE, "architectures": ["ToyForCausalLM"],
           **{f.name: getattr(config, f.name) for f in fields(config)}}
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(raw, f)
    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", *words])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["[PAD]", "[UNK]"])
    tok.save(os.path.join(path, "tokenizer.json"))
