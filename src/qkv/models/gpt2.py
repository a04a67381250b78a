"""GPT-2 (Radford et al., 2019): a decoder-only stack of pre-norm causal layers.

```text
input_ids ─► token + position embeddings ─► hidden_states[0]
             ┌──────────────────────────────────────────────────────────┐
layer L:     │ x = x + self_attn(norm1(x))   (causal: token i sees ≤ i)  │ × n_layer
             │ x = x + ff(norm3(x))          (tanh GELU)                 │
             └──────────────────────────────────────────────────────────┘
             ─► final LayerNorm ─► logits = x · token_embeddingᵀ   (tied output head)
```

Reads Hugging Face GPT-2 checkpoints (`qkv.models.load`); same logits and greedy generations
as `transformers` (tested).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields

import torch
from torch import nn

from qkv.errors import QkvError
from qkv.models import config as cfg
from qkv.models.decoder import DecoderLM
from qkv.models.family import Family, Shapes, Tensors
from qkv.modules import LearnedPositionalEmbedding, TransformerLayer, TransformerStack

GPT2_ARCHITECTURES = ("GPT2LMHeadModel", "GPT2Model")


@dataclass(frozen=True)
class GPT2Config:
    """The sizes of a GPT-2 model; field names and defaults are Hugging Face's `config.json`."""

    vocab_size: int = 50257
    n_positions: int = 1024  # the most tokens (prompt + generated) the model takes
    n_embd: int = 768  # E
    n_layer: int = 12
    n_head: int = 12  # h; head dim d = E / h
    n_inner: int | None = None  # feed-forward width; None means 4·E
    activation_function: str = "gelu_tanh"  # a qkv.modules.FeedForward activation name
    layer_norm_epsilon: float = 1e-5

    def __post_init__(self):
        if self.n_embd % self.n_head:
            raise QkvError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")

    @property
    def inner_dim(self) -> int:
        return self.n_inner if self.n_inner is not None else 4 * self.n_embd

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @classmethod
    def from_dict(cls, d: dict, *, where: str = "config.json") -> "GPT2Config":
        """Read a Hugging Face GPT-2 `config.json` (as a dict); unsupported features raise.

        Examples:
            >>> GPT2Config.from_dict({"n_embd": 64, "n_head": 4, "n_layer": 2}).inner_dim
            256
        """
        if not isinstance(d, dict):
            raise QkvError(f"{where} must hold a JSON object, got {type(d).__name__}")
        cfg.check_architecture(d, "gpt2", GPT2_ARCHITECTURES, where=where)
        # Variants of the attention that qkv's layers do not implement.
        cfg.require(d, "scale_attn_weights", True, where=where)
        cfg.require(d, "scale_attn_by_inverse_layer_idx", False, where=where)
        cfg.require(d, "reorder_and_upcast_attn", False, where=where)
        cfg.require(d, "add_cross_attention", False, where=where)
        cfg.require(d, "tie_word_embeddings", True, where=where)
        return cls(**cfg.read_fields(cls, d, [f.name for f in fields(cls)], where=where,
                                     activations={"activation_function": "gelu_new"}))


class GPT2Model(DecoderLM):
    """GPT-2 with its language-model head (tied to the token embedding).

    Layer L's self-attention projects `layers[L].norm1(hidden_states[L])` into queries, keys
    and values (pre-norm); `qkv.modules.LayerTrace`'s `self_attn.query_input` holds it.
    Forward, caches and generation are `qkv.models.decoder.DecoderLM`'s; GPT-2's own part
    is `embed` (learned position vectors). Generation stops at an EOS token only when
    `eos_token_id` is given (GPT-2's config here names none).

    Fields besides the modules: `config`, `tokenizer` (or None) and `name` (for
    messages), given to the constructor (`qkv.models.load` passes them).

    Examples:
        >>> model = GPT2Model(GPT2Config(vocab_size=100, n_positions=32, n_embd=32, n_layer=2, n_head=4))
        >>> model(torch.tensor([[1, 2, 3]])).logits.shape       # (b, t, V)
        torch.Size([1, 3, 100])
        >>> model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=4).shape
        torch.Size([1, 7])
    """

    max_length_field = "n_positions"

    def __init__(self, config: GPT2Config, *, tokenizer=None, name: str = "gpt2"):
        super().__init__()
        self.config = config
        self.name = name
        self.tokenizer = tokenizer
        E = config.n_embd
        self.wte = nn.Embedding(config.vocab_size, E)
        self.wpe = LearnedPositionalEmbedding(config.n_positions, E)
        self.decoder = TransformerStack(
            (TransformerLayer.build(E, config.n_head, config.inner_dim, norm_first=True,
                                    norm_eps=config.layer_norm_epsilon,
                                    activation=config.activation_function)
             for _ in range(config.n_layer)),
            norm=nn.LayerNorm(E, eps=config.layer_norm_epsilon),  # HF's ln_f
        )
        self.lm_head = nn.Linear(E, config.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied: the output head reads the embedding table

    @property
    def embed_tokens(self) -> nn.Embedding:
        """The token embedding, `wte` (Hugging Face's name, kept in the state dict)."""
        return self.wte

    @property
    def max_length(self) -> int:
        """The most tokens (prompt + generated) the model takes: `n_positions`."""
        return self.config.n_positions

    def embedding_tables(self) -> dict[str, nn.Module]:
        """The token table `wte` and the learned position table `wpe`."""
        return {"token": self.wte, "position": self.wpe}

    def embed(self, input_ids: torch.Tensor, positions: torch.Tensor | None, past: int) -> torch.Tensor:
        """(b, t) ids → (b, t, E) token + position vectors; `positions` (b, t) when some token
        is padding (each counts the real tokens before it), else `past`, past + 1, …"""
        x = self.wte(input_ids)  # (b, t, E)
        return self.wpe(x, offset=past) if positions is None else x + self.wpe.weight[positions]


# -- the checkpoint mapping ---------------------------------------------------------------------
def gpt2_shapes(c: GPT2Config) -> Shapes:
    E, F, V = c.n_embd, c.inner_dim, c.vocab_size
    shapes = {"wte.weight": (V, E), "wpe.weight": (c.n_positions, E),
              "ln_f.weight": (E,), "ln_f.bias": (E,)}
    for i in range(c.n_layer):
        p = f"h.{i}."
        # Conv1D layout: weight (in, out)
        shapes |= {p + "attn.c_attn.weight": (E, 3 * E), p + "attn.c_attn.bias": (3 * E,),
                   p + "attn.c_proj.weight": (E, E), p + "attn.c_proj.bias": (E,),
                   p + "mlp.c_fc.weight": (E, F), p + "mlp.c_fc.bias": (F,),
                   p + "mlp.c_proj.weight": (F, E), p + "mlp.c_proj.bias": (E,)}
        for norm in ("ln_1", "ln_2"):
            shapes[p + norm + ".weight"], shapes[p + norm + ".bias"] = (E,), (E,)
    return shapes


def gpt2_convert(tensors: Tensors, c: GPT2Config) -> Tensors:
    def t(x: torch.Tensor) -> torch.Tensor:  # Conv1D (in, out) → nn.Linear (out, in)
        return x.t().contiguous()

    state = {"wte.weight": tensors["wte.weight"], "lm_head.weight": tensors["wte.weight"],
             "wpe.weight": tensors["wpe.weight"],
             "decoder.norm.weight": tensors["ln_f.weight"], "decoder.norm.bias": tensors["ln_f.bias"]}
    for i in range(c.n_layer):
        h, q = f"h.{i}.", f"decoder.layers.{i}."
        w_q, w_k, w_v = t(tensors[h + "attn.c_attn.weight"]).chunk(3, dim=0)  # 3 × (E, E)
        b_q, b_k, b_v = tensors[h + "attn.c_attn.bias"].chunk(3)
        for proj, w, b in (("q_proj", w_q, b_q), ("k_proj", w_k, b_k), ("v_proj", w_v, b_v)):
            state[q + f"self_attn.{proj}.weight"] = w.contiguous()
            state[q + f"self_attn.{proj}.bias"] = b.contiguous()
        for hf, ours in (("attn.c_proj", "self_attn.out_proj"), ("mlp.c_fc", "feed_forward.fc1"),
                         ("mlp.c_proj", "feed_forward.fc2")):
            state[q + ours + ".weight"] = t(tensors[h + hf + ".weight"])
            state[q + ours + ".bias"] = tensors[h + hf + ".bias"]
        for hf, ours in (("ln_1", "norm1"), ("ln_2", "norm3")):
            state[q + ours + ".weight"] = tensors[h + hf + ".weight"]
            state[q + ours + ".bias"] = tensors[h + hf + ".bias"]
    return state


def build(config: GPT2Config, *, tokenizer=None, name: str = "gpt2", directory: str | None = None) -> GPT2Model:
    return GPT2Model(config, tokenizer=tokenizer, name=name)


FAMILY = Family(
    config_from_dict=GPT2Config.from_dict, build=build, max_length=lambda c: c.n_positions,
    prefix="transformer.", shapes=gpt2_shapes,
    # attn.bias / masked_bias: old checkpoints' saved causal-mask buffers; lm_head: the
    # tied copy of wte (checked equal by the loader)
    ignored=re.compile(r"^(h\.\d+\.attn\.(bias|masked_bias)|lm_head\.weight)$"),
    convert=gpt2_convert,
    tied=(("lm_head.weight", "wte.weight"),),
    layers_key="n_layer",
)
