"""The one model protocol: what an explainable model provides and what it can do.

Explanations, the CLI and the viewer ask a model for its
[`Capabilities`][qkv.models.protocol.Capabilities] — never for its class, family or a kind string.
Every model [`qkv.load`][qkv.load] returns (a native family, the shipped `lm`, a transformers model
behind qkv's attention, a transformers encoder-decoder, the translation model) meets
[`SelfAttentionModel`][qkv.models.protocol.SelfAttentionModel] or
[`CrossAttentionModel`][qkv.models.protocol.CrossAttentionModel] — typed below, checked for every
loader by `tests/models/test_protocol.py` — so explanations read these attributes directly, never
guessing with `hasattr`:

`capabilities`
    a [`Capabilities`][qkv.models.protocol.Capabilities] (frozen; a class attribute is enough).
`name`
    a short string for messages (`"all-MiniLM-L6-v2"`, `"translate (shipped)"`).
`config`
    its config dataclass (sizes: layers, heads, vocabulary).
`tokenizer`
    a [`Tokenizer`][qkv.models.Tokenizer] (`encode(text).tokens / .ids`, `id_to_token`,
    `special_ids`, `max_length`), for self-attention models; a cross-attention model reads
    its text through `cross_pass` instead.
`layers`
    the self-attention stack's layers: `layers[L].self_attn` is a
    [`MultiHeadAttention`][qkv.modules.MultiHeadAttention] (`num_heads`, `head_dim`, its projections
    when `capabilities.head_weights`); a translation model's are `decoder.layers` (self and
    `cross_attn`).
`forward(..., trace_rows=...)`
    the model's own forward, recording [`AttentionTrace`][qkv.attention.AttentionTrace]s for the
    rows asked for (what `qkv.explain.forward` reads); a translation model's is `trace(src, tgt)`.
`cross_pass(text, target=None)`, `cross_shape`
    (models with `capabilities.cross_attention`) one teacher-forced forward over `target`
    (None: the model's own greedy translation) → a [`CrossPass`][qkv.models.protocol.CrossPass];
    `cross_shape` is (decoder layers, heads per layer).
`gold_alignment(text)`
    (models with `capabilities.cross_attention`) a `Gold` alignment for `text` when the
    model knows one (the toy translation model: its grammar's), else None (a transformers
    encoder-decoder). [`qkv.explain.cross`][qkv.explain.cross] and
    [`qkv.explain.attention_maps`][qkv.explain.attention_maps] read nothing else.

Which explanation applies is a question to [`Capabilities`][qkv.models.protocol.Capabilities]:

======================  ===================================================================
`self_attention`      `explain`, `explain_head`, `heads`, `attention_map(s)`, probes
`cross_attention`     `cross_attention`, `cross_attention_head` (a decoder reading an
                        encoder's memory: translation)
`causal`              a token sees itself and earlier tokens only (decoders); the induction and
                        previous-token probes need it; the coref probe needs it off
`next_token`          next-token logits (a language-model head): the `grad` method's target
                        without a `target_text`
`head_weights`        W_Q, W_K, W_V, W_O of each head are known (`explain_head`'s step by step,
                        the norm-based contribution methods)
======================  ===================================================================

Examples:
    >>> ENCODER.self_attention, ENCODER.causal, TRANSLATION.cross_attention
    (True, False, True)
    >>> capabilities_of(object())
    Traceback (most recent call last):
    ...
    ValueError: model must be a qkv model (from qkv.load) with .capabilities, got object
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from enum import Enum
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from qkv.errors import QkvError

if TYPE_CHECKING:
    import torch
    from torch import nn

    from qkv.models.tokenizer import Encoding


@dataclass(frozen=True)
class Capabilities:
    """What a model can be asked (see the module doc for what each field enables).

    Attributes:
        self_attention: one stack of self-attention layers over the text the explanations read.
        causal: that self-attention is causal (token i sees keys ≤ i).
        encoder: a bidirectional encoder (BERT, or the translation model's English side).
        cross_attention: a decoder attends to an encoder's output (the translation model).
        next_token: the model ends in next-token logits (a language-model head).
        head_weights: each head's W_Q, W_K, W_V and W_O are known to qkv.
    """

    self_attention: bool
    causal: bool
    encoder: bool
    cross_attention: bool = False
    next_token: bool = False
    head_weights: bool = True

    def to_dict(self) -> dict:
        """Plain JSON (what the viewer's page receives per model)."""
        return asdict(self)

    def lacks(self, names: Sequence[str]) -> tuple[str, ...]:
        """The capabilities among `names` (field names) this model does not have, in order;
        ValueError for a name that is no capability.

        Examples:
            >>> ENCODER.lacks(("self_attention", "next_token"))
            ('next_token',)
        """
        have = asdict(self)
        unknown = [n for n in names if n not in have]
        if unknown:
            raise ValueError(f"{', '.join(map(repr, unknown))} is no capability; the capabilities are "
                             f"{', '.join(have)}")
        return tuple(n for n in names if not have[n])


# The three shapes qkv's own models come in.
ENCODER = Capabilities(self_attention=True, causal=False, encoder=True)  # BERT, RoBERTa, DistilBERT
DECODER = Capabilities(self_attention=True, causal=True, encoder=False, next_token=True)  # GPT-2, Llama …
TRANSLATION = Capabilities(self_attention=False, causal=False, encoder=True, cross_attention=True,
                           next_token=True)  # the encoder-decoder; explained by its cross-attention
# a transformers encoder-decoder (Marian, BART, mBART, M2M100, T5) on qkv's attention
# (qkv.hf.seq2seq): its weights are transformers', so no step-by-step head arithmetic yet
SEQ2SEQ = replace(TRANSLATION, head_weights=False)


@dataclass(frozen=True)
class CrossPass:
    """One teacher-forced forward of an encoder-decoder: what `model.cross_pass(text, target=)`
    returns (every model with `capabilities.cross_attention` has that method).

    Target position j is the decoder position that *produces* target token j (its input is
    token j−1, the decoder start token at j = 0), so row j of a cross map is where the decoder
    looked while choosing token j.

    Attributes:
        source: the s source tokens as shown (the keys), special tokens included.
        target: the t target tokens (the queries), end-of-sequence included.
        special: (t,) whether each target token is a special token (EOS, a language code).
        words: the target's non-special tokens, in order (what a gold alignment is written for).
        translation: the target as text.
        cross: (L, H, t, s) cross-attention weights, exactly as the forward computed them.
        encoder: (L_enc, H, s, s) and decoder: (L, H, t, t) the self-attention weights of the
            same forward.
        trace: the model's own full trace when it keeps one (the translation model's
            `TranslationTrace`: queries, keys, values per layer), else None.
    """

    source: list[str]
    target: list[str]
    special: list[bool]
    words: list[str]
    translation: str
    cross: torch.Tensor
    encoder: torch.Tensor
    decoder: torch.Tensor
    trace: object | None = None


# What a cross-attention model's ``gold_alignment(text)`` returns: (the reference target tokens,
# per target token the source token indices it translates), a sentence saying why there is none
# for this text, or None (the model knows no gold alignment).
Gold = tuple[Sequence[str], Sequence[Sequence[int]]] | str | None


# -- the parts an explanation reads, named ------------------------------------------------------
class MixerKind:
    """What mixes a layer's tokens (one typed field per mixer of
    [`LayerParts`][qkv.models.protocol.LayerParts]): one interned record per kind, compared by
    identity (`kind is MixerKind.SOFTMAX`), looked up by name (`MixerKind("mamba2")`), added by
    [`register_mixer_kind`][qkv.models.protocol.register_mixer_kind].

    `softmax`: softmax attention run by qkv's traced attention (q·kᵀ, the softmax, Σ w·v);
    `mla`: multi-head latent attention (DeepSeek V2/V3, Kimi): low-rank latent q and kv, a
    RoPE part and a content part per score, the softmax run by qkv; `sparse`: indexed attention
    (DeepSeek V3.2, GLM-DSA): an indexer picks the top-k keys per query, qkv's softmax over them;
    `differential`: two softmax maps and λ, their difference the map (DiffLlama); the rest run
    transformers' own code: `gated_deltanet` (Qwen3-Next / 3.5, OLMo hybrid: the delta rule
    with a decay), `kda` (Kimi Delta Attention: the delta rule with a per-channel decay),
    `lightning` (MiniMax: linear attention with a per-head decay), `mamba2` (a selective
    state-space model: Mamba-2's SSD, a scalar decay per head), `mamba1` (Mamba-1's selective
    scan, a decay per channel and state: Jamba), `short_conv` (LFM2: a gated causal depthwise
    convolution).

    Attributes:
        value: the kind's name (`MixerKind.MAMBA2.value == "mamba2"`).
        softmax: whether its weights are softmax rows that qkv's attention computes (and traces).

    Examples:
        >>> MixerKind("gated_deltanet").softmax, MixerKind.MLA.softmax
        (False, True)
        >>> MixerKind("gated_deltanet") is MixerKind.GATED_DELTANET
        True
    """

    value: str
    softmax: bool

    def __new__(cls, value: str) -> "MixerKind":
        try:
            return MIXER_KINDS[value]
        except (KeyError, TypeError):
            raise ValueError(f"{value!r} is not a mixer kind; known: {', '.join(MIXER_KINDS)}") from None

    @property
    def name(self) -> str:
        """`"MAMBA2"`: the kind's name as a constant (`MixerKind.MAMBA2`)."""
        return self.value.upper()

    def __repr__(self) -> str:
        return f"<MixerKind.{self.name}: {self.value!r}>"

    def __reduce__(self):  # copies and pickles are the one interned kind
        return MixerKind, (self.value,)


#: every mixer kind by name, in the order registered (`register_mixer_kind` adds one)
MIXER_KINDS: dict[str, MixerKind] = {}


def register_mixer_kind(value: str, *, softmax: bool = False) -> MixerKind:
    """A new [`MixerKind`][qkv.models.protocol.MixerKind] `value`; `softmax` when qkv's attention
    computes its weights. A taken name raises (no silent replacement).

    Examples:
        >>> MixerKind.SHORT_CONV.value
        'short_conv'
    """
    if not isinstance(value, str) or not value:
        raise ValueError(f"a mixer kind is a non-empty name, got {value!r}")
    if value in MIXER_KINDS:
        raise ValueError(f"mixer kind {value!r} is already registered")
    kind = object.__new__(MixerKind)
    kind.value, kind.softmax = value, softmax
    MIXER_KINDS[value] = kind
    return kind


MixerKind.SOFTMAX = register_mixer_kind("softmax", softmax=True)
MixerKind.GATED_DELTANET = register_mixer_kind("gated_deltanet")
MixerKind.KDA = register_mixer_kind("kda")
MixerKind.LIGHTNING = register_mixer_kind("lightning")
MixerKind.MAMBA2 = register_mixer_kind("mamba2")
MixerKind.MAMBA1 = register_mixer_kind("mamba1")
MixerKind.SHORT_CONV = register_mixer_kind("short_conv")
MixerKind.MLA = register_mixer_kind("mla", softmax=True)
MixerKind.SPARSE = register_mixer_kind("sparse", softmax=True)
MixerKind.DIFFERENTIAL = register_mixer_kind("differential", softmax=True)


class ResidualForm(Enum):
    """How a layer adds its branches to the residual stream (m: the mixer, f: the feed-forward,
    n₁, n₃: [`LayerNorms`][qkv.models.protocol.LayerNorms]' `mixer` and `feed_forward`):

    ```text
    pre_norm    y = x + m(n₁(x));  out = y + f(n₃(y))
    post_norm   y = n₁(x + m(x));  out = n₃(y + f(y))
    parallel    out = x + m(n₁(x)) + f(n₃(x))
    branch_norm y = x + p₁(m(n₁(x)));  out = y + p₃(f(n₃(y)))      (OLMo 2, Gemma 2, OLMo
                hybrid: p₁, p₃ `post_mixer`, `post_feed_forward`; n₁, n₃, p₃ None where absent)
    scaled      y = α₁·r₁ + β₁·m(n₁(x));  out = α₃·r₃ + β₃·f(n₃(y))   ([`ResidualScales`]
                [qkv.models.protocol.ResidualScales]: r₁ = n₁(x), r₃ = n₃(y) where `normed`
                (MiniMax), else x and y (Granite's residual multiplier))
    other       none of these (two mixers, a block shared with the embeddings): the
                layer's ``residual_note`` says what
    ```
    """

    PRE_NORM = "pre_norm"
    POST_NORM = "post_norm"
    PARALLEL = "parallel"
    BRANCH_NORM = "branch_norm"
    SCALED = "scaled"
    OTHER = "other"


@dataclass(frozen=True)
class ResidualScales:
    """The factors of a `scaled` layer ([`ResidualForm`][qkv.models.protocol.ResidualForm]):
    y = α₁·r₁ + β₁·m(n₁(x)), out = α₃·r₃ + β₃·f(n₃(y)), each read off the layer (its own float
    attributes, MiniMax's `attn_alpha_factor` …, where one matches) and checked on the
    discovery forward.

    Attributes:
        mixer_residual: α₁.
        mixer: β₁.
        feed_forward_residual: α₃.
        feed_forward: β₃.
        normed: the residual is taken after the norm (r₁ = n₁(x), r₃ = n₃(y): MiniMax), not
            before it (r₁ = x, r₃ = y).
    """

    mixer_residual: float
    mixer: float
    feed_forward_residual: float
    feed_forward: float
    normed: bool


@dataclass(frozen=True)
class Mixer:
    """One token mixer of a layer.

    Attributes:
        kind: its [`MixerKind`][qkv.models.protocol.MixerKind].
        module: the module that runs it (it reads the layer's normed input).
        output: the module whose output (or its first element: `MultiHeadAttention`'s
            `AttentionOutput.output`) is the branch the layer adds — a transformers BERT's
            output projection, outside its attention module; None: `module` itself.
        attention: for a kind whose weights qkv's attention computes (`kind.softmax`), its
            sizes and projections (an
            [`AttentionLayerLike`][qkv.models.protocol.AttentionLayerLike]: `num_heads`, `head_dim`,
            `q_proj` … where they are linear maps); None for the other kinds.
    """

    kind: MixerKind
    module: nn.Module
    attention: AttentionLayerLike | None = None
    output: nn.Module | None = None


@dataclass(frozen=True)
class OutputGate:
    """A softmax layer's output gate (transformers' `Qwen3NextAttention`, `Qwen3_5Attention`):
    `q_proj` makes each head's query and gate side by side ((E) → (h, 2d): [q_h | gate_h]), and
    the output projection W_O reads the gated heads, so head h's contribution at token i is
    (sigmoid(gate_ih) ⊙ z_ih) · W_O,hᵀ, z_ih the head's Σ_j A_ij v_j. Found once by the model
    side (`qkv.hf.mixers.output_gate`), declared as its attention's `output_gate`
    ([`OutputGated`][qkv.models.protocol.OutputGated]). Letters: r rows, h heads, d head width,
    E hidden width.

    Attributes:
        q_proj: the query-and-gate projection (E → h·2d).
        o_proj: the output projection W_O (h·d → E) that reads the gated heads.
        heads: h. head_dim: d.
    """

    q_proj: nn.Linear
    o_proj: nn.Linear
    heads: int
    head_dim: int

    @property
    def weight(self) -> torch.Tensor:
        """(E, h·d) W_O."""
        return self.o_proj.weight

    @property
    def bias(self) -> torch.Tensor | None:
        """(E,) W_O's bias, or None."""
        return self.o_proj.bias

    def gates(self, x: torch.Tensor) -> torch.Tensor:
        """(r, h, d) sigmoid(gate) for the layer inputs `x` (r, E) (after the layer's norm)."""
        import torch

        with torch.no_grad():
            both = self.q_proj(x.to(self.q_proj.weight.dtype)).view(x.shape[0], self.heads, 2 * self.head_dim)
        return torch.sigmoid(both[..., self.head_dim:].to(x.dtype))

    def out_weight(self) -> torch.Tensor:
        """(h, d, E) W_O,h per head."""
        E = self.weight.shape[0]
        return self.weight.detach().view(E, self.heads, self.head_dim).permute(1, 2, 0)

    def writes(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """(h, r, E) float64 each head's gated write (g ⊙ z)·W_O,hᵀ at r rows: `x` (r, E) the
        layer's input there after its norm, `z` (r, h·d) the heads' outputs (the attention call's)."""
        import torch

        g = self.gates(x).double()  # (r, h, d)
        r, h, d = g.shape
        return torch.einsum("rhd,hde->hre", z.double().view(r, h, d) * g, self.out_weight().double())

    def out_bias(self) -> torch.Tensor:
        """(E,) b_O, zeros when the projection has none."""
        return self.bias.detach() if self.bias is not None else self.weight.new_zeros(self.weight.shape[0])


class OutputGated:
    """An attention layer (`layers[L].self_attn`) that declares whether it gates its heads'
    outputs before W_O: `output_gate` its [`OutputGate`][qkv.models.protocol.OutputGate], or None
    where it has none. A transformers layer's attention (`qkv.hf.adapter.HFAttention`) is one;
    qkv's own `MultiHeadAttention` never gates its heads, and is not one
    (`qkv.explain.mixers.gate.output_gate` then says None).
    """

    output_gate: OutputGate | None = None


@dataclass(frozen=True)
class LayerNorms:
    """A layer's norms by role ([`ResidualForm`][qkv.models.protocol.ResidualForm] says where each
    sits): `mixer` n₁ (read by the mixer in a pre-norm layer, reading x + m(x) in a post-norm one),
    `feed_forward` n₃, `cross` the cross-attention's (decoders of encoder-decoders), `post_mixer`
    p₁ and `post_feed_forward` p₃ the norms on a `branch_norm` layer's branches (OLMo 2, Gemma
    2); None where there is none."""

    mixer: nn.Module | None = None
    feed_forward: nn.Module | None = None
    cross: nn.Module | None = None
    post_mixer: nn.Module | None = None
    post_feed_forward: nn.Module | None = None


@dataclass(frozen=True)
class LayerParts:
    """Everything an explanation reads of one layer, named (`layers[L].parts`).

    Attributes:
        mixers: what mixes its tokens, in the order it runs them: one for most layers, two
            for a layer running Mamba-2 beside attention (Falcon-H1) or in turn (Zamba2's
            hybrid layers), none for a feed-forward-only layer (Nemotron-H's MLP layers).
        norms: its [`LayerNorms`][qkv.models.protocol.LayerNorms].
        feed_forward: the feed-forward (MLP, gated, mixture of experts) or None.
        residual: its [`ResidualForm`][qkv.models.protocol.ResidualForm]; `residual_note` what
            its forward showed (why it is `other`).
        scales: a `scaled` layer's [`ResidualScales`][qkv.models.protocol.ResidualScales], else
            None.
        reads_embeddings: its softmax mixer reads n₁([x; e]), x concatenated with what entered
            layer 0 (Zamba2's shared block; n₁ `norms.mixer`), and its output reaches the
            stream only through the layer's other parts: the layer writes as one component.
    """

    mixers: tuple[Mixer, ...]
    norms: LayerNorms
    feed_forward: nn.Module | None
    residual: ResidualForm
    residual_note: str = ""
    scales: ResidualScales | None = None
    reads_embeddings: bool = False

    @property
    def attention(self) -> AttentionLayerLike | None:
        """The attention qkv computes in this layer (the first softmax-kind mixer's), or None."""
        return next((m.attention for m in self.mixers if m.attention is not None), None)


@dataclass(frozen=True)
class Embeddings:
    """What enters layer 0, by table: `hidden_states[0] = norm(scale · Σ rows)`.

    Attributes:
        tables: name → module, in the order they are summed: `"token"` (an `nn.Embedding`;
            called on the ids: a scaled embedding scales its rows), `"position"` and
            `"type"` (modules with a `weight` (n, E): rows read by index) where the model
            has them.
        position_offset: the position table's row of position 0 (RoBERTa: 2).
        position_pad: a transformers RoBERTa's padding id: its positions count the non-padding
            tokens from `position_pad + 1`; None: positions are offset + 0 … t − 1.
        norm: the embedding norm (BERT) or None.
        scale: a multiplier after the sum (Granite's `embedding_multiplier`), 1 if none.
    """

    tables: Mapping[str, nn.Module]
    position_offset: int = 0
    position_pad: int | None = None
    norm: nn.Module | None = None
    scale: float = 1.0

    def position_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """(t,) the position table's row each token of `ids` (t,) reads: offset + its
        position; with `position_pad`, the count of non-padding tokens from pad + 1 (padding
        reads row pad)."""
        import torch

        if self.position_pad is None:
            return self.position_offset + torch.arange(len(ids), device=ids.device)
        real = (ids != self.position_pad).long()  # (t,)
        return torch.cumsum(real, 0) * real + self.position_pad

    def rows(self, ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """Each table's rows (t, E) for the text `ids` (t,), by name: the token module called
        on the ids (a scaled embedding scales them), the position rows, segment row 0 (one
        text); `norm(scale · Σ rows)` is what enters layer 0."""
        out = {}
        for name, table in self.tables.items():
            if name == "token":
                out[name] = table(ids)
            elif name == "position":
                out[name] = table.weight[self.position_rows(ids)]
            else:  # one text: every token is segment 0
                out[name] = table.weight[0].expand(len(ids), -1)
        return out


@dataclass(frozen=True)
class Unembedding:
    """The read-out of a model with next-token logits: `z = (norm(x) · weightᵀ + bias) ·
    scale` with x the last layer's output, the logits z or, with `softcap` c, c·tanh(z/c)
    (Gemma 2); `weight` (V, E), `bias` (V,) or None, `norm` the final norm or None,
    `scale` a multiplier after the product (1/`logits_scaling`)."""

    weight: torch.Tensor
    bias: torch.Tensor | None = None
    norm: nn.Module | None = None
    scale: float = 1.0
    softcap: float | None = None


@dataclass(frozen=True)
class ModelParts:
    """Every part of a self-attention model an explanation reads (`model.parts`).

    Attributes:
        embeddings: its [`Embeddings`][qkv.models.protocol.Embeddings], or None where no tables
            rebuild layer 0's input (a projection after them: ELECTRA's `embeddings_project`).
        layers: one [`LayerParts`][qkv.models.protocol.LayerParts] per layer of `model.layers`, in
            order.
        unembedding: the [`Unembedding`][qkv.models.protocol.Unembedding] of a model with next-token
            logits; None otherwise (an encoder) or where no norm and matrix rebuild its logits.
    """

    embeddings: Embeddings | None
    layers: tuple[LayerParts, ...]
    unembedding: Unembedding | None = None


# -- the protocol, typed -------------------------------------------------------------------------
@runtime_checkable
class TokenizerLike(Protocol):
    """What explanations ask a self-attention model's tokenizer
([`qkv.models.Tokenizer`][qkv.models.Tokenizer])."""

    name: str
    max_length: int | None  # the most tokens the model takes, special tokens included

    @property
    def vocab_size(self) -> int: ...

    @property
    def special_ids(self) -> frozenset[int]: ...

    def encode(self, text: str, *, max_length: int | None = None,
               truncate: bool = False) -> Encoding: ...

    def decode(self, ids, *, skip_special_tokens: bool = True) -> str: ...

    def id_to_token(self, i: int) -> str | None: ...

    def token_to_id(self, token: str) -> int | None: ...


@runtime_checkable
class AttentionLayerLike(Protocol):
    """`layers[L].self_attn`: its sizes (h query heads, h_kv key/value heads, d, the width E it
    reads) and, with `capabilities.head_weights`, its projections (`q_proj` … `out_proj`)."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    embed_dim: int


@runtime_checkable
class SelfAttentionModel(Protocol):
    """A model explained by its self-attention (`capabilities.self_attention`): a native
    family, the shipped `lm`, a transformers model behind qkv's attention (`HFModel`).

    `model(input_ids (b, t), attention_mask (b, t), *, trace_rows=, output_hidden_states=,
    interventions=)` is its own forward: an `EncoderOutput` or `DecoderOutput` whose
    `traces[L].self_attn` holds the rows asked for (`qkv.explain.forward` reads it).
    """

    capabilities: Capabilities
    name: str
    config: object
    tokenizer: TokenizerLike

    @property
    def layers(self) -> Sequence: ...  # layers[L].parts: a LayerParts; .self_attn its attention or None

    @property
    def parts(self) -> ModelParts: ...

    def stop_note(self, layer: int) -> str: ...  # why a forward cannot stop after `layer`; "" where it can

    def __call__(self, input_ids, attention_mask=None, **kwargs): ...


@runtime_checkable
class CrossLayerLike(Protocol):
    """`cross_layers[L]` of a cross-attention model: its cross-attention (an
    [`AttentionLayerLike`][qkv.models.protocol.AttentionLayerLike]: sizes, and W_Q … W_O with
    `capabilities.head_weights`) and whether it reads a norm of the residual stream (pre-norm) or
    the stream itself."""

    cross_attn: AttentionLayerLike
    norm_first: bool


@runtime_checkable
class CrossAttentionModel(Protocol):
    """A model explained by its cross-attention (`capabilities.cross_attention`): the
    translation model, a transformers encoder-decoder (`Seq2SeqModel`).

    `cross_pass(text, target=None)` → [`CrossPass`][qkv.models.protocol.CrossPass] (one
    teacher-forced forward; None: the model's own greedy translation), `cross_shape` (decoder
    layers, heads per layer), `translate(texts, beam=1)` → one string per text,
    `gold_alignment(text)` → the alignment the model knows for `text` or None.
    """

    capabilities: Capabilities
    name: str
    config: object

    @property
    def cross_layers(self) -> Sequence[CrossLayerLike]: ...

    @property
    def cross_shape(self) -> tuple[int, int]: ...

    def cross_pass(self, text: str, target: str | None = None) -> CrossPass: ...

    def translate(self, texts: list[str], *, beam: int = 1) -> list[str]: ...

    def gold_alignment(self, text: str) -> Gold: ...


def capabilities_of(model) -> Capabilities:
    """`model.capabilities`, or a `ValueError` naming what was given instead."""
    caps = getattr(model, "capabilities", None)
    if not isinstance(caps, Capabilities):
        raise ValueError(f"model must be a qkv model (from qkv.load) with .capabilities, got "
                         f"{type(model).__name__}")
    return caps


class TooLong(QkvError):
    """A text or target that tokenises to more tokens than the model has positions.

    `argument` names the argument it came from (`"text"` or `"target"`), so an explanation
    can re-raise it as an `ArgumentError` in its caller's words.
    """

    def __init__(self, argument: str, n: int, limit: int, model: str):
        self.argument, self.n, self.limit = argument, n, limit
        super().__init__(f"{argument} tokenises to {n} tokens, more than the {limit} positions "
                         f"{model} has; give a shorter {argument}")
