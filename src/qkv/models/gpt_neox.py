"""GPT-NeoX (Black et al., 2022) and Pythia (Biderman et al., 2023): a pre-norm causal decoder
whose attention and feed-forward read the *same* input (parallel residual), with rotary
embeddings on only part of each head (`rotary_pct`).

```text
input_ids ─► token embedding ─► hidden_states[0]          (no position vectors are added)
             ┌─────────────────────────────────────────────────────────────────────┐
layer L:     │ x = x + self_attn(norm1(x)) + ff(norm3(x))   (use_parallel_residual)  │ × L
             │   — or, without it, GPT-2's two steps:                               │
             │ x = x + self_attn(norm1(x));  x = x + ff(norm3(x))                   │
             └─────────────────────────────────────────────────────────────────────┘
             ─► final LayerNorm ─► logits = x · Wᵀ   (W = embed_out, or the embedding if tied)

one head's query/key features:  [ rotated by RoPE (rotary_dim = d·rotary_pct) | as they are ]
```

Hugging Face stores q, k and v in one `query_key_value` matrix, interleaved *per head*:
rows `[q_0 k_0 v_0 q_1 k_1 v_1 …]`, each block d rows (`gpt_neox_convert` splits it).
Reads Hugging Face checkpoints (`qkv.load`); same logits, hidden states, attention and greedy
generations as `transformers` (tested).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch
from torch import nn

from qkv.attention.attention_mask import AttentionMask
from qkv.errors import QkvError
from qkv.models import config as cfg
from qkv.models.family import Family, Shapes, Tensors
from qkv.models.decoder import DecoderLM
from qkv.modules import FeedForward, KVCache, MultiHeadAttention, TransformerLayer, TransformerStack
from qkv.modules.positional import RotaryEmbedding
from qkv.modules.transformer import LayerOutput, LayerTrace

GPT_NEOX_ARCHITECTURES = ("GPTNeoXForCausalLM", "GPTNeoXModel")


@dataclass(frozen=True)
class GPTNeoXConfig:
    """The sizes and options of a GPT-NeoX / Pythia model; names follow Hugging Face's
    `config.json` (`rotary_pct` and `rotary_emb_base` also from transformers ≥ 5's
    `rope_parameters`).

    Examples:
        >>> c = GPTNeoXConfig(hidden_size=64, num_attention_heads=4, rotary_pct=0.25)
        >>> c.head_dim, c.rotary_dim
        (16, 4)
    """

    vocab_size: int = 50432
    hidden_size: int = 6144  # E
    num_hidden_layers: int = 44
    num_attention_heads: int = 64  # h; head dim d = E / h
    intermediate_size: int = 24576  # the feed-forward's hidden width
    hidden_act: str = "gelu"  # a qkv.modules.FeedForward activation name
    rotary_pct: float = 0.25  # the share of each head's features that RoPE rotates
    rotary_emb_base: float = 10000.0
    max_position_embeddings: int = 2048  # the most tokens (prompt + generated)
    layer_norm_eps: float = 1e-5
    use_parallel_residual: bool = True  # x + attn(norm1(x)) + ff(norm3(x))
    attention_bias: bool = True
    tie_word_embeddings: bool = False  # Pythia: a separate embed_out
    eos_token_id: tuple[int, ...] = field(default=())  # generation stops at any of these

    def __post_init__(self):
        if self.hidden_size % self.num_attention_heads:
            raise QkvError(f"hidden_size ({self.hidden_size}) must be divisible by "
                           f"num_attention_heads ({self.num_attention_heads})")
        if not 0.0 <= self.rotary_pct <= 1.0:
            raise QkvError(f"rotary_pct must be in [0, 1], got {self.rotary_pct}")
        if self.rotary_dim % 2:
            raise QkvError(f"rotary_pct ({self.rotary_pct}) × head_dim ({self.head_dim}) = "
                           f"{self.rotary_dim} rotary features; RoPE needs an even number")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def rotary_dim(self) -> int:
        """How many leading features of each head RoPE rotates (`int(d · rotary_pct)`, as HF)."""
        return int(self.head_dim * self.rotary_pct)

    @property
    def max_length(self) -> int:
        return self.max_position_embeddings

    @classmethod
    def from_dict(cls, d: dict, *, where: str = "config.json") -> "GPTNeoXConfig":
        """Read a Hugging Face GPT-NeoX `config.json` (as a dict); unsupported options raise.

        Examples:
            >>> GPTNeoXConfig.from_dict({"hidden_size": 64, "num_attention_heads": 4,
            ...                          "rotary_pct": 0.5}).rotary_dim
            8
        """
        if not isinstance(d, dict):
            raise QkvError(f"{where} must hold a JSON object, got {type(d).__name__}")
        cfg.check_architecture(d, "gpt_neox", GPT_NEOX_ARCHITECTURES, where=where)
        cfg.require(d, "is_encoder_decoder", False, where=where)
        pct, base = _read_rope(d, where)
        sizes = cfg.read_fields(cls, d, (
            "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
            "intermediate_size", "max_position_embeddings", "layer_norm_eps",
            "use_parallel_residual", "attention_bias", "tie_word_embeddings", "hidden_act"),
            where=where, activations={"hidden_act": cls.hidden_act})  # HF's default name is qkv's
        return cls(
            **sizes,
            rotary_pct=pct,
            rotary_emb_base=base,
            eos_token_id=cfg.get_token_ids(d, "eos_token_id", where=where),
        )


def _read_rope(d: dict, where: str) -> tuple[float, float]:
    """(rotary_pct, base) from transformers ≥ 5's `rope_parameters` or the older keys."""
    for key in ("rope_parameters", "rope_scaling"):
        value = d.get(key)
        if value is not None and not isinstance(value, dict):
            raise QkvError(f"{where}: {key} must be an object or null, got {value!r}")
        kind = (value or {}).get("rope_type", (value or {}).get("type", "default"))
        if kind != "default":
            raise QkvError(f"{where}: {key} type {kind!r} is not supported for GPT-NeoX (qkv "
                           f"runs its plain RoPE)")
    p = d.get("rope_parameters") or {}
    pct = p.get("partial_rotary_factor", d.get("rotary_pct", 0.25))
    base = p.get("rope_theta", d.get("rotary_emb_base", 10000.0))
    for key, value in (("rotary_pct", pct), ("rotary_emb_base", base)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise QkvError(f"{where}: {key} must be a non-negative number, got {value!r}")
    if not base > 0:
        raise QkvError(f"{where}: rotary_emb_base must be positive, got {base!r}")
    return float(pct), float(base)


class PartialRotary(nn.Module):
    """RoPE on the first `rotary_dim` features of every head; the others pass unrotated.

    Examples:
        >>> rope = PartialRotary(8, 4)
        >>> x = torch.randn(1, 2, 5, 8)                      # (b, h, t, d)
        >>> y = rope(x, offset=3)
        >>> torch.equal(y[..., 4:], x[..., 4:]), y.shape
        (True, torch.Size([1, 2, 5, 8]))
    """

    def __init__(self, head_dim: int, rotary_dim: int, base: float = 10000.0):
        super().__init__()
        if not 0 < rotary_dim <= head_dim:
            raise ValueError(f"rotary_dim must be in (0, head_dim = {head_dim}], got {rotary_dim}")
        self.rotary_dim = rotary_dim
        self.rope = RotaryEmbedding(rotary_dim, base)

    def forward(self, x: torch.Tensor, offset: int = 0, positions: torch.Tensor | None = None) -> torch.Tensor:
        """x: (b, h, t, d) → the same shape, features `[:rotary_dim]` rotated."""
        r = self.rotary_dim
        at = {} if positions is None else {"positions": positions}  # (b, t) with left padding
        rotated = self.rope(x[..., :r], offset=offset, **at)  # (b, h, t, r)
        return torch.cat([rotated, x[..., r:]], dim=-1)  # (b, h, t, d)


class ParallelResidualLayer(TransformerLayer):
    """`x + self_attn(norm1(x)) + ff(norm3(x))`: both blocks read the layer's input (GPT-J,
    GPT-NeoX), so neither sees the other's output. Sums in Hugging Face's order
    (ff + attention, then the residual), so the float roundings are the same.

    Examples:
        >>> layer = ParallelResidualLayer(MultiHeadAttention(16, 4), FeedForward(16, 32),
        ...                               nn.LayerNorm(16), nn.LayerNorm(16), norm_first=True)
        >>> layer(torch.randn(2, 5, 16), mask=AttentionMask(causal=True)).hidden.shape
        torch.Size([2, 5, 16])
    """

    residual_note = "x + attn(x) + ff(x): a parallel residual (the feed-forward reads the layer's input)"

    def forward(self, x: torch.Tensor, *, mask: AttentionMask | None = None,
                memory: torch.Tensor | None = None, memory_mask: AttentionMask | None = None,
                kv_cache: KVCache | None = None, memory_kv_cache: KVCache | None = None,
                trace_rows: torch.Tensor | slice | None = None,
                positions: torch.Tensor | None = None, intervention=None,
                **torch_style) -> LayerOutput:
        """x: (b, t, E) → a `LayerOutput`; arguments as
        [`TransformerLayer.forward`][qkv.modules.transformer.TransformerLayer.forward] (no
        cross-attention: `memory` must be None)."""
        if memory is not None or self.cross_attn is not None:
            raise ValueError("a parallel-residual layer has no cross-attention (memory must be None)")
        at = {} if positions is None else {"positions": positions}
        attn = self.self_attn(self.norm1(x), mask=mask, kv_cache=kv_cache, trace_rows=trace_rows,
                              intervention=intervention, **torch_style, **at)
        ff = self.feed_forward(self.norm3(x))
        x = self.dropout(ff) + self.dropout(attn.output) + x
        return LayerOutput(x, LayerTrace(attn.trace) if trace_rows is not None else None)


def build_layer(c: GPTNeoXConfig, backend: str = "auto") -> TransformerLayer:
    """One GPT-NeoX layer from its parts (parallel residual or GPT-2's sequential one)."""
    E = c.hidden_size
    rotary = PartialRotary(c.head_dim, c.rotary_dim, c.rotary_emb_base) if c.rotary_dim else None
    attn = MultiHeadAttention(E, c.num_attention_heads, bias=c.attention_bias, rotary=rotary,
                              backend=backend)
    ff = FeedForward(E, c.intermediate_size, activation=c.hidden_act)
    kind = ParallelResidualLayer if c.use_parallel_residual else TransformerLayer
    return kind(attn, ff, nn.LayerNorm(E, eps=c.layer_norm_eps), nn.LayerNorm(E, eps=c.layer_norm_eps),
                norm_first=True)


class GPTNeoXModel(DecoderLM):
    """A GPT-NeoX / Pythia decoder with its language-model head.

    Layer L's self-attention projects `layers[L].norm1(hidden_states[L])` into queries, keys
    and values; the first `config.rotary_dim` features of each query and key are then rotated
    by their position. A token attends to itself and the tokens before it.

    Forward, caches and generation are `qkv.models.decoder.DecoderLM`'s (the rotary
    layers take each token's position from it).

    Fields besides the modules: `config`, `tokenizer` (or None) and `name`.

    Examples:
        >>> model = GPTNeoXModel(GPTNeoXConfig(vocab_size=100, hidden_size=32, intermediate_size=64,
        ...                                    num_hidden_layers=2, num_attention_heads=4,
        ...                                    max_position_embeddings=64))
        >>> model(torch.tensor([[1, 2, 3]])).logits.shape       # (b, t, V)
        torch.Size([1, 3, 100])
        >>> model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=4).shape
        torch.Size([1, 7])
    """

    def __init__(self, config: GPTNeoXConfig, *, tokenizer=None, name: str = "gpt-neox",
                 backend: str = "auto"):
        super().__init__()
        self.config, self.name, self.tokenizer = config, name, tokenizer
        c = config
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)  # HF's embed_in
        self.decoder = TransformerStack((build_layer(c, backend) for _ in range(c.num_hidden_layers)),
                                        norm=nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps))
        # HF's embed_out; tied: the logits read embed_tokens.weight (nothing to re-tie)
        self.lm_head = None if c.tie_word_embeddings else nn.Linear(c.hidden_size, c.vocab_size, bias=False)


# -- the checkpoint mapping ---------------------------------------------------------------------
def gpt_neox_shapes(c: GPTNeoXConfig) -> Shapes:
    E, F, V = c.hidden_size, c.intermediate_size, c.vocab_size
    shapes = {"embed_in.weight": (V, E), "final_layer_norm.weight": (E,),
              "final_layer_norm.bias": (E,)}
    if not c.tie_word_embeddings:
        shapes["embed_out.weight"] = (V, E)
    for i in range(c.num_hidden_layers):
        p = f"layers.{i}."
        shapes |= {p + "attention.query_key_value.weight": (3 * E, E),
                   p + "attention.dense.weight": (E, E),
                   p + "mlp.dense_h_to_4h.weight": (F, E), p + "mlp.dense_h_to_4h.bias": (F,),
                   p + "mlp.dense_4h_to_h.weight": (E, F), p + "mlp.dense_4h_to_h.bias": (E,)}
        if c.attention_bias:
            shapes |= {p + "attention.query_key_value.bias": (3 * E,), p + "attention.dense.bias": (E,)}
        for norm in ("input_layernorm", "post_attention_layernorm"):
            shapes[p + norm + ".weight"], shapes[p + norm + ".bias"] = (E,), (E,)
    return shapes


def split_qkv(x: torch.Tensor, heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`query_key_value`'s weight (3E, E) or bias (3E,), rows interleaved per head
    `[q_0 k_0 v_0 q_1 …]` → q, k, v, each (E, E) or (E,) with the heads in order.

    Examples:
        >>> q, k, v = split_qkv(torch.arange(12.0), heads=2)   # d = 2: q0 k0 v0 q1 k1 v1
        >>> q.tolist(), v.tolist()
        ([0.0, 1.0, 6.0, 7.0], [4.0, 5.0, 10.0, 11.0])
    """
    rest = x.shape[1:]
    per_head = x.view(heads, 3, x.shape[0] // (3 * heads), *rest)  # (h, 3, d, ...)
    return tuple(per_head[:, j].reshape(-1, *rest) for j in range(3))  # 3 × (h·d, ...)


def gpt_neox_convert(tensors: Tensors, c: GPTNeoXConfig) -> Tensors:
    """Hugging Face names → this model's state dict; `query_key_value` split in three."""
    state = {"embed_tokens.weight": tensors["embed_in.weight"],
             "decoder.norm.weight": tensors["final_layer_norm.weight"],
             "decoder.norm.bias": tensors["final_layer_norm.bias"]}
    if not c.tie_word_embeddings:
        state["lm_head.weight"] = tensors["embed_out.weight"]
    h = c.num_attention_heads
    for i in range(c.num_hidden_layers):
        hf, q = f"layers.{i}.", f"decoder.layers.{i}."
        kinds = ("weight", "bias") if c.attention_bias else ("weight",)
        for kind in kinds:
            parts = split_qkv(tensors[hf + f"attention.query_key_value.{kind}"], h)
            for proj, x in zip(("q_proj", "k_proj", "v_proj"), parts):
                state[q + f"self_attn.{proj}.{kind}"] = x
            state[q + f"self_attn.out_proj.{kind}"] = tensors[hf + f"attention.dense.{kind}"]
        for hf_name, ours in (("mlp.dense_h_to_4h", "feed_forward.fc1"),
                              ("mlp.dense_4h_to_h", "feed_forward.fc2"),
                              ("input_layernorm", "norm1"), ("post_attention_layernorm", "norm3")):
            for kind in ("weight", "bias"):
                state[q + f"{ours}.{kind}"] = tensors[hf + f"{hf_name}.{kind}"]
    return state


def build(config: GPTNeoXConfig, *, tokenizer=None, name: str = "gpt-neox",
          directory: str | None = None) -> GPTNeoXModel:
    return GPTNeoXModel(config, tokenizer=tokenizer, name=name)


FAMILY = Family(
    config_from_dict=GPTNeoXConfig.from_dict, build=build, max_length=lambda c: c.max_length,
    prefix="gpt_neox.", shapes=gpt_neox_shapes,
    # attention.bias / masked_bias / rotary_emb.inv_freq: buffers older checkpoints saved (a
    # causal mask, a constant, RoPE's frequencies), all functions of the config;
    # embed_out.weight: a tied checkpoint's stored copy (the logits read embed_in)
    ignored=re.compile(r"^(layers\.\d+\.attention\.(bias|masked_bias|rotary_emb\.inv_freq)"
                       r"|embed_out\.weight)$"),
    convert=gpt_neox_convert,
)
