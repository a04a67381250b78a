"""A translation model's cross-attention: where each generated French word looked in the English.

The model translates the text greedily; then one teacher-forced forward pass over its own output
records every cross-attention weight (:meth:`TranslationModel.trace`). French position j is the
decoder position that *produces* French token j (its input is token j−1), so row j of a head's
(t, s) map is where that head looked while the model chose token j::

                English (keys, from the encoder's memory)
                the   red   apple  is   [EOS]
    la          ■                                  ← producing "la"
    pomme             ·     ■
    rouge             ■
    est                            ■
    [EOS]                               ■

:func:`cross_attention` returns every weight, each head's most-attended English token per French
token, checked against a gold alignment when the caller gives one (``gold=``: the CLI and the viewer
pass the toy grammar's, :func:`qkv.translate.gold.grammar_gold`), and — with ``token`` — that
French token's top English tokens per head.
:func:`cross_attention_head` redoes one head's arithmetic for one French token — the decoder's
query against the encoder's keys and values — in float64 with :func:`~qkv.explain.steps.head_steps`
and compares it with the forward's own numbers.

Both take a model whose ``capabilities.cross_attention`` is true (``qkv.load("translate")``:
the shipped one; a transformers encoder-decoder directory — Marian, BART, mBART, M2M100, T5 —
through :mod:`qkv.hf.seq2seq`), or a name/directory :func:`qkv.load` reads; they ask it only for
``cross_pass`` and ``cross_shape`` (:mod:`qkv.models.protocol`). ``target=`` teacher-forces a
given translation instead of the model's own. "English" and "French" below are the source and
the target, whatever the languages. ``qkv explain TEXT --model
translate`` prints these results (:mod:`qkv.explain.render_cross`) and draws them
(:mod:`qkv.explain.figures`).
"""

from __future__ import annotations

from typing import ClassVar

import os
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from qkv.explain.forward import check_index, check_top
from qkv.explain.jsonable import numbers
from qkv.explain.select import Units, choose
from qkv.explain.steps import HeadSteps, head_steps
from qkv.explain.wording import ArgumentError, Message
from qkv.explain.finite import NonFiniteError, check_layers, describe
from qkv.models.protocol import CrossPass, TooLong, capabilities_of
from qkv.models.translation import TranslationTrace
from qkv.text import is_blank, shown

# gold= : (the reference French tokens, per French token its English indices), or why there is none
Gold = tuple[Sequence[str], Sequence[Sequence[int]]] | str | None

GOLD_MARK = "✓"


@dataclass(frozen=True)
class CrossAttention:
    """One sentence's translation and every cross-attention weight of the forward that scored it.

    Fields:
        model: the checkpoint's name (``"translate (shipped)"`` or its directory); text: as given.
        english: the s English tokens, ending with [EOS] (the keys).
        french: the t generated French tokens, ending with [EOS] (the queries).
        translation: the French sentence.
        weights: (L, H, t, s) cross-attention weights, exactly as the forward computed them.
        gold: per French token (not [EOS]), the gold English token indices; None when the caller
            gave none or the model's French differs from the gold's.
        gold_note: why ``gold`` is None (or None).
        trace: the full :class:`TranslationTrace` (queries, keys, values, scores… per layer) of
            qkv's translation model; None for a model that keeps no such trace.
        token: the French token chosen for a closer look (its top English tokens), or None.
        focus: the French token a viewer opens at: ``token``, else the last French word (the
            default :func:`~qkv.explain.select.choose` resolves).
        top: how many English tokens that closer look lists per head.
        layers: the decoder layers shown (all, or the one asked for).
        notes: how an ambiguous ``token`` was resolved.
        special: per French token, whether it is a special token ([EOS], a language code).
    """

    kind: ClassVar[str] = "cross"  # its row in qkv.explain.kinds.KINDS

    model: str
    text: str
    english: list[str]
    french: list[str]
    translation: str
    weights: torch.Tensor
    gold: list[tuple[int, ...]] | None
    gold_note: str | None
    trace: TranslationTrace | None
    token: int | None = None
    focus: int = 0
    top: int = 3
    layers: tuple[int, ...] = ()
    notes: tuple[Message, ...] = ()
    special: tuple[bool, ...] = ()

    @property
    def num_heads(self) -> int:
        return self.weights.shape[1]

    @property
    def argmax(self) -> torch.Tensor:
        """(L, H, t): the English index each head attends to most, per French position."""
        return self.weights.argmax(-1)

    def is_gold(self, j: int, i: int) -> bool | None:
        """Whether English token i is in French token j's gold alignment (None: no gold)."""
        if self.gold is None or j >= len(self.gold):
            return None
        return i in self.gold[j]

    def alignment(self) -> torch.Tensor | None:
        """(L, H) correct counts over the French tokens (not [EOS]); None without gold."""
        if self.gold is None:
            return None
        n = len(self.gold)
        gold = torch.zeros(n, len(self.english), dtype=torch.bool)
        for j, srcs in enumerate(self.gold):
            gold[j, list(srcs)] = True
        return gold[torch.arange(n), self.argmax[..., :n]].sum(-1)  # (L, H)

    def top_weights(self, layer: int, head: int, j: int) -> list[tuple[int, float]]:
        """The ``top`` largest weights of French token j as (English index, weight), largest first."""
        w = self.weights[layer, head, j]
        values, index = w.topk(min(self.top, w.numel()))
        return [(int(i), float(v)) for v, i in zip(values, index)]

    def ranking(self, j: int) -> list[tuple[int, int]]:
        """The shown heads as (layer, head) for French token j, best first: most French tokens
        on gold (when there is gold), then the largest weight at j, then layer, head."""
        counts = self.alignment()
        def key(lh):
            l, h = lh
            return (-(int(counts[l, h]) if counts is not None else 0),
                    -float(self.weights[l, h, j].max()), l, h)
        return sorted(((l, h) for l in self.layers for h in range(self.num_heads)), key=key)

    def to_dict(self) -> dict:
        """Every weight shown (``weights[l][h][j][i]`` for the ``layers``), each head's summary
        (what ``qkv explain TEXT --model translate --json`` prints) and, per French token j,
        ``ranking[j]``: the heads best first (:meth:`ranking`)."""
        counts = self.alignment()
        best = int(counts[list(self.layers)].max()) if counts is not None else None
        heads = []
        for l in self.layers:
            for h in range(self.num_heads):
                entry = {"layer": l, "head": h, "argmax": self.argmax[l, h].tolist()}
                if counts is not None:
                    entry["aligned"] = int(counts[l, h])
                    entry["alignment_accuracy"] = int(counts[l, h]) / len(self.gold)
                    entry["best_aligned"] = int(counts[l, h]) == best
                if self.token is not None:
                    entry["top"] = [{"index": i, "token": self.english[i], "weight": w,
                                     "gold": self.is_gold(self.token, i)}
                                    for i, w in self.top_weights(l, h, self.token)]
                heads.append(entry)
        return {"kind": self.kind,
            "model": self.model, "text": self.text, "english": self.english, "french": self.french,
            "translation": self.translation, "layers": list(self.layers), "num_heads": self.num_heads,
            "weights": self.weights[list(self.layers)].tolist(),
            "gold": [list(g) for g in self.gold] if self.gold else None,
            "gold_note": self.gold_note, "token": self.token, "focus": self.focus, "heads": heads,
            "num_layers": len(self.layers),
            "alignment": counts[list(self.layers)].tolist() if counts is not None else None,
            "ranking": [[{"layer": l, "head": h} for l, h in self.ranking(j)]
                        for j in range(len(self.french))],
            "notes": [str(n) for n in self.notes],
        }


@dataclass(frozen=True)
class CrossHeadSteps:
    """One cross-attention head's arithmetic for one French token — what
    :func:`cross_attention_head` returns.

    Fields:
        attention: the sentence's :class:`CrossAttention` (its ``token`` is the French token).
        steps: the float64 recomputation; ``steps.tokens`` are the English keys and
            ``steps.token_index`` is the French position.
        norm_first: whether the decoder is pre-norm (it says where ``steps.x`` comes from).
    """

    kind: ClassVar[str] = "cross_steps"  # its row in qkv.explain.kinds.KINDS

    attention: CrossAttention
    steps: HeadSteps
    norm_first: bool

    @property
    def french_index(self) -> int:
        return self.steps.token_index

    @property
    def notes(self) -> tuple[Message, ...]:
        return self.attention.notes

    @property
    def gold(self) -> tuple[int, ...] | None:
        """The gold English indices of this French token, or None."""
        gold, j = self.attention.gold, self.french_index
        return gold[j] if gold and j < len(gold) else None

    @property
    def x_source(self) -> str:
        """Which vector the query was projected from, in words."""
        ca, j = self.attention, self.french_index
        previous = "[BOS]" if j == 0 else repr(ca.french[j - 1])
        where = ("norm2 of the vector after the layer's self-attention (pre-norm)" if self.norm_first
                 else "the vector after the layer's self-attention block (post-norm: its norm1 output)")
        return (f"the decoder's vector at French position {j} in layer {self.steps.layer}: {where}; "
                f"position {j} reads {previous} and produces {ca.french[j]!r}")

    def to_dict(self) -> dict:
        """Every number in full (what ``qkv explain TEXT --model translate --layer L --head H
        --json`` prints); −inf as :mod:`qkv.explain.jsonable` says."""
        st, ca, j = self.steps, self.attention, self.french_index
        gold = self.gold
        return {
            "model": ca.model, "text": ca.text, "kind": self.kind, "english": ca.english,
            "french": ca.french, "translation": ca.translation, "layer": st.layer, "head": st.head,
            "french_index": j, "french_token": ca.french[j], "x_source": self.x_source,
            "gold": list(gold) if gold is not None else None,
            "head_dim": st.head_dim, "scale": st.scale, "x": numbers(st.x), "query": numbers(st.query),
            "memory": numbers(ca.trace.decoder[st.layer].cross_attn.key_input[0].double()),
            "keys": numbers(st.keys), "values": numbers(st.values), "scores": numbers(st.scores),
            "scaled": numbers(st.scaled), "mask": numbers(st.mask), "weights": numbers(st.weights),
            "weights_sum": float(st.weights.sum()), "output": numbers(st.output),
            "model_output": numbers(st.model_output),
            "model_weights": ca.weights[st.layer, st.head, j].tolist(),
            "max_abs_diff": st.max_abs_diff, "stage_max_abs_diff": st.diffs,
        }


def translation_model(model, *, target: str | None = None):
    """``model`` itself when it has cross-attention, else :func:`qkv.load` of a name/directory.

    (A :class:`~qkv.translate.checkpoint.Checkpoint` is read as its ``model``.)
    """
    if isinstance(model, (str, os.PathLike)):
        from qkv.models.loading import load

        model = load(model)
    model = getattr(model, "model", model)  # a translate Checkpoint → its model
    if not capabilities_of(model).cross_attention:
        if target is not None:
            raise ArgumentError("target", "{name} is for encoder-decoders (a translation to "
                                "teacher-force); {value!r} has no cross-attention: explain its "
                                "self-attention without {name}",
                                value=getattr(model, "name", type(model).__name__))
        raise ArgumentError("model", "{name} {value!r} has no cross-attention (it is not an "
                            "encoder-decoder); explain its self-attention instead",
                            value=getattr(model, "name", type(model).__name__))
    return model


def check_layer_head(model, layer: int | None, head: int | None) -> None:
    """ArgumentError when the decoder has no such ``layer`` or ``head``."""
    check_index("layer", layer)
    check_index("head", head)
    L, H = model.cross_shape
    if layer is not None and not 0 <= layer < L:
        raise ArgumentError("layer", "{name} {value} is out of range: the decoder has {n} layers "
                            "(0–{last})", value=layer, n=L, last=L - 1)
    if head is not None and not 0 <= head < H:
        raise ArgumentError("head", "{name} {value} is out of range: each layer has {n} heads "
                            "(0–{last})", value=head, n=H, last=H - 1)


def check_target(target: str | None) -> None:
    """ArgumentError for an empty or blank ``target`` (None: the model translates)."""
    if target is not None and (not target or is_blank(target)):
        raise ArgumentError("target", "{name} is empty ({value}); give the translation to "
                            "teacher-force, or leave {name} out for the model's own",
                            value=shown(target))


def cross_pass(model, text: str, target: str | None = None) -> CrossPass:
    """``model.cross_pass`` with a too-long ``target`` named as the argument it is, and the first
    non-finite weight refused (where it appeared)."""
    check_target(target)
    try:
        cp = model.cross_pass(text, target)
    except TooLong as e:
        if e.argument == "target":
            raise ArgumentError("target", "{name} tokenises to {n} tokens, more than the {limit} "
                                "positions {model} has; give a shorter {name}", n=e.n,
                                limit=e.limit, model=model.name) from None
        raise
    if cp.trace is not None:  # qkv's own layers: the first non-finite stage, named
        check_layers(cp.trace.encoder, model=model.name, part="encoder ")
        check_layers(cp.trace.decoder, model=model.name, part="decoder ")
    for part, w in (("encoder self-attention", cp.encoder), ("decoder self-attention", cp.decoder),
                    ("cross-attention", cp.cross)):
        bad = ~torch.isfinite(w)  # (L, H, ·, ·)
        if bad.any():
            layer, head = (int(i) for i in bad.nonzero()[0][:2])
            raise NonFiniteError(f"{model.name} computes a non-finite number: its {part} weights "
                                 f"are {describe(w[layer, head])} at layer {layer}, head {head}")
    return cp


def _translate_and_trace(model, text: str, gold: Gold, target: str | None = None) -> CrossAttention:
    """Translate ``text`` (or take ``target``) and trace the forward pass over it (see the
    module doc)."""
    cp = cross_pass(model, text, target)
    gold, note = _gold(gold, cp.words)
    return CrossAttention(model=model.name, text=text, english=cp.source, french=cp.target,
                          translation=cp.translation, weights=cp.cross, gold=gold,
                          gold_note=note, trace=cp.trace, layers=tuple(range(cp.cross.shape[0])),
                          special=tuple(cp.special))


def _gold(gold: Gold, french: list[str]) -> tuple[list[tuple[int, ...]] | None, str | None]:
    """The caller's gold as (links, None) when it is for the model's French, else (None, why)."""
    if gold is None:
        return None, None
    if isinstance(gold, str):
        return None, gold
    reference, links = gold
    if list(reference) != french:
        return None, (f"no gold alignment: the model's French differs from the gold's "
                      f"({' '.join(reference)!r})")
    return [tuple(int(i) for i in g) for g in links], None


def _french_units(ca: CrossAttention) -> Units:
    return Units(labels=ca.french, groups=[(j,) for j in range(len(ca.french))],
                 special=list(ca.special), words=False, num_tokens=len(ca.french))


def cross_attention(model, text: str, *, token: str | None = None, top: int = 3,
                    layer: int | None = None, gold: Gold = None,
                    target: str | None = None) -> CrossAttention:
    """Translate ``text`` and return every cross-attention weight of the pass that scored it.

    Args:
        model: a model with cross-attention (``qkv.load("translate")``), or a name/directory
            :func:`qkv.load` reads.
        token: a French token to look at closer (a word, ``"word@N"`` or an index, as in
            :func:`~qkv.explain.select.choose`); its top English tokens go into ``to_dict()``.
        top: how many English tokens to list for ``token``, per head.
        layer: show only this decoder layer.
        gold: ``(french_tokens, links)``: a reference translation and, per French token, the
            English token indices it translates (:func:`qkv.translate.gold.grammar_gold` for the
            toy grammar), used when the model's French equals it; or a string saying why there
            is none (kept as ``gold_note``); None: no gold.
        target: a translation to teacher-force instead of the model's own (tokenised as the
            model trains on it: ``tokenizer(text_target=target)`` for a transformers model).

    Raises:
        ArgumentError: ``token`` not in the translation, ``layer`` out of range, ``top`` < 1;
            ``target`` empty, longer than the model's positions, or given to a model without
            cross-attention.
        QkvError: an empty text, a word the model does not know, a bad checkpoint.

    Example:
        >>> import qkv
        >>> from qkv.translate.gold import grammar_gold
        >>> text = "the red apple is next to the black cats"
        >>> ca = cross_attention(qkv.load("translate"), text, gold=grammar_gold(text))
        >>> ca.translation, ca.weights.shape                      # (L, H, t, s)
        ('la pomme rouge est à côté des chats noirs', torch.Size([3, 4, 10, 10]))
        >>> ca.english[int(ca.argmax[1, 0, 2])], ca.french[2]    # L1 H0 while producing "rouge"
        ('red', 'rouge')
        >>> ca.alignment()[1, 0].item(), len(ca.gold)          # on gold for all 9 French words
        (9, 9)
    """
    check_top(top)
    model = translation_model(model, target=target)
    check_layer_head(model, layer, None)
    ca = _translate_and_trace(model, text, gold, target)
    choice = choose(token, _french_units(ca), role="token")  # token=None: the default, resolved here
    return replace(ca, token=choice.unit if token is not None else None, focus=choice.unit, top=top,
                   layers=ca.layers if layer is None else (layer,),
                   notes=(choice.note,) if token is not None and choice.note else ())


def cross_attention_head(model, text: str, *, token: str | None = None, layer: int, head: int,
                         gold: Gold = None) -> CrossHeadSteps:
    """One cross-attention head's arithmetic for one French token, redone in float64.

    Args:
        model, gold: as for :func:`cross_attention`.
        token: the French token (None: the last French word).
        layer, head: the decoder layer and the head within it, counting from 0.

    Raises:
        ArgumentError: ``token`` not in the translation, ``layer``/``head`` out of range.
        QkvError: as for :func:`cross_attention`.

    Example:
        >>> from qkv.translate.gold import grammar_gold
        >>> text = "the red apple is next to the black cats"
        >>> cs = cross_attention_head("translate", text, token="rouge", layer=2, head=1,
        ...                           gold=grammar_gold(text))
        >>> cs.french_index, cs.gold, cs.steps.max_abs_diff < 1e-4
        (2, (1,), True)
    """
    model = translation_model(model)
    if not capabilities_of(model).head_weights:
        raise ArgumentError("head", "{model} keeps its weights in transformers: qkv cannot redo "
                            "one head's arithmetic step by step for it yet; cross_attention shows "
                            "every head's weights (leave out {head})", model=model.name)
    check_layer_head(model, layer, head)
    ca = _translate_and_trace(model, text, gold)
    choice = choose(token, _french_units(ca), role="token")
    j = choice.unit
    steps = head_steps(model.decoder[layer].cross_attn, ca.trace.decoder[layer].cross_attn,
                       layer=layer, head=head, row=j, tokens=ca.english, model=ca.model, text=text)
    ca = replace(ca, token=j, focus=j, layers=(layer,), notes=(choice.note,) if choice.note else ())
    return CrossHeadSteps(attention=ca, steps=steps, norm_first=model.config.norm_first)
