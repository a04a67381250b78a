"""Llama (Touvron et al., 2023): a pre-norm causal decoder with RMSNorm, SwiGLU, RoPE and GQA.

```text
input_ids ─► token embedding ─► hidden_states[0]          (no position vectors are added)
             ┌────────────────────────────────────────────────────────────────────┐
layer L:     │ x = x + self_attn(rmsnorm1(x))   RoPE on q, k; h_kv ≤ h (GQA)        │ × L
             │ x = x + down(silu(gate(n)) ⊙ up(n)),  n = rmsnorm3(x)   (SwiGLU)     │
             └────────────────────────────────────────────────────────────────────┘
             ─► final RMSNorm ─► logits = x · Wᵀ   (W = lm_head, or the embedding when tied)
```

The same model runs Mistral (a sliding window, `mistral.py`), Qwen2 (q/k/v biases,
`qwen2.py`) and Qwen3 (RMSNorm on each head's query and key, `qwen3.py`): their files hold
only how their `config.json` maps onto `LlamaConfig`. Reads Hugging Face checkpoints
(`qkv.load`); same logits, hidden states, attention and greedy generations as
`transformers` (tested).
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
from qkv.modules import GatedFeedForward, MultiHeadAttention, TransformerLayer, TransformerStack
from qkv.modules.positional import RopeScaling, RotaryEmbedding

LLAMA_ARCHITECTURES = ("LlamaForCausalLM", "LlamaModel")
ROPE_TYPES = ("default", "linear", "dynamic", "llama3")


@dataclass(frozen=True)
class LlamaConfig:
    """The sizes and options of a Llama-family model; names and defaults follow Hugging Face's
    `config.json` for Llama (Mistral, Qwen2, Qwen3 map onto the same fields).

    Examples:
        >>> c = LlamaConfig(hidden_size=48, num_attention_heads=6, num_key_value_heads=2)
        >>> c.head_dim, c.num_key_value_heads
        (8, 2)
    """

    vocab_size: int = 32000
    hidden_size: int = 4096  # E
    intermediate_size: int = 11008  # the SwiGLU width
    num_hidden_layers: int = 32
    num_attention_heads: int = 32  # h
    num_key_value_heads: int | None = None  # h_kv (GQA); None means h
    head_dim: int | None = None  # d; None means E / h
    max_position_embeddings: int = 2048  # the trained length
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0  # RoPE's base
    rope_scaling: RopeScaling | None = None  # linear / dynamic / llama3, or None
    attention_bias: bool = False  # biases on q, k, v and o (Llama's option)
    qkv_bias: bool = False  # biases on q, k, v only (Qwen2)
    qk_norm: bool = False  # RMSNorm on each head's query and key (Qwen3)
    mlp_bias: bool = False
    hidden_act: str = "silu"  # the gate's activation (a qkv.modules.FeedForward name)
    tie_word_embeddings: bool = False  # logits read the embedding table instead of lm_head
    sliding_window: int | None = None  # Mistral: a token sees itself and the window − 1 before it
    eos_token_id: tuple[int, ...] = field(default=())  # generation stops at any of these
    bos_token_id: int | None = None

    def __post_init__(self):
        if self.head_dim is None:
            if self.hidden_size % self.num_attention_heads:
                raise QkvError(f"hidden_size ({self.hidden_size}) must be divisible by "
                               f"num_attention_heads ({self.num_attention_heads}) unless head_dim is given")
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        if self.num_key_value_heads is None:
            object.__setattr__(self, "num_key_value_heads", self.num_attention_heads)
        if self.num_attention_heads % self.num_key_value_heads:
            raise QkvError(f"num_attention_heads ({self.num_attention_heads}) must be divisible by "
                           f"num_key_value_heads ({self.num_key_value_heads})")
        if self.head_dim % 2:
            raise QkvError(f"head_dim ({self.head_dim}) must be even for RoPE")

    @property
    def max_length(self) -> int:
        """The most tokens the model takes: the trained length, times the factor under dynamic
        NTK scaling (which exists to go past it)."""
        s = self.rope_scaling
        if s is not None and s.kind == "dynamic":
            return int(self.max_position_embeddings * s.factor)
        return self.max_position_embeddings

    @classmethod
    def from_dict(cls, d: dict, *, where: str = "config.json") -> "LlamaConfig":
        """Read a Hugging Face Llama `config.json` (as a dict); unsupported options raise.

        Examples:
            >>> LlamaConfig.from_dict({"hidden_size": 64, "num_attention_heads": 4,
            ...                        "rope_scaling": {"rope_type": "linear", "factor": 2.0}}).rope_scaling.kind
            'linear'
        """
        return read_config(d, "llama", LLAMA_ARCHITECTURES, where=where)


def read_config(d: dict, model_type: str, architectures: tuple[str, ...], *,
                where: str = "config.json", **overrides) -> LlamaConfig:
    """The fields every Llama-family `config.json` shares → a `LlamaConfig`.

    `overrides` are the family's own fields (`qkv_bias=True` for Qwen2, ...).
    """
    if not isinstance(d, dict):
        raise QkvError(f"{where} must hold a JSON object, got {type(d).__name__}")
    cfg.check_architecture(d, model_type, architectures, where=where)
    cfg.require(d, "is_encoder_decoder", False, where=where)
    sizes = cfg.read_fields(LlamaConfig, d, (
        "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
        "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings",
        "rms_norm_eps", "attention_bias", "mlp_bias", "tie_word_embeddings", "hidden_act"),
        where=where, activations={"hidden_act": LlamaConfig.hidden_act})  # HF's default name is qkv's
    theta, scaling = read_rope(d, sizes["max_position_embeddings"], where=where)
    return LlamaConfig(
        **sizes,
        rope_theta=theta,
        rope_scaling=scaling,
        eos_token_id=cfg.get_token_ids(d, "eos_token_id", where=where),
        bos_token_id=d.get("bos_token_id") if isinstance(d.get("bos_token_id"), int) else None,
        **overrides,
    )


def read_rope(d: dict, max_positions: int, *, where: str) -> tuple[float, RopeScaling | None]:
    """(rope_theta, scaling) from `rope_parameters` (transformers ≥ 5) or the older
    `rope_theta` + `rope_scaling` (whose type key is `rope_type` or `type`)."""
    p = {}
    for key in ("rope_scaling", "rope_parameters"):
        value = d.get(key)
        if value is not None and not isinstance(value, dict):
            raise QkvError(f"{where}: {key} must be an object, got {value!r}")
        p |= value or {}
    theta = p.get("rope_theta", d.get("rope_theta", 10000.0))
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 0:
        raise QkvError(f"{where}: rope_theta must be a positive number, got {theta!r}")
    partial = p.get("partial_rotary_factor", d.get("partial_rotary_factor", 1.0))
    if partial not in (None, 1, 1.0):
        raise QkvError(f"{where}: partial_rotary_factor={partial!r} is not supported for this "
                       f"family (qkv rotates the whole head)")
    kind = p.get("rope_type", p.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise QkvError(f"{where}: RoPE scaling type {kind!r} is not supported; qkv supports "
                       f"{', '.join(ROPE_TYPES)}")
    if kind == "default":
        return float(theta), None
    factor = cfg.get_float(p, "factor", None, where=f"{where} (rope scaling)")
    try:
        if kind == "llama3":
            return float(theta), RopeScaling(
                "llama3", factor,
                low_freq_factor=cfg.get_float(p, "low_freq_factor", 1.0, where=where),
                high_freq_factor=cfg.get_float(p, "high_freq_factor", 4.0, where=where),
                original_max_positions=cfg.get_int(p, "original_max_position_embeddings", 8192,
                                                   where=where))
        return float(theta), RopeScaling(kind, factor, max_positions=max_positions)
    except ValueError as e:
        raise QkvError(f"{where}: {e}") from None


class RMSNorm(nn.Module):
    """Zhang & Sennrich (2019): x / √(mean(x²) + ε) · γ, no centring, no bias.

    Normalises in float32 whatever the input dtype, then multiplies by γ in the input dtype,
    as Llama's reference code does (so bf16 models round where they were trained to).

    Examples:
        >>> RMSNorm(4, eps=0.0)(torch.tensor([[3.0, -3.0, 3.0, -3.0]])).tolist()
        [[1.0, -1.0, 1.0, -1.0]]
    """

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))  # γ, (E,)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def build_layer(c: LlamaConfig, backend: str = "auto") -> TransformerLayer:
    """One pre-norm Llama layer from its parts."""
    E, d = c.hidden_size, c.head_dim
    attn = MultiHeadAttention(
        E, c.num_attention_heads, num_kv_heads=c.num_key_value_heads, head_dim=d,
        bias=c.attention_bias or c.qkv_bias, out_bias=c.attention_bias,
        rotary=RotaryEmbedding(d, c.rope_theta, scaling=c.rope_scaling), backend=backend,
        q_norm=RMSNorm(d, c.rms_norm_eps) if c.qk_norm else None,
        k_norm=RMSNorm(d, c.rms_norm_eps) if c.qk_norm else None,
    )
    ff = GatedFeedForward(E, c.intermediate_size, activation=c.hidden_act, bias=c.mlp_bias)
    return TransformerLayer(attn, ff, RMSNorm(E, c.rms_norm_eps), RMSNorm(E, c.rms_norm_eps),
                            norm_first=True)


class LlamaModel(DecoderLM):
    """A Llama-family decoder with its language-model head.

    Layer L's self-attention projects `layers[L].norm1(hidden_states[L])` into queries, keys
    and values; queries and keys are then rotated (RoPE) by their position. A token attends to
    itself and the tokens before it (within `sliding_window` for Mistral).

    Forward, caches and generation are `qkv.models.decoder.DecoderLM`'s; Llama's own part
    is `attention_mask` (Mistral's window, no causal mask for a one-token step).

    Fields besides the modules: `config`, `tokenizer` (or None) and `name`.

    Examples:
        >>> model = LlamaModel(LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64,
        ...                                num_hidden_layers=2, num_attention_heads=4,
        ...                                num_key_value_heads=2, max_position_embeddings=64))
        >>> model(torch.tensor([[1, 2, 3]])).logits.shape       # (b, t, V)
        torch.Size([1, 3, 100])
        >>> model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=4).shape
        torch.Size([1, 7])
    """

    def __init__(self, config: LlamaConfig, *, tokenizer=None, name: str = "llama",
                 backend: str = "auto"):
        super().__init__()
        self.config, self.name, self.tokenizer = config, name, tokenizer
        c = config
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.decoder = TransformerStack((build_layer(c, backend) for _ in range(c.num_hidden_layers)),
                                        norm=RMSNorm(c.hidden_size, c.rms_norm_eps))
        # tied: the logits read embed_tokens.weight directly (one tensor, nothing to re-tie)
        self.lm_head = None if c.tie_word_embeddings else nn.Linear(c.hidden_size, c.vocab_size, bias=False)

    def attention_mask(self, padding: torch.Tensor | None, t: int = 2) -> AttentionMask:
        """The one mask of every layer: causal (bottom-right, for the cache), the sliding window
        if any, and the padding (b, s) (True = real token) when some token is padding.

        One new token (t = 1, a decoding step) is the last of all positions, so causality
        excludes nothing: it is left out, and the fused kernel needs no mask at all.
        """
        w = self.config.sliding_window
        return AttentionMask(causal=t > 1, alignment="bottom_right", key_padding=padding,
                             window=None if w is None else (w - 1, None))


# -- the checkpoint mapping ---------------------------------------------------------------------
def layer_modules(c: LlamaConfig) -> dict[str, tuple[str, dict[str, tuple[int, ...]]]]:
    """Per layer: Hugging Face module (after `model.layers.N.`) → (qkv's module, {parameter:
    shape}), for the modules and biases `c`'s checkpoint holds — the one list that the shape
    check, the conversion (`LAYER_NAMES`) and `qkv train lm`'s export read."""
    E, F_, d = c.hidden_size, c.intermediate_size, c.head_dim
    q, kv = c.num_attention_heads * d, c.num_key_value_heads * d
    qkv_bias = c.attention_bias or c.qkv_bias  # Qwen2: biases on q, k, v only

    def linear(out: int, inp: int, bias: bool) -> dict[str, tuple[int, ...]]:
        return {"weight": (out, inp)} | ({"bias": (out,)} if bias else {})

    modules = {
        "self_attn.q_proj": ("self_attn.q_proj", linear(q, E, qkv_bias)),
        "self_attn.k_proj": ("self_attn.k_proj", linear(kv, E, qkv_bias)),
        "self_attn.v_proj": ("self_attn.v_proj", linear(kv, E, qkv_bias)),
        "self_attn.o_proj": ("self_attn.out_proj", linear(E, q, c.attention_bias)),
        "mlp.gate_proj": ("feed_forward.gate", linear(F_, E, c.mlp_bias)),
        "mlp.up_proj": ("feed_forward.up", linear(F_, E, c.mlp_bias)),
        "mlp.down_proj": ("feed_forward.down", linear(E, F_, c.mlp_bias)),
        "input_layernorm": ("norm1", {"weight": (E,)}),
        "post_attention_layernorm": ("norm3", {"weight": (E,)}),
    }
    if c.qk_norm:  # Qwen3: each head's q and k RMS-normalised
        modules |= {"self_attn.q_norm": ("self_attn.q_norm", {"weight": (d,)}),
                    "self_attn.k_norm": ("self_attn.k_norm", {"weight": (d,)})}
    return modules


# Hugging Face module (after "model.layers.N.") → qkv's, every module a Llama-family layer may have.
LAYER_NAMES = {hf: ours for hf, (ours, _) in layer_modules(LlamaConfig(qk_norm=True)).items()}


def llama_shapes(c: LlamaConfig) -> Shapes:
    shapes = {"embed_tokens.weight": (c.vocab_size, c.hidden_size), "norm.weight": (c.hidden_size,)}
    if not c.tie_word_embeddings:
        shapes["lm_head.weight"] = (c.vocab_size, c.hidden_size)
    modules = layer_modules(c)
    for i in range(c.num_hidden_layers):
        shapes |= {f"layers.{i}.{hf}.{param}": shape
                   for hf, (_, params) in modules.items() for param, shape in params.items()}
    return shapes


def llama_convert(tensors: Tensors, c: LlamaConfig) -> Tensors:
    """Hugging Face names → this model's state dict (the layouts are already nn.Linear's)."""
    state = {"embed_tokens.weight": tensors["embed_tokens.weight"],
             "decoder.norm.weight": tensors["norm.weight"]}
    if not c.tie_word_embeddings:
        state["lm_head.weight"] = tensors["lm_head.weight"]
    layer = re.compile(r"^layers\.(\d+)\.(.+)\.(weight|bias)$")
    for name, x in tensors.items():
        m = layer.match(name)
        if m:
            state[f"decoder.layers.{m[1]}.{LAYER_NAMES[m[2]]}.{m[3]}"] = x
    return state


def family(config_from_dict) -> Family:
    """The `Family` record of a Llama-architecture family with its own config reader."""
    return Family(
        config_from_dict=config_from_dict, build=build, max_length=lambda c: c.max_length,
        prefix="model.", shapes=llama_shapes,
        # lm_head.weight: a tied checkpoint's stored copy (the logits read embed_tokens);
        # rotary_emb.inv_freq: old checkpoints saved RoPE's frequencies, a function of the config
        ignored=re.compile(r"^(lm_head\.weight|layers\.\d+\.self_attn\.rotary_emb\.inv_freq)$"),
        convert=llama_convert,
    )


def build(config: LlamaConfig, *, tokenizer=None, name: str = "llama", directory: str | None = None) -> LlamaModel:
    return LlamaModel(config, tokenizer=tokenizer, name=name)


FAMILY = family(LlamaConfig.from_dict)
