"""The one model protocol: what an explainable model provides and what it can do.

Explanations, the CLI and the viewer ask a model for its :class:`Capabilities` — never for its
class, family or a kind string. Every model :func:`qkv.load` returns (a native family, the
shipped ``lm``, a transformers model behind qkv's attention, a transformers encoder-decoder, the
translation model) meets :class:`SelfAttentionModel` or :class:`CrossAttentionModel` — typed
below, checked for every loader by ``tests/models/test_protocol.py`` — so explanations read these
attributes directly, never guessing with ``hasattr``:

``capabilities``
    a :class:`Capabilities` (frozen; a class attribute is enough).
``name``
    a short string for messages (``"all-MiniLM-L6-v2"``, ``"translate (shipped)"``).
``config``
    its config dataclass (sizes: layers, heads, vocabulary).
``tokenizer``
    a :class:`~qkv.models.Tokenizer` (``encode(text).tokens / .ids``, ``id_to_token``,
    ``special_ids``, ``max_length``), for self-attention models; a cross-attention model reads
    its text through ``cross_pass`` instead.
``layers``
    the self-attention stack's layers: ``layers[L].self_attn`` is a
    :class:`~qkv.modules.MultiHeadAttention` (``num_heads``, ``head_dim``, its projections when
    ``capabilities.head_weights``); a translation model's are ``decoder.layers`` (self and
    ``cross_attn``).
``forward(..., trace_rows=...)``
    the model's own forward, recording :class:`~qkv.attention.AttentionTrace` s for the rows
    asked for (what :mod:`qkv.explain.forward` reads); a translation model's is ``trace(src, tgt)``.
``cross_pass(text, target=None)``, ``cross_shape``
    (models with ``capabilities.cross_attention``) one teacher-forced forward over ``target``
    (None: the model's own greedy translation) → a :class:`CrossPass`; ``cross_shape`` is
    (decoder layers, heads per layer).
``gold_alignment(text)``
    (models with ``capabilities.cross_attention``) a :data:`Gold` alignment for ``text`` when the
    model knows one (the toy translation model: its grammar's), else None (a transformers
    encoder-decoder). :mod:`qkv.explain.cross` and :func:`qkv.explain.attention_maps` read
    nothing else.

Which explanation applies is a question to :class:`Capabilities`:

======================  ===================================================================
``self_attention``      ``explain``, ``explain_head``, ``heads``, ``attention_map(s)``, probes
``cross_attention``     ``cross_attention``, ``cross_attention_head`` (a decoder reading an
                        encoder's memory: translation)
``causal``              a token sees itself and earlier tokens only (decoders); the induction and
                        previous-token probes need it; the coref probe needs it off
``next_token``          next-token logits (a language-model head): the ``grad`` method's target
                        without a ``target_text``
``head_weights``        W_Q, W_K, W_V, W_O of each head are known (``explain_head``'s step by step,
                        the norm-based contribution methods)
======================  ===================================================================

    >>> ENCODER.self_attention, ENCODER.causal, TRANSLATION.cross_attention
    (True, False, True)
    >>> capabilities_of(object())
    Traceback (most recent call last):
    ...
    ValueError: model must be a qkv model (from qkv.load) with .capabilities, got object
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from qkv.errors import QkvError

if TYPE_CHECKING:
    import torch

    from qkv.models.tokenizer import Encoding


@dataclass(frozen=True)
class Capabilities:
    """What a model can be asked (see the module doc for what each field enables).

    Fields:
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
    """One teacher-forced forward of an encoder-decoder: what ``model.cross_pass(text, target=)``
    returns (every model with ``capabilities.cross_attention`` has that method).

    Target position j is the decoder position that *produces* target token j (its input is
    token j−1, the decoder start token at j = 0), so row j of a cross map is where the decoder
    looked while choosing token j.

    Fields:
        source: the s source tokens as shown (the keys), special tokens included.
        target: the t target tokens (the queries), end-of-sequence included.
        special: (t,) whether each target token is a special token (EOS, a language code).
        words: the target's non-special tokens, in order (what a gold alignment is written for).
        translation: the target as text.
        cross: (L, H, t, s) cross-attention weights, exactly as the forward computed them.
        encoder: (L_enc, H, s, s) and decoder: (L, H, t, t) the self-attention weights of the
            same forward.
        trace: the model's own full trace when it keeps one (the translation model's
            ``TranslationTrace``: queries, keys, values per layer), else None.
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


# -- the protocol, typed -------------------------------------------------------------------------
@runtime_checkable
class TokenizerLike(Protocol):
    """What explanations ask a self-attention model's tokenizer (:class:`qkv.models.Tokenizer`)."""

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
    """``layers[L].self_attn``: its sizes (h, d) and, with ``capabilities.head_weights``, its
    projections (``q_proj`` … ``out_proj``)."""

    num_heads: int
    head_dim: int


@runtime_checkable
class SelfAttentionModel(Protocol):
    """A model explained by its self-attention (``capabilities.self_attention``): a native
    family, the shipped ``lm``, a transformers model behind qkv's attention (``HFModel``).

    ``model(input_ids (b, t), attention_mask (b, t), *, trace_rows=, output_hidden_states=,
    interventions=)`` is its own forward: an ``EncoderOutput`` or ``DecoderOutput`` whose
    ``traces[L].self_attn`` holds the rows asked for (:mod:`qkv.explain.forward` reads it).
    """

    capabilities: Capabilities
    name: str
    config: object
    tokenizer: TokenizerLike

    @property
    def layers(self) -> Sequence: ...  # layers[L].self_attn: an AttentionLayerLike

    def __call__(self, input_ids, attention_mask=None, **kwargs): ...


@runtime_checkable
class CrossAttentionModel(Protocol):
    """A model explained by its cross-attention (``capabilities.cross_attention``): the
    translation model, a transformers encoder-decoder (``Seq2SeqModel``).

    ``cross_pass(text, target=None)`` → :class:`CrossPass` (one teacher-forced forward; None:
    the model's own greedy translation), ``cross_shape`` (decoder layers, heads per layer),
    ``translate(texts, beam=1)`` → one string per text, ``gold_alignment(text)`` → the
    alignment the model knows for ``text`` or None.
    """

    capabilities: Capabilities
    name: str
    config: object

    @property
    def cross_shape(self) -> tuple[int, int]: ...

    def cross_pass(self, text: str, target: str | None = None) -> CrossPass: ...

    def translate(self, texts: list[str], *, beam: int = 1) -> list[str]: ...

    def gold_alignment(self, text: str) -> Gold: ...


def capabilities_of(model) -> Capabilities:
    """``model.capabilities``, or a ``ValueError`` naming what was given instead."""
    caps = getattr(model, "capabilities", None)
    if not isinstance(caps, Capabilities):
        raise ValueError(f"model must be a qkv model (from qkv.load) with .capabilities, got "
                         f"{type(model).__name__}")
    return caps


class TooLong(QkvError):
    """A text or target that tokenises to more tokens than the model has positions.

    ``argument`` names the argument it came from (``"text"`` or ``"target"``), so an explanation
    can re-raise it as an :class:`~qkv.explain.wording.ArgumentError` in its caller's words.
    """

    def __init__(self, argument: str, n: int, limit: int, model: str):
        self.argument, self.n, self.limit = argument, n, limit
        super().__init__(f"{argument} tokenises to {n} tokens, more than the {limit} positions "
                         f"{model} has; give a shorter {argument}")
