"""An encoder-decoder's cross-attention: where each target token looked in the source.

The model translates the text greedily (or takes `target=`); then one teacher-forced forward
pass over that target records every cross-attention weight (the model's `cross_pass`,
[`CrossPass`][qkv.models.protocol.CrossPass]). Target position j is the decoder position that
*produces* target token j (its input is token j−1), so row j of a head's (t, s) map is where that
head looked while the model chose token j:

```text
source (keys, from the encoder's memory)
the   red   apple  is   [EOS]
```
    la          ■                                  ← producing "la"
    pomme             ·     ■
    rouge             ■
    est                            ■
    [EOS]                               ■

[`cross_attention`][qkv.explain.cross.cross_attention] returns every weight, each head's
most-attended source token per target token, checked against a gold alignment when there is one
(`gold=`; by default the model's own: `model.gold_alignment(text)`, which the toy translation model
answers from its grammar and a transformers encoder-decoder leaves empty), and — with `token` — that
target token's top source tokens per head.
[`cross_attention_head`][qkv.explain.cross.cross_attention_head] redoes one head's arithmetic for
one target token — the decoder's query against the encoder's keys and values — in float64 with
[`head_steps`][qkv.explain.steps.head_steps] and compares it with the forward's own numbers.

Both take a model whose `capabilities.cross_attention` is true (`qkv.load("translate")`:
the shipped one; a transformers encoder-decoder directory — Marian, BART, mBART, M2M100, T5 —
through `qkv.hf.seq2seq`), or a name/directory [`qkv.load`][qkv.load] reads; they ask it only for
`cross_pass`, `cross_shape` and `gold_alignment` ([`qkv.models.protocol`][qkv.models.protocol]).
`target=` teacher-forces a given translation instead of the model's own. `qkv explain TEXT --model
translate` prints these results (`qkv.explain.render_cross`) and draws them
(`qkv.explain.figures`).
"""

from __future__ import annotations

from typing import ClassVar

import os
from dataclasses import dataclass, replace

import torch

from qkv.explain.forward import check_index, check_top
from qkv.explain.jsonable import numbers
from qkv.explain.select import Units, choose
from qkv.explain.steps import HeadSteps, head_steps
from qkv.explain.wording import ArgumentError, Message
from qkv.explain.finite import NonFiniteError, check_layers, describe
from qkv.models.protocol import CrossPass, Gold, TooLong, capabilities_of
from qkv.translate.model import TranslationTrace
from qkv.text import is_blank, shown

GOLD_MARK = "✓"


@dataclass(frozen=True)
class CrossAttention:
    """One sentence's translation and every cross-attention weight of the forward that scored it.

    Attributes:
        model: the checkpoint's name (`"translate (shipped)"` or its directory).
        text: as given.
        source: the s source tokens, special tokens included (the keys).
        target: the t target tokens, ending with the end-of-sequence token (the queries).
        translation: the target as text.
        weights: (L, H, t, s) cross-attention weights, exactly as the forward computed them.
        gold: per target word (not [EOS]), the gold source token indices; None when there is no
            gold alignment (the model knows none, or its target differs from the gold's).
        gold_note: why `gold` is None (or None).
        trace: the full `TranslationTrace` (queries, keys, values, scores… per layer) of
            qkv's translation model; None for a model that keeps no such trace.
        token: the target token chosen for a closer look (its top source tokens), or None.
        focus: the target token a viewer opens at: `token`, else the last target word (the
            default `choose` resolves).
        top: how many source tokens that closer look lists per head.
        layers: the decoder layers shown (all, or the one asked for).
        notes: how an ambiguous `token` was resolved.
        special: per target token, whether it is a special token ([EOS], a language code).
    """

    kind: ClassVar[str] = "cross"  # its row in qkv.explain.kinds.KINDS

    model: str
    text: str
    source: list[str]
    target: list[str]
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
        """(L, H, t): the source index each head attends to most, per target position."""
        return self.weights.argmax(-1)

    def is_gold(self, j: int, i: int) -> bool | None:
        """Whether source token i is in target token j's gold alignment (None: no gold)."""
        if self.gold is None or j >= len(self.gold):
            return None
        return i in self.gold[j]

    def alignment(self) -> torch.Tensor | None:
        """(L, H) correct counts over the target words (not [EOS]); None without gold."""
        if self.gold is None:
            return None
        n = len(self.gold)
        gold = torch.zeros(n, len(self.source), dtype=torch.bool)
        for j, srcs in enumerate(self.gold):
            gold[j, list(srcs)] = True
        return gold[torch.arange(n), self.argmax[..., :n]].sum(-1)  # (L, H)

    def top_weights(self, layer: int, head: int, j: int) -> list[tuple[int, float]]:
        """The `top` largest weights of target token j as (source index, weight), largest first."""
        w = self.weights[layer, head, j]
        values, index = w.topk(min(self.top, w.numel()))
        return [(int(i), float(v)) for v, i in zip(values, index)]

    def ranking(self, j: int) -> list[tuple[int, int]]:
        """The shown heads as (layer, head) for target token j, best first: most target words
        on gold (when there is gold), then the largest weight at j, then layer, head."""
        counts = self.alignment()
        def key(lh):
            l, h = lh
            return (-(int(counts[l, h]) if counts is not None else 0),
                    -float(self.weights[l, h, j].max()), l, h)
        return sorted(((l, h) for l in self.layers for h in range(self.num_heads)), key=key)

    def to_dict(self) -> dict:
        """Every weight shown (`weights[l][h][j][i]` for the `layers`), each head's summary
        (what `qkv explain TEXT --model translate --json` prints) and, per target token j,
        `ranking[j]`: the heads best first ([`ranking`][qkv.explain.cross.CrossAttention.ranking])."""
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
                    entry["top"] = [{"index": i, "token": self.source[i], "weight": w,
                                     "gold": self.is_gold(self.token, i)}
                                    for i, w in self.top_weights(l, h, self.token)]
                heads.append(entry)
        return {"kind": self.kind,
            "model": self.model, "text": self.text, "source": self.source, "target": self.target,
            "translation": self.translation, "layers": list(self.layers), "num_heads": self.num_heads,
            "weights": self.weights[list(self.layers)].tolist(),
            "gold": [list(g) for g in self.gold] if self.gold else None,
            "gold_note": self.gold_note, "token": self.token, "focus": self.focus, "heads": heads,
            "num_layers": len(self.layers),
            "alignment": counts[list(self.layers)].tolist() if counts is not None else None,
            "ranking": [[{"layer": l, "head": h} for l, h in self.ranking(j)]
                        for j in range(len(self.target))],
            "notes": [str(n) for n in self.notes],
        }


@dataclass(frozen=True)
class CrossHeadSteps:
    """One cross-attention head's arithmetic for one target token — what
    [`cross_attention_head`][qkv.explain.cross.cross_attention_head] returns.

    Attributes:
        attention: the sentence's [`CrossAttention`][qkv.explain.cross.CrossAttention] (its `token`
            is the target token).
        steps: the float64 recomputation; `steps.tokens` are the source keys and
            `steps.token_index` is the target position.
        norm_first: whether the decoder is pre-norm (it says where `steps.x` comes from).
    """

    kind: ClassVar[str] = "cross_steps"  # its row in qkv.explain.kinds.KINDS

    attention: CrossAttention
    steps: HeadSteps
    norm_first: bool

    @property
    def target_index(self) -> int:
        return self.steps.token_index

    @property
    def notes(self) -> tuple[Message, ...]:
        return self.attention.notes

    @property
    def gold(self) -> tuple[int, ...] | None:
        """The gold source indices of this target token, or None."""
        gold, j = self.attention.gold, self.target_index
        return gold[j] if gold and j < len(gold) else None

    @property
    def x_source(self) -> str:
        """Which vector the query was projected from, in words."""
        ca, j = self.attention, self.target_index
        previous = "the decoder start token" if j == 0 else repr(ca.target[j - 1])
        where = ("norm2 of the vector after the layer's self-attention (pre-norm)" if self.norm_first
                 else "the vector after the layer's self-attention block (post-norm: its norm1 output)")
        return (f"the decoder's vector at target position {j} in layer {self.steps.layer}: {where}; "
                f"position {j} reads {previous} and produces {ca.target[j]!r}")

    def to_dict(self) -> dict:
        """Every number in full (what `qkv explain TEXT --model translate --layer L --head H
        --json` prints); −inf as `qkv.explain.jsonable` says."""
        st, ca, j = self.steps, self.attention, self.target_index
        gold = self.gold
        return {
            "model": ca.model, "text": ca.text, "kind": self.kind, "source": ca.source,
            "target": ca.target, "translation": ca.translation, "layer": st.layer, "head": st.head,
            "target_index": j, "target_token": ca.target[j], "x_source": self.x_source,
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
    """`model` itself when it has cross-attention, else [`qkv.load`][qkv.load] of a name/directory.

    (A `Checkpoint` is read as its `model`.)
    """
    if isinstance(model, (str, os.PathLike)):
        from qkv.models.loading import load

        model = load(model)
    from qkv.translate.checkpoint import Checkpoint

    if isinstance(model, Checkpoint):
        model = model.model
    if not capabilities_of(model).cross_attention:
        if target is not None:
            raise ArgumentError("target", "{name} is for encoder-decoders (a translation to "
                                "teacher-force); {value!r} has no cross-attention: explain its "
                                "self-attention without {name}",
                                value=model.name)
        raise ArgumentError("model", "{name} {value!r} has no cross-attention (it is not an "
                            "encoder-decoder); explain its self-attention instead",
                            value=model.name)
    return model


def check_layer_head(model, layer: int | None, head: int | None) -> None:
    """ArgumentError when the decoder has no such `layer` or `head`."""
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
    """ArgumentError for an empty or blank `target` (None: the model translates)."""
    if target is not None and (not target or is_blank(target)):
        raise ArgumentError("target", "{name} is empty ({value}); give the translation to "
                            "teacher-force, or leave {name} out for the model's own",
                            value=shown(target))


def cross_pass(model, text: str, target: str | None = None) -> CrossPass:
    """`model.cross_pass` with a too-long `target` named as the argument it is, and the first
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
    """Translate `text` (or take `target`) and trace the forward pass over it (see the
    module doc); `gold` None: the model's own (`model.gold_alignment(text)`)."""
    cp = cross_pass(model, text, target)
    links, note = _gold(model.gold_alignment(text) if gold is None else gold, cp.words)
    return CrossAttention(model=model.name, text=text, source=cp.source, target=cp.target,
                          translation=cp.translation, weights=cp.cross, gold=links,
                          gold_note=note, trace=cp.trace, layers=tuple(range(cp.cross.shape[0])),
                          special=tuple(cp.special))


def _gold(gold: Gold, words: list[str]) -> tuple[list[tuple[int, ...]] | None, str | None]:
    """A gold alignment as (links, None) when it is for the target `words`, else (None, why)."""
    if gold is None:
        return None, None
    if isinstance(gold, str):
        return None, gold
    reference, links = gold
    if list(reference) != words:
        return None, (f"no gold alignment: the translation differs from the gold's "
                      f"({' '.join(reference)!r})")
    return [tuple(int(i) for i in g) for g in links], None


def _target_units(ca: CrossAttention) -> Units:
    return Units(labels=ca.target, groups=[(j,) for j in range(len(ca.target))],
                 special=list(ca.special), words=False, num_tokens=len(ca.target))


def cross_attention(model, text: str, *, token: str | None = None, top: int = 3,
                    layer: int | None = None, gold: Gold = None,
                    target: str | None = None) -> CrossAttention:
    """Translate `text` and return every cross-attention weight of the pass that scored it.

    Args:
        model: a model with cross-attention (`qkv.load("translate")`, a transformers
            encoder-decoder), or a name/directory [`qkv.load`][qkv.load] reads.
        token: a target token to look at closer (a word, `"word@N"` or an index, as in
            `choose`); its top source tokens go into `to_dict()`.
        top: how many source tokens to list for `token`, per head.
        layer: show only this decoder layer.
        gold: `(target_tokens, links)`: a reference translation and, per target word, the
            source token indices it translates, used when the translation's words equal it; or
            a string saying why there is none (kept as `gold_note`; it also turns a model's
            own gold off). None (the default): the model's own, `model.gold_alignment(text)`
            — the toy translation model's grammar (`qkv.translate.gold.grammar_gold`),
            nothing for a transformers encoder-decoder.
        target: a translation to teacher-force instead of the model's own (tokenised as the
            model trains on it: `tokenizer(text_target=target)` for a transformers model).

    Raises:
        ArgumentError: `token` not in the translation, `layer` out of range, `top` < 1;
            `target` empty, longer than the model's positions, or given to a model without
            cross-attention.
        QkvError: an empty text, a word the model does not know, a bad checkpoint.

    Examples:
        >>> import qkv
        >>> ca = cross_attention(qkv.load("translate"), "the red apple is next to the black cats")
        >>> ca.translation, ca.weights.shape                      # (L, H, t, s)
        ('la pomme rouge est à côté des chats noirs', torch.Size([3, 4, 10, 10]))
        >>> ca.source[int(ca.argmax[1, 0, 2])], ca.target[2]     # L1 H0 while producing "rouge"
        ('red', 'rouge')
        >>> ca.alignment()[1, 0].item(), len(ca.gold)          # on the grammar's gold for all 9 words
        (9, 9)
    """
    check_top(top)
    model = translation_model(model, target=target)
    check_layer_head(model, layer, None)
    ca = _translate_and_trace(model, text, gold, target)
    choice = choose(token, _target_units(ca), role="token")  # token=None: the default, resolved here
    return replace(ca, token=choice.unit if token is not None else None, focus=choice.unit, top=top,
                   layers=ca.layers if layer is None else (layer,),
                   notes=(choice.note,) if token is not None and choice.note else ())


def cross_attention_head(model, text: str, *, token: str | None = None, layer: int, head: int,
                         gold: Gold = None, target: str | None = None) -> CrossHeadSteps:
    """One cross-attention head's arithmetic for one target token, redone in float64.

    On every cross-attention model the same steps: x (what the decoder layer's cross-attention
    received) · W_Q + b → q; each source token's memory vector (the encoder's output) · W_K + b
    → k_i, · W_V + b → v_i; the scores scaled by the model's own scale (1/√d; 1 for T5, which
    leaves it out), its mask and bias, softmax, Σ w·v — compared stage by stage with the
    forward's (`steps.diffs`). A transformers encoder-decoder's W_Q, W_K, W_V come from
    `qkv.hf.projections`' table, checked against its forward (`steps.projection` says why
    where they could not be read: then q, k, v are the kernel's).

    Args:
        model, gold, target: as for [`cross_attention`][qkv.explain.cross.cross_attention].
        token: the target token (None: the last target word).
        layer, head: the decoder layer and the head within it, counting from 0.

    Raises:
        ArgumentError: `token` not in the translation, `layer`/`head` out of range.
        QkvError: as for [`cross_attention`][qkv.explain.cross.cross_attention].

    Examples:
        >>> text = "the red apple is next to the black cats"
        >>> cs = cross_attention_head("translate", text, token="rouge", layer=2, head=1)
        >>> cs.target_index, cs.gold, cs.steps.max_abs_diff < 1e-4
        (2, (1,), True)
    """
    return cross_attention_heads(model, text, token=token, heads=[(layer, head)], gold=gold,
                                 target=target)[0]


def cross_attention_heads(model, text: str, *, token: str | None = None,
                          heads: list[tuple[int, int]], gold: Gold = None,
                          target: str | None = None) -> list[CrossHeadSteps]:
    """[`cross_attention_head`][qkv.explain.cross.cross_attention_head] of one target token for each
    `(layer, head)` in `heads`, from one translation and its one traced forward (a page showing
    every head of a token needs one, not L·H).

    Examples:
        >>> text = "the red apple is next to the black cats"
        >>> both = cross_attention_heads("translate", text, token="rouge", heads=[(0, 0), (2, 1)])
        >>> [(cs.steps.layer, cs.steps.head) for cs in both]
        [(0, 0), (2, 1)]
    """
    model = translation_model(model, target=target)
    for layer, head in heads:
        check_layer_head(model, layer, head)
    ca = _translate_and_trace(model, text, gold, target)
    choice = choose(token, _target_units(ca), role="token")
    j = choice.unit
    out = []
    for layer, head in heads:
        decoder_layer = model.cross_layers[layer]  # its cross_attn (h, d, W_Q, W_K, W_V), norm_first
        steps = head_steps(decoder_layer.cross_attn, ca.trace.decoder[layer].cross_attn,
                           layer=layer, head=head, row=j, tokens=ca.source, model=ca.model, text=text)
        one = replace(ca, token=j, focus=j, layers=(layer,), notes=(choice.note,) if choice.note else ())
        out.append(CrossHeadSteps(attention=one, steps=steps, norm_first=decoder_layer.norm_first))
    return out
