"""BERT (Devlin et al., 2019): an encoder of post-norm layers, built from qkv's modules.

```text
input_ids ─► word + token-type + position embeddings ─► LayerNorm ─► hidden_states[0]
             ┌───────────────────────────────────────────────────────────────┐
layer L:     │ x = norm1(x + self_attn(x))     (every token sees every token) │ × num_layers
             │ x = norm3(x + ff(x))            (GELU)                         │
             └───────────────────────────────────────────────────────────────┘
```

It reads Hugging Face BERT checkpoints (`qkv.models.load`) and computes the same numbers
(tested against `transformers` and `sentence-transformers` on all-MiniLM-L6-v2).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
import os
import re
from typing import Sequence

import torch
from torch import nn

from qkv.errors import QkvError
from qkv.files import read_json
from qkv.models import config as cfg
from qkv.attention.attention_mask import AttentionMask, VarLen
from qkv.models.family import Family, Shapes, Tensors
from qkv.models.outputs import EncoderOutput
from qkv.models.parts import model_parts
from qkv.modules.stack import stop_note
from qkv.models.protocol import ENCODER, ModelParts
from qkv.modules import Interventions, LearnedPositionalEmbedding, TransformerLayer, TransformerStack

# Hugging Face classes whose checkpoints hold a plain BERT encoder (heads, if any, are ignored).
BERT_ARCHITECTURES = ("BertModel", "BertForMaskedLM", "BertForPreTraining")


@dataclass(frozen=True)
class BertConfig:
    """The sizes of a BERT model; field names and defaults are Hugging Face's `config.json`."""

    vocab_size: int = 30522
    hidden_size: int = 768  # E
    num_hidden_layers: int = 12
    num_attention_heads: int = 12  # h; head dim d = E / h
    intermediate_size: int = 3072  # the feed-forward's hidden width
    hidden_act: str = "gelu"  # a qkv.modules.FeedForward activation name
    max_position_embeddings: int = 512  # the most tokens a text may have
    type_vocab_size: int = 2  # segment A / B
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0

    def __post_init__(self):
        if self.hidden_size % self.num_attention_heads:
            raise QkvError(f"hidden_size ({self.hidden_size}) must be divisible by "
                           f"num_attention_heads ({self.num_attention_heads})")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_dict(cls, d: dict, *, where: str = "config.json") -> "BertConfig":
        """Read a Hugging Face BERT `config.json` (as a dict); unsupported features raise.

        Examples:
            >>> BertConfig.from_dict({"hidden_size": 384, "num_hidden_layers": 6}).head_dim
            32
        """
        return read_config(cls, d, "bert", BERT_ARCHITECTURES, where=where)


def read_config(cls: type, d: dict, model_type: str, architectures: tuple[str, ...], *,
                where: str = "config.json"):
    """A BERT-layout `config.json` (BERT, RoBERTa) → `cls`; a missing field takes `cls`'s
    own default, and the variants qkv's encoder does not implement raise."""
    if not isinstance(d, dict):
        raise QkvError(f"{where} must hold a JSON object, got {type(d).__name__}")
    cfg.check_architecture(d, model_type, architectures, where=where)
    cfg.require(d, "position_embedding_type", "absolute", where=where)
    cfg.require(d, "is_decoder", False, where=where)
    cfg.require(d, "add_cross_attention", False, where=where)
    # hidden_act: Hugging Face's default name is qkv's own (gelu), the field's default
    return cls(**cfg.read_fields(cls, d, [f.name for f in fields(cls)], where=where,
                                 activations={"hidden_act": cls.hidden_act},
                                 may_be_zero=("pad_token_id",)))


class BertEmbeddings(nn.Module):
    """`LayerNorm(word[id] + token_type[type] + position[p])` for every token."""

    def __init__(self, config: BertConfig):
        super().__init__()
        E = config.hidden_size
        self.word = nn.Embedding(config.vocab_size, E)
        self.token_type = nn.Embedding(config.type_vocab_size, E)
        self.position = LearnedPositionalEmbedding(config.max_position_embeddings, E)
        self.norm = nn.LayerNorm(E, eps=config.layer_norm_eps)

    offset = 0  # the position table's row of position 0 (RoBERTa's is 2)

    def tables(self) -> dict[str, nn.Module]:
        """The tables summed, by name (what [`Embeddings`][qkv.models.protocol.Embeddings] holds)."""
        return {"token": self.word, "position": self.position, "type": self.token_type}

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """(b, t) ids → (b, t, E). Summed in Hugging Face's order (word + type, then position).

        `position_ids` (b, t) or (t,): each token's position (default 0 … t − 1); packed
        sequences restart at 0 for every sequence.
        """
        x = self.word(input_ids) + self.token_type(token_type_ids)  # (b, t, E)
        if position_ids is None:
            return self.norm(self.position(x))
        return self.norm(x + self.position.weight[position_ids])


class BertModel(nn.Module):
    """A BERT encoder: embeddings and `num_hidden_layers` post-norm
    [`TransformerLayer`][qkv.modules.transformer.TransformerLayer].

    Layer L, head H's query weights are `model.layers[L].self_attn.q_proj.weight[H*d:(H+1)*d]`
    (nn.Linear convention, q = x Wᵀ + b), and the vector projected into that query is
    `hidden_states[L]` itself (post-norm: nothing stands between a layer's input and its
    projections).

    Fields besides the modules: `config`; `tokenizer` (a
    [`qkv.models.Tokenizer`][qkv.models.Tokenizer], or None), `name` (for messages) and
    `max_seq_length` (the sentence-embedding length limit, default the position table's size) —
    given to the constructor; `qkv.models.load` passes them from the checkpoint directory.

    Examples:
        >>> model = BertModel(BertConfig(hidden_size=32, num_hidden_layers=2,
        ...                              num_attention_heads=4, intermediate_size=64))
        >>> out = model(torch.tensor([[101, 7, 8, 102]]), output_hidden_states=True)
        >>> out.last_hidden_state.shape, len(out.hidden_states)
        (torch.Size([1, 4, 32]), 3)
    """

    capabilities = ENCODER  # the one model protocol (qkv.models.protocol)

    def stop_note(self, layer: int) -> str:
        """Why the forward cannot stop after `layer` ("" where it can):
        `qkv.modules.stack.stop_note`, the stack's rule."""
        return stop_note(self.layers, layer)

    def __init__(self, config: BertConfig, *, tokenizer=None, name: str = "bert",
                 max_seq_length: int | None = None):
        super().__init__()
        self.config = config
        self.name = name
        self.tokenizer = tokenizer
        self.max_seq_length = max_seq_length or config.max_position_embeddings
        self.embeddings = BertEmbeddings(config)
        self.encoder = TransformerStack(
            TransformerLayer.build(
                config.hidden_size, config.num_attention_heads, config.intermediate_size,
                norm_first=False, norm_eps=config.layer_norm_eps, activation=config.hidden_act,
            )
            for _ in range(config.num_hidden_layers)
        )

    @property
    def layers(self) -> nn.ModuleList:
        """The encoder's layers: `model.layers[L].self_attn` is layer L's attention."""
        return self.encoder.layers

    @property
    def parts(self) -> ModelParts:
        """Every part an explanation reads: the embedding tables and their norm, each layer's
        parts; no read-out (an encoder)."""
        e = self.embeddings
        return model_parts(self.layers, e.tables(), norm=e.norm, offset=e.offset)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, *, varlen: VarLen | None = None,
                trace_rows: torch.Tensor | slice | None = None,
                output_hidden_states: bool = False,
                interventions: Interventions | None = None) -> EncoderOutput:
        """Encode a batch of token ids.

        Args:
            input_ids: (b, t) token ids.
            attention_mask: (b, t), 1/True for real tokens and 0/False for padding; padding
                keys are masked out, so padding never changes a real token's result.
            token_type_ids: (b, t) segment ids (default all 0).
            varlen: packed sequences instead of a padded batch: `input_ids` is (1, N), the
                texts' tokens one after another ([`VarLen`][qkv.attention.VarLen]); every linear
                map then runs on real tokens only, and attention stays within each text.
            trace_rows: query positions (LongTensor, or `slice(None)` for all) whose
                attention to record in every layer; the traced layers compute with the
                reference attention path: the same numbers up to float roundings (tests bound them
                by transformers' own float32 error).
            output_hidden_states: also return what enters each layer.
            interventions: heads zeroed or replaced, value vectors zeroed, layer inputs patched
                (`Interventions`, handed to the layer stack).

        Returns:
            An `EncoderOutput`.
        """
        b, t = self._check_ids(input_ids, varlen)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        elif token_type_ids.shape != input_ids.shape:
            raise ValueError(f"token_type_ids must have the shape of input_ids {(b, t)}, "
                             f"got {tuple(token_type_ids.shape)}")
        if varlen is not None:
            if attention_mask is not None:
                raise ValueError("packed sequences (varlen) have no padding: pass attention_mask=None")
            mask, positions = AttentionMask(varlen=varlen), varlen.position  # positions (N,)
        else:
            mask, positions = AttentionMask(key_padding=_key_padding_mask(attention_mask, b, t)), None
        x = self.embeddings(input_ids, token_type_ids, positions)  # (b, t, E)
        out = self.encoder(x, mask=mask, trace_rows=trace_rows,
                           output_hidden_states=output_hidden_states, interventions=interventions)
        return EncoderOutput(out.last_hidden_state, out.hidden_states, out.traces)

    def _check_ids(self, input_ids: torch.Tensor, varlen: VarLen | None = None) -> tuple[int, int]:
        if not isinstance(input_ids, torch.Tensor) or input_ids.ndim != 2 or input_ids.is_floating_point():
            shape = tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
            raise ValueError(f"input_ids must be an integer tensor (batch, tokens), got {shape}")
        b, t = input_ids.shape
        if varlen is not None and (b != 1 or t != varlen.total):
            raise ValueError(f"with varlen, input_ids must be (1, N) = (1, {varlen.total}), got {(b, t)}")
        limit = self.config.max_position_embeddings
        t = varlen.max_len if varlen is not None else t
        if t > limit:
            raise QkvError(f"input is {t} tokens; {self.name} takes at most {limit} "
                           f"(max_position_embeddings)")
        if input_ids.numel() and not 0 <= int(input_ids.min()) <= int(input_ids.max()) < self.config.vocab_size:
            raise QkvError(f"token ids must be in [0, {self.config.vocab_size}), got "
                           f"{int(input_ids.min())}..{int(input_ids.max())}")
        return b, t

    # -- sentence embeddings ---------------------------------------------------------------
    @torch.inference_mode()
    def embed(self, texts: Sequence[str], batch_size: int = 32, *, truncate: bool = False) -> torch.Tensor:
        """Sentence embeddings: the mean of the last layer over real tokens, L2-normalised.

        This is sentence-transformers' recipe for all-MiniLM-L6-v2 (same numbers to 1e-5).
        Texts are sorted by length and each batch runs packed, without padding, through the
        model's one forward (`varlen`, see [`VarLen`][qkv.attention.VarLen]). A text longer than
        `self.max_seq_length` tokens raises a `QkvError`, or with `truncate=True` is cut to it with
        a warning (sentence-transformers cuts silently).

        `texts`: a sequence of strings, or one string — one text, as sentence-transformers
        reads it (never its characters).

        Returns:
            (n, E) float tensor, rows in the order of `texts`, each of unit length; (E,) for
            one string.

        Examples:
            >>> model = qkv.models.load("minilm")                     # doctest: +SKIP
            >>> e = model.embed(["a cat", "a kitten", "tax law"])     # doctest: +SKIP
            >>> (e[0] @ e[1]) > (e[0] @ e[2])                         # doctest: +SKIP
            tensor(True)
        """
        if self.tokenizer is None:
            raise QkvError("embed needs a tokenizer: load the model with qkv.models.load(...)")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if isinstance(texts, str):  # one text; list("the cat") would embed 7 characters
            return self.embed([texts], batch_size, truncate=truncate)[0]
        if texts is None or isinstance(texts, (bytes, bytearray)) or not hasattr(texts, "__iter__"):
            raise QkvError(f"texts must be a string or a list of strings, got "
                           f"{type(texts).__name__} {texts!r:.60}")
        texts = list(texts)
        encodings = self.tokenizer.encode_batch(texts, max_length=self.max_seq_length,
                                                truncate=truncate).encodings if texts else []
        weight = self.embeddings.word.weight
        out = torch.empty(len(texts), self.config.hidden_size, dtype=weight.dtype, device=weight.device)
        # Longest first, as sentence-transformers does: similar lengths share a batch.
        order = sorted(range(len(texts)), key=lambda i: -len(encodings[i]))
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            out[chunk] = self.mean_pooled([encodings[i].ids for i in chunk])
        return nn.functional.normalize(out.float(), p=2, dim=-1).to(weight.dtype)

    def mean_pooled(self, ids: Sequence[Sequence[int]]) -> torch.Tensor:
        """Token ids of n texts → (n, E): each text's mean last-layer vector over its tokens
        (specials included, as sentence-transformers does), computed packed (no padding)."""
        device = self.embeddings.word.weight.device
        varlen = VarLen.from_lengths([len(s) for s in ids], device=device)
        flat = torch.tensor([[i for s in ids for i in s]], dtype=torch.long, device=device)  # (1, N)
        x = self(flat, varlen=varlen).last_hidden_state[0]  # (N, E)
        sums = x.new_zeros(len(ids), x.shape[-1]).index_add_(0, varlen.sequence, x)  # (n, E)
        return sums / torch.tensor(varlen.lengths, dtype=x.dtype, device=device)[:, None]


def _key_padding_mask(attention_mask: torch.Tensor | None, b: int, t: int) -> torch.Tensor | None:
    """(b, t) 1/0 → (b, t) bool True for real tokens; None when nothing is padding (so the
    attention can take its unmasked kernel)."""
    if attention_mask is None:
        return None
    if attention_mask.shape != (b, t):
        raise ValueError(f"attention_mask must be (batch, tokens) = {(b, t)}, got "
                         f"{tuple(attention_mask.shape)}")
    mask = attention_mask.bool()
    return None if bool(mask.all()) else mask


# -- the checkpoint mapping ---------------------------------------------------------------------
def bert_shapes(c: BertConfig) -> Shapes:
    E, F = c.hidden_size, c.intermediate_size
    shapes = {
        "embeddings.word_embeddings.weight": (c.vocab_size, E),
        "embeddings.position_embeddings.weight": (c.max_position_embeddings, E),
        "embeddings.token_type_embeddings.weight": (c.type_vocab_size, E),
        "embeddings.LayerNorm.weight": (E,), "embeddings.LayerNorm.bias": (E,),
    }
    for i in range(c.num_hidden_layers):
        p = f"encoder.layer.{i}."
        for name in ("attention.self.query", "attention.self.key", "attention.self.value",
                     "attention.output.dense"):
            shapes[p + name + ".weight"], shapes[p + name + ".bias"] = (E, E), (E,)
        shapes[p + "intermediate.dense.weight"], shapes[p + "intermediate.dense.bias"] = (F, E), (F,)
        shapes[p + "output.dense.weight"], shapes[p + "output.dense.bias"] = (E, F), (E,)
        for norm in ("attention.output.LayerNorm", "output.LayerNorm"):
            shapes[p + norm + ".weight"], shapes[p + norm + ".bias"] = (E,), (E,)
    return shapes


BERT_RENAMES = [  # Hugging Face name → qkv module path (regex, replacement)
    (r"^embeddings\.word_embeddings\.", "embeddings.word."),
    (r"^embeddings\.position_embeddings\.", "embeddings.position."),
    (r"^embeddings\.token_type_embeddings\.", "embeddings.token_type."),
    (r"^embeddings\.LayerNorm\.", "embeddings.norm."),
    (r"^encoder\.layer\.(\d+)\.attention\.self\.query\.", r"encoder.layers.\1.self_attn.q_proj."),
    (r"^encoder\.layer\.(\d+)\.attention\.self\.key\.", r"encoder.layers.\1.self_attn.k_proj."),
    (r"^encoder\.layer\.(\d+)\.attention\.self\.value\.", r"encoder.layers.\1.self_attn.v_proj."),
    (r"^encoder\.layer\.(\d+)\.attention\.output\.dense\.", r"encoder.layers.\1.self_attn.out_proj."),
    (r"^encoder\.layer\.(\d+)\.attention\.output\.LayerNorm\.", r"encoder.layers.\1.norm1."),
    (r"^encoder\.layer\.(\d+)\.intermediate\.dense\.", r"encoder.layers.\1.feed_forward.fc1."),
    (r"^encoder\.layer\.(\d+)\.output\.dense\.", r"encoder.layers.\1.feed_forward.fc2."),
    (r"^encoder\.layer\.(\d+)\.output\.LayerNorm\.", r"encoder.layers.\1.norm3."),
]


def bert_convert(tensors: Tensors, c: BertConfig) -> Tensors:
    state = {}
    for name, x in tensors.items():
        for pattern, repl in BERT_RENAMES:
            new, n = re.subn(pattern, repl, name)
            if n:
                state[new] = x
                break
        else:  # bert_shapes and BERT_RENAMES disagree: a bug in this file, not in the input
            raise AssertionError(f"no qkv name for BERT tensor {name!r}")
    return state


def sentence_length(directory: str | None, limit: int) -> int:
    """sentence-transformers' max_seq_length (all-MiniLM-L6-v2: 256), else the model's limit."""
    file = os.path.join(directory, "sentence_bert_config.json") if directory else None
    if file is None or not os.path.isfile(file):
        return limit
    config = read_json(file)
    value = config.get("max_seq_length") if isinstance(config, dict) else None
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= limit:
        return value
    return limit


def build(config: BertConfig, *, tokenizer=None, name: str = "bert", directory: str | None = None) -> BertModel:
    return BertModel(config, tokenizer=tokenizer, name=name,
                     max_seq_length=sentence_length(directory, config.max_position_embeddings))


FAMILY = Family(
    config_from_dict=BertConfig.from_dict, build=build,
    max_length=lambda c: c.max_position_embeddings, prefix="bert.", shapes=bert_shapes,
    # position_ids: a saved arange buffer; pooler / cls: heads qkv's encoder does not use
    ignored=re.compile(r"^(embeddings\.position_ids|pooler\..*|cls\..*)$"),
    convert=bert_convert,
)
