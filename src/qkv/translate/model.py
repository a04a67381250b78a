"""The encoder-decoder Transformer of Vaswani et al. (2017), for the toy English→French grammar.

```text
English ids ─ embed·√d + PE ─ [encoder layer] × N ─────────────┐ memory (b, s, E)
                                                               │
French ids ── embed·√d + PE ─ [decoder layer] × N ─ generator ─ logits (b, t, V_fr)
  ([BOS] y_1 … y_{t-1})        self-attn (causal)
                               cross-attn: queries from French, keys/values from memory
                               feed-forward
```

Encoder and decoder layers are the same [`TransformerLayer`][qkv.modules.TransformerLayer]; a
decoder layer is built with `cross_attention=True` and called with `is_causal=True`. Decoding keeps
a [`KVCache`][qkv.modules.KVCache] per decoder layer for the self-attention, and one per layer for
the cross-attention keys and values of the memory, which are projected once per sentence.

Dimension letters: b batch, s English length, t French length, E = d_model, V vocabulary size.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, fields

import torch
from torch import nn

from qkv.attention.attention_mask import AttentionMask
from qkv.errors import QkvError
from qkv.models.protocol import TRANSLATION, CrossPass, Gold, TooLong
from qkv.modules import (
    KVCache, LayerTrace, SinusoidalPositionalEncoding, StackOutput, TransformerLayer, TransformerStack,
)


@dataclass(frozen=True)
class TranslationConfig:
    """Sizes of a `TranslationModel`. Defaults: the shipped model.

    Examples:
        >>> TranslationConfig(src_vocab_size=64, tgt_vocab_size=90).head_dim
        32
    """

    src_vocab_size: int
    tgt_vocab_size: int
    d_model: int = 128  # E: width of every token vector
    num_heads: int = 4  # E / h = 32 dims per head
    encoder_layers: int = 3
    decoder_layers: int = 3
    ff_dim: int = 256  # hidden width of each feed-forward block
    dropout: float = 0.0  # on embeddings, attention weights and every residual branch
    activation: str = "relu"  # Vaswani's choice
    norm_first: bool = False  # post-norm, as in the paper
    max_len: int = 64  # positions the sinusoidal table covers (tokens + [BOS]/[EOS])
    tie_embeddings: bool = True  # generator shares the French embedding matrix (paper §3.4)
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2

    def __post_init__(self) -> None:
        for name in ("src_vocab_size", "tgt_vocab_size", "d_model", "num_heads", "encoder_layers",
                     "decoder_layers", "ff_dim", "max_len"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.d_model % self.num_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by num_heads ({self.num_heads})")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TranslationConfig":
        """Build from a JSON object; QkvError naming unknown or missing keys and bad values."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise QkvError(f"unknown translation model config keys: {', '.join(unknown)}")
        try:
            return cls(**d)
        except (TypeError, ValueError) as e:
            raise QkvError(f"bad translation model config: {e}") from None


@dataclass
class DecoderState:
    """What incremental decoding carries from one step to the next.

    Attributes:
        memory: (b, s, E) the encoder output. memory_mask: (b, s) True for real English tokens.
        self_caches: one KVCache per decoder layer, the French tokens so far.
        cross_caches: one KVCache per decoder layer, the memory's projected keys and values.
    """

    memory: torch.Tensor
    memory_mask: torch.Tensor
    self_caches: list[KVCache]
    cross_caches: list[KVCache]

    @property
    def length(self) -> int:
        """How many French positions have been decoded."""
        return len(self.self_caches[0])

    def reorder(self, index: torch.Tensor) -> None:
        """Keep batch rows `index` (beam search), in every cache and in the memory."""
        for cache in (*self.self_caches, *self.cross_caches):
            cache.reorder(index)
        self.memory = self.memory.index_select(0, index)
        self.memory_mask = self.memory_mask.index_select(0, index)


@dataclass(frozen=True)
class TranslationTrace:
    """The attention traces of one teacher-forced forward pass.

    `encoder[l]` and `decoder[l]` are layer `l`'s `LayerTrace`; the
    decoder's `cross_attn.attention.weights` (b, h, t, s) is where each French position looked
    in the English sentence.
    """

    encoder: list[LayerTrace]
    decoder: list[LayerTrace]


class TranslationModel(nn.Module):
    """Encoder-decoder Transformer: English ids (b, s) and French ids (b, t) → logits (b, t, V).

    `qkv.load("translate")` gives the shipped model with `vocab`, `name` and `directory`
    set (its constructor's keywords).

    Examples:
        >>> cfg = TranslationConfig(src_vocab_size=20, tgt_vocab_size=30, d_model=16, num_heads=2,
        ...                         encoder_layers=1, decoder_layers=1, ff_dim=32)
        >>> model = TranslationModel(cfg)
        >>> src, tgt = torch.randint(4, 20, (2, 7)), torch.randint(4, 30, (2, 5))
        >>> model(src, tgt).shape                        # (b, t, V_fr)
        torch.Size([2, 5, 30])
    """

    capabilities = TRANSLATION  # the one model protocol (qkv.models.protocol)

    def __init__(self, config: TranslationConfig, *, vocab=None, name: str = "translation",
                 directory=None):
        super().__init__()
        c = self.config = config
        # what qkv.load sets from the checkpoint: its English/French vocabularies
        # (qkv.translate.vocab.Vocab), a name for messages and the directory it came from
        self.vocab, self.name, self.directory = vocab, name, directory
        self.src_embed = nn.Embedding(c.src_vocab_size, c.d_model)
        self.tgt_embed = nn.Embedding(c.tgt_vocab_size, c.d_model)
        self.positions = SinusoidalPositionalEncoding(c.d_model, c.max_len)
        # Pre-norm stacks end with a final LayerNorm; post-norm layers already end with one.
        self.encoder = TransformerStack((self._layer(cross=False) for _ in range(c.encoder_layers)),
                                        norm=nn.LayerNorm(c.d_model) if c.norm_first else None)
        self.decoder = TransformerStack((self._layer(cross=True) for _ in range(c.decoder_layers)),
                                        norm=nn.LayerNorm(c.d_model) if c.norm_first else None)
        self.generator = nn.Linear(c.d_model, c.tgt_vocab_size, bias=False)
        self.dropout = nn.Dropout(c.dropout)
        self._init_weights()

    def _layer(self, cross: bool) -> TransformerLayer:
        c = self.config
        return TransformerLayer.build(c.d_model, c.num_heads, c.ff_dim, cross_attention=cross,
                                      norm_first=c.norm_first, dropout=c.dropout,
                                      activation=c.activation)

    def _init_weights(self) -> None:
        # Embeddings ~ N(0, 1/E), so that after the ×√E scaling tokens have unit variance, like
        # the positional encodings they are added to (tensor2tensor's choice for the paper).
        for emb in (self.src_embed, self.tgt_embed):
            nn.init.normal_(emb.weight, std=self.config.d_model ** -0.5)
        for name, p in self.named_parameters():
            if p.ndim == 2 and "embed" not in name and "generator" not in name:
                nn.init.xavier_uniform_(p)
        if self.config.tie_embeddings:
            self.generator.weight = self.tgt_embed.weight

    # -- the three steps ---------------------------------------------------------------------
    def embed(self, embedding: nn.Embedding, ids: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """ids (b, n) → dropout(embedding · √E + PE[offset : offset + n]), (b, n, E)."""
        if ids.shape[-1] + offset > self.config.max_len:
            raise QkvError(f"sentence of {ids.shape[-1] + offset} tokens is longer than the "
                           f"model's {self.config.max_len} positions")
        x = embedding(ids) * math.sqrt(self.config.d_model)  # (b, n, E)
        return self.dropout(self.positions(x, offset=offset))

    def encode(self, src: torch.Tensor) -> torch.Tensor:
        """src (b, s) → memory (b, s, E), the encoder's output."""
        return self._encode(src).last_hidden_state

    def decode(self, tgt: torch.Tensor, memory: torch.Tensor, memory_mask: torch.Tensor) -> torch.Tensor:
        """Teacher-forced: tgt (b, t) French inputs → logits (b, t, V).

        The decoder's self-attention is causal; French padding sits after the real tokens, so
        causality alone keeps real positions from seeing it (its outputs are never scored).
        `memory_mask` (b, s) is True for real English tokens.
        """
        return self.generator(self._decode(tgt, memory, memory_mask).last_hidden_state)

    def _encode(self, src: torch.Tensor, trace_rows=None) -> StackOutput:
        x = self.embed(self.src_embed, src)  # (b, s, E)
        mask = AttentionMask(key_padding=src != self.config.pad_id)  # (b, s) True for real tokens
        return self.encoder(x, mask=mask, trace_rows=trace_rows)

    def _decode(self, tgt: torch.Tensor, memory: torch.Tensor, memory_mask: torch.Tensor,
                trace_rows=None) -> StackOutput:
        x = self.embed(self.tgt_embed, tgt)  # (b, t, E)
        return self.decoder(x, mask=AttentionMask(causal=True), memory=memory,
                            memory_mask=AttentionMask(key_padding=memory_mask), trace_rows=trace_rows)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        """src (b, s) English ids + [EOS]; tgt (b, t) [BOS] + French ids → logits (b, t, V)."""
        memory = self.encode(src)
        return self.decode(tgt, memory, src != self.config.pad_id)

    def trace(self, src: torch.Tensor, tgt: torch.Tensor) -> tuple[torch.Tensor, TranslationTrace]:
        """The forward pass with every attention intermediate kept: `(logits, trace)`."""
        enc = self._encode(src, trace_rows=slice(None))
        dec = self._decode(tgt, enc.last_hidden_state, src != self.config.pad_id, trace_rows=slice(None))
        return self.generator(dec.last_hidden_state), TranslationTrace(encoder=enc.traces, decoder=dec.traces)

    # -- incremental decoding ----------------------------------------------------------------
    def start(self, src: torch.Tensor, max_new: int) -> DecoderState:
        """Encode `src` (b, s) and allocate the caches for up to `max_new` French tokens."""
        memory = self.encode(src)  # (b, s, E)
        b, s, _ = memory.shape
        c, kw = self.config, dict(dtype=memory.dtype, device=memory.device)
        self_caches = [KVCache(b, c.num_heads, c.head_dim, max_new, **kw) for _ in self.decoder]
        cross_caches = [KVCache(b, c.num_heads, c.head_dim, s, **kw) for _ in self.decoder]
        return DecoderState(memory, src != c.pad_id, self_caches, cross_caches)

    def step(self, tokens: torch.Tensor, state: DecoderState) -> torch.Tensor:
        """Feed the next French tokens (b, n) (n = 1 when generating) → logits (b, n, V).

        Positions continue from `state.length`; the caches grow by n.
        """
        x = self.embed(self.tgt_embed, tokens, offset=state.length)  # (b, n, E)
        # causal, bottom-right: the n new tokens are the last of the cached positions
        out = self.decoder(x, mask=AttentionMask(causal=True, alignment="bottom_right"),
                           memory=state.memory, memory_mask=AttentionMask(key_padding=state.memory_mask),
                           kv_caches=state.self_caches, memory_kv_caches=state.cross_caches)
        return self.generator(out.last_hidden_state)  # (b, n, V)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    # -- the cross-attention protocol (qkv.models.protocol.CrossPass) -------------------------
    @property
    def cross_layers(self) -> nn.ModuleList:
        """The decoder's layers, as the protocol names them: `cross_attn` and `norm_first`."""
        return self.decoder.layers

    @property
    def cross_shape(self) -> tuple[int, int]:
        """(decoder layers, heads per layer)."""
        return self.config.decoder_layers, self.config.num_heads

    def translate(self, texts: list[str], *, beam: int = 1) -> list[str]:
        """French for each English text (greedy, or beam search of width `beam`)."""
        from qkv.translate.decode import translate  # translate/ imports this module

        return translate(self, self.vocab, texts, beam=beam)

    @torch.no_grad()
    def cross_pass(self, text: str, target: str | None = None) -> CrossPass:
        """One traced forward over `target` (None: this model's greedy translation of `text`).

        QkvError for an empty text or unknown English words;
        [`TooLong`][qkv.models.protocol.TooLong] when the French needs more than `config.max_len`
        positions.
        """
        from qkv.translate.decode import greedy_decode
        from qkv.translate.vocab import BOS_ID, EOS, EOS_ID

        vocab = self.vocab
        src = torch.tensor([vocab.encode_en(text)])  # (1, s)
        if src.shape[1] > self.config.max_len:
            raise TooLong("text", src.shape[1], self.config.max_len, self.name)
        if target is None:
            generated = greedy_decode(self, src)[0].tolist()
            ids = generated[: generated.index(EOS_ID) + 1] if EOS_ID in generated else generated
        else:
            ids = vocab.encode_fr(target)[1:]  # French ids + [EOS]: what the loss scores
            if len(ids) > self.config.max_len:
                raise TooLong("target", len(ids), self.config.max_len, self.name)
        tgt_in = torch.tensor([[BOS_ID] + ids[:-1]])  # (1, t): position j reads token j−1
        _, trace = self.trace(src, tgt_in)
        def stack(layers, part):  # (L, H, ·, ·)
            return torch.stack([getattr(layer, part).attention.weights[0] for layer in layers])
        words = vocab.fr_tokens(ids)
        ends = bool(ids) and ids[-1] == EOS_ID
        return CrossPass(source=vocab.en_tokens(src[0].tolist()) + [EOS], target=words + [EOS] * ends,
                         special=[False] * len(words) + [True] * ends, words=words,
                         translation=vocab.decode_fr(ids), cross=stack(trace.decoder, "cross_attn"),
                         encoder=stack(trace.encoder, "self_attn"),
                         decoder=stack(trace.decoder, "self_attn"), trace=trace)

    def gold_alignment(self, text: str) -> Gold:
        """The grammar this model learns gives every sentence's gold alignment
        (`qkv.translate.gold.grammar_gold`): its French tokens and, per French token, the
        English token indices it translates; a sentence saying why when `text` is not one of
        the grammar's."""
        from qkv.translate.gold import grammar_gold  # translate/ imports this module

        return grammar_gold(text)


def upgrade_state_dict(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Checkpoints written before the layer stack (format 1) name layers `encoder.0.…` and
    the final norms `encoder_norm.…`; today's model has `encoder.layers.0.…` and
    `encoder.norm.…`. Renames the old names, leaves new ones alone."""
    out = {}
    for name, x in tensors.items():
        name = re.sub(r"^(encoder|decoder)\.(\d+)\.", r"\1.layers.\2.", name)
        name = re.sub(r"^(encoder|decoder)_norm\.", r"\1.norm.", name)
        out[name] = x
    return out
