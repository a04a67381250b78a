"""DistilBERT (Sanh et al., 2019): BERT's post-norm encoder, half the layers, no token types.

The layers are BERT's (`BertModel` runs them); what differs:

* the embeddings are `LayerNorm(word[id] + position[p])` — no token-type table;
* `config.json` says `dim`, `n_layers`, `n_heads`, `hidden_dim`, `activation`;
* checkpoint names: `transformer.layer.N.attention.q_lin` … `sa_layer_norm`, `ffn.lin1`,
  `output_layer_norm` (prefix `distilbert.` when saved with a head).

```text
token i ─► word[id_i] + position[i] ─► LayerNorm ─► n_layers × (x = norm1(x + attn(x)); x = norm3(x + ff(x)))
```
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields

import torch
from torch import nn

from qkv.errors import QkvError
from qkv.models import bert
from qkv.models import config as cfg
from qkv.models.bert import BertConfig, BertModel
from qkv.models.family import Family, Shapes, Tensors
from qkv.modules import LearnedPositionalEmbedding

DISTILBERT_ARCHITECTURES = ("DistilBertModel", "DistilBertForMaskedLM")


@dataclass(frozen=True)
class DistilBertConfig:
    """The sizes of a DistilBERT model; field names and defaults are Hugging Face's.

    Examples:
        >>> DistilBertConfig(dim=64, n_heads=4).head_dim
        16
    """

    vocab_size: int = 30522
    dim: int = 768  # E
    n_layers: int = 6
    n_heads: int = 12  # h; head dim d = E / h
    hidden_dim: int = 3072  # the feed-forward's hidden width
    activation: str = "gelu"  # a qkv.modules.FeedForward activation name
    max_position_embeddings: int = 512  # the most tokens a text may have
    pad_token_id: int = 0

    def __post_init__(self):
        if self.dim % self.n_heads:
            raise QkvError(f"dim ({self.dim}) must be divisible by n_heads ({self.n_heads})")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    # BERT's names for the same sizes, which BertModel's methods read
    hidden_size = property(lambda self: self.dim)
    num_hidden_layers = property(lambda self: self.n_layers)
    num_attention_heads = property(lambda self: self.n_heads)

    def as_bert(self) -> BertConfig:
        """The same sizes under BERT's names (what `BertModel` reads)."""
        return BertConfig(vocab_size=self.vocab_size, hidden_size=self.dim,
                          num_hidden_layers=self.n_layers, num_attention_heads=self.n_heads,
                          intermediate_size=self.hidden_dim, hidden_act=self.activation,
                          max_position_embeddings=self.max_position_embeddings,
                          layer_norm_eps=1e-12,  # fixed in DistilBERT's code, not in its config
                          pad_token_id=self.pad_token_id)

    @classmethod
    def from_dict(cls, d: dict, *, where: str = "config.json") -> "DistilBertConfig":
        """Read a Hugging Face DistilBERT `config.json` (as a dict); unsupported features raise.

        Examples:
            >>> DistilBertConfig.from_dict({"dim": 64, "n_heads": 4, "n_layers": 2}).n_layers
            2
        """
        if not isinstance(d, dict):
            raise QkvError(f"{where} must hold a JSON object, got {type(d).__name__}")
        cfg.check_architecture(d, "distilbert", DISTILBERT_ARCHITECTURES, where=where)
        cfg.get_bool(d, "sinusoidal_pos_embds", False, where=where)  # either way: stored weights
        return cls(**cfg.read_fields(cls, d, [f.name for f in fields(cls)], where=where,
                                     activations={"activation": "gelu"},
                                     may_be_zero=("pad_token_id",)))


class DistilBertEmbeddings(nn.Module):
    """`LayerNorm(word[id] + position[p])` for every token: no token types."""

    def __init__(self, config: DistilBertConfig):
        super().__init__()
        E = config.dim
        self.word = nn.Embedding(config.vocab_size, E)
        self.position = LearnedPositionalEmbedding(config.max_position_embeddings, E)
        self.norm = nn.LayerNorm(E, eps=1e-12)

    offset = 0

    def tables(self) -> dict[str, nn.Module]:
        """The tables summed, by name: no token types."""
        return {"token": self.word, "position": self.position}

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """(b, t) ids → (b, t, E). `token_type_ids`, if given, must be all 0: DistilBERT has
        no segments. `position_ids` (b, t) or (t,) as `BertEmbeddings`."""
        if token_type_ids is not None and bool(token_type_ids.any()):
            raise ValueError("DistilBERT has no token types: token_type_ids must be None or all 0")
        x = self.word(input_ids)  # (b, t, E)
        if position_ids is None:
            return self.norm(self.position(x))
        return self.norm(x + self.position.weight[position_ids])


class DistilBertModel(BertModel):
    """A DistilBERT encoder: BERT's layers and forward, `DistilBertEmbeddings`.

    `config` is the `DistilBertConfig` (with BERT's names as read-only aliases).

    Examples:
        >>> model = DistilBertModel(DistilBertConfig(vocab_size=50, dim=32, n_layers=2, n_heads=4,
        ...                                          hidden_dim=64, max_position_embeddings=20))
        >>> model(torch.tensor([[1, 7, 8, 2]])).last_hidden_state.shape
        torch.Size([1, 4, 32])
    """

    def __init__(self, config: DistilBertConfig, *, tokenizer=None, name: str = "distilbert",
                 max_seq_length: int | None = None):
        super().__init__(config.as_bert(), tokenizer=tokenizer, name=name,
                         max_seq_length=max_seq_length)
        self.config = config  # BertModel's methods read it through the BERT-named properties
        self.embeddings = DistilBertEmbeddings(config)


# -- the checkpoint mapping ---------------------------------------------------------------------
LAYER_NAMES = {  # Hugging Face name within transformer.layer.N → qkv's within encoder.layers.N
    "attention.q_lin": "self_attn.q_proj", "attention.k_lin": "self_attn.k_proj",
    "attention.v_lin": "self_attn.v_proj", "attention.out_lin": "self_attn.out_proj",
    "sa_layer_norm": "norm1", "ffn.lin1": "feed_forward.fc1", "ffn.lin2": "feed_forward.fc2",
    "output_layer_norm": "norm3",
}


def distilbert_shapes(c: DistilBertConfig) -> Shapes:
    E, F = c.dim, c.hidden_dim
    shapes = {"embeddings.word_embeddings.weight": (c.vocab_size, E),
              "embeddings.position_embeddings.weight": (c.max_position_embeddings, E),
              "embeddings.LayerNorm.weight": (E,), "embeddings.LayerNorm.bias": (E,)}
    sizes = {"attention.q_lin": (E, E), "attention.k_lin": (E, E), "attention.v_lin": (E, E),
             "attention.out_lin": (E, E), "ffn.lin1": (F, E), "ffn.lin2": (E, F),
             "sa_layer_norm": (E,), "output_layer_norm": (E,)}
    for i in range(c.n_layers):
        for name, shape in sizes.items():
            shapes[f"transformer.layer.{i}.{name}.weight"] = shape
            shapes[f"transformer.layer.{i}.{name}.bias"] = (shape[0],)
    return shapes


def distilbert_convert(tensors: Tensors, c: DistilBertConfig) -> Tensors:
    embeddings = {"word_embeddings": "word", "position_embeddings": "position", "LayerNorm": "norm"}
    layer = re.compile(r"^transformer\.layer\.(\d+)\.(.+)\.(weight|bias)$")
    state = {}
    for name, x in tensors.items():
        if m := re.match(r"^embeddings\.(\w+)\.(weight|bias)$", name):
            state[f"embeddings.{embeddings[m[1]]}.{m[2]}"] = x
        elif m := layer.match(name):
            state[f"encoder.layers.{m[1]}.{LAYER_NAMES[m[2]]}.{m[3]}"] = x
        else:  # distilbert_shapes and this function disagree: a bug here, not in the input
            raise AssertionError(f"no qkv name for DistilBERT tensor {name!r}")
    return state


def build(config: DistilBertConfig, *, tokenizer=None, name: str = "distilbert",
          directory: str | None = None) -> DistilBertModel:
    return DistilBertModel(config, tokenizer=tokenizer, name=name,
                           max_seq_length=bert.sentence_length(directory, config.max_position_embeddings))


FAMILY = Family(
    config_from_dict=DistilBertConfig.from_dict, build=build,
    max_length=lambda c: c.max_position_embeddings, prefix="distilbert.", shapes=distilbert_shapes,
    # position_ids: a saved buffer; vocab_*: the masked-LM head the encoder does not use
    ignored=re.compile(r"^(embeddings\.position_ids|vocab_(transform|layer_norm|projector)\..*)$"),
    convert=distilbert_convert,
    layers_key="n_layers",
)
