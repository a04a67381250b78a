"""The overview: for one token (or word), every layer and head, ranked by its largest weight.

With `method=` (see [`qkv.explain.contributions`][qkv.explain.contributions]) the rows are that
method's scores instead of the weights, each row taken as shares of its total so heads compare on
one scale: per-head methods (`norm`) keep one row per head, per-layer methods (`rollout`, `alti`,
`value-zeroing`, `grad`) have one row per layer (`head` None).

Ranking rule: heads are sorted by the **largest weight** in the chosen token's row (most focused
first); the entropy of the row (in bits) is shown beside it as a second measure of spread.

Which heads stand out: the word that most heads put their largest weight on — not counting the
token itself, its immediate neighbours (position heads) or special tokens ([CLS]/[SEP], where
heads park attention they do not need) — is the *focus*; heads whose largest weight is on it are
highlighted. `to=WORD` (`--to WORD`) names the focus instead.

[`explain`][qkv.explain.overview.explain] is the entry point: a model and a text in, an
[`Overview`][qkv.explain.overview.Overview] out.
"""

from __future__ import annotations

from typing import ClassVar

from collections import Counter
from dataclasses import dataclass, replace

import torch

from qkv.models.protocol import capabilities_of
from qkv.explain import contributions
from qkv.explain.forward import (
    check_layer_head, check_text, check_top, encode, model_name, num_heads, num_layers,
)
from qkv.explain.select import Units, choose, choose_in, group_columns
from qkv.explain.mixer_maps import unscored_note
from qkv.explain.wording import Message

RANKING = "largest weight in the row (most focused first); entropy in bits beside it"
CAUSAL = ("decoder: each token attends to itself and the tokens before it only (causal mask); "
          "tokens after it get weight 0")


def ranking(method: str) -> str:
    """The ranking rule in words, for `method`."""
    if contributions.get_method(method).raw:
        return RANKING
    return (f"largest share of the row's {method} contribution (most focused first); entropy in "
            f"bits beside it")


@dataclass(frozen=True)
class HeadRow:
    """One head's attention from the chosen unit, over the units shown.

    Attributes:
        layer: counting from 0.
        head: counting from 0; None for a per-layer method's row.
        weights: (U,) the row of weights (or of a method's shares) over units (sums to 1, or
            is all 0 where a method found nothing).
        top: the `k` largest as (unit index, weight), largest first.
        entropy: of `weights`, in bits.
    """

    layer: int
    head: int | None
    weights: torch.Tensor
    top: list[tuple[int, float]]
    entropy: float

    @property
    def max_weight(self) -> float:
        return self.top[0][1]

    @property
    def argmax(self) -> int:
        return self.top[0][0]


@dataclass(frozen=True)
class Overview:
    """One token's (or word's) attention in every layer and head, ranked — what
    [`explain`][qkv.explain.overview.explain] returns.

    Attributes:
        model: the model's name.
        text: the text as given.
        tokens: its t tokens.
        units: the units shown (tokens, or words with `words=True`); `unit` is the chosen one.
        rows: one [`HeadRow`][qkv.explain.overview.HeadRow] per head (of `layer` only, when given),
            ranked as `RANKING` says.
        focus: the highlighted unit (`to`, or the one most heads point to), or None.
        focus_reason: why `focus` was highlighted, or why nothing was.
        num_layers: the model's layers.
        num_heads: its heads per layer.
        notes: how an ambiguous `token` was resolved (which occurrence, which word piece).
        method: the method the rows come from (`"weight"`: the attention weights) and
            whether it scores heads or layers (see
            [`qkv.explain.contributions`][qkv.explain.contributions]).
        per: whether the rows are heads or layers (`"head"` or `"layer"`).
        scores: the method's raw scores for the token's rows (`Scores.scores`: (L, h, r, s)
            or (L, r, s)), or None.
        target: what `grad` differentiated, or None.
        causal: the model is a decoder: a token attends to itself and earlier tokens only.
        sink: for a decoder, why the first token is named an attention sink (many heads put
            their largest weight on it), or None.
        unscored: the layers left out of `rows` (a hybrid's layers without softmax weights;
            `notes` says why, `scores` holds zeros there).
    """

    kind: ClassVar[str] = "overview"  # its row in qkv.explain.kinds.KINDS

    model: str
    text: str
    tokens: list[str]
    units: Units
    unit: int
    rows: list[HeadRow]
    focus: int | None
    focus_reason: Message
    num_layers: int
    num_heads: int
    notes: tuple[Message, ...] = ()
    method: str = contributions.DEFAULT
    per: str = "head"
    scores: torch.Tensor | None = None
    target: str | None = None
    causal: bool = False
    sink: Message | None = None
    unscored: tuple[int, ...] = ()

    def highlighted(self, row: HeadRow) -> bool:
        return self.focus is not None and row.argmax == self.focus

    def to_dict(self) -> dict:
        """Every number of the overview (what `qkv explain TEXT --json` prints)."""
        units = self.units
        group = units.groups[self.unit]
        extra = {}
        if self.scores is not None:  # token-level rows, averaged over the unit's tokens
            extra["scores"] = self.scores.double().mean(-2).tolist()
        if self.target is not None:
            extra["target"] = self.target
        if self.unscored:
            extra["unscored"] = {"layers": list(self.unscored), "why": str(self.notes[-1])}  # its note comes last
        if self.causal:
            extra["causal"] = CAUSAL
            extra["attention_sink"] = str(self.sink) if self.sink is not None else None
        return {"kind": self.kind,
            "model": self.model,
            "text": self.text,
            "tokens": self.tokens,
            "units": units.labels,
            "words": units.words,
            "word_rule": "weights into a word summed over its tokens, from a word averaged"
            if units.words else None,
            "unit_index": self.unit,
            "num_layers": self.num_layers,
            "num_heads": self.num_heads,
            "special": list(units.special),
            "unit": units.labels[self.unit],
            "token_indices": list(units.groups[self.unit]),
            "token_index": group[0],
            "method": self.method,
            "per": self.per,
            "ranking": ranking(self.method),
            "focus": units.labels[self.focus] if self.focus is not None else None,
            "heads": [
                {"layer": r.layer, "head": r.head, "max_weight": r.max_weight,
                 "argmax": units.labels[r.argmax], "entropy_bits": r.entropy,
                 "highlighted": self.highlighted(r),
                 "top": [{"index": i, "unit": units.labels[i], "weight": w} for i, w in r.top],
                 "weights": r.weights.tolist()}
                for r in self.rows
            ],
            **extra,
        }


def entropy_bits(p: torch.Tensor) -> torch.Tensor:
    """Shannon entropy of distributions along the last dim, in bits (0·log 0 = 0).

    Examples:
        >>> entropy_bits(torch.tensor([0.5, 0.5, 0.0])).item()
        1.0
    """
    p = p.double()
    logs = torch.where(p > 0, torch.log2(p.clamp_min(1e-300)), torch.zeros_like(p))
    return -(p * logs).sum(-1)


def unit_rows(weights: torch.Tensor, units: Units) -> torch.Tensor:
    """Token-level rows of one unit (..., r, s) → its unit-level row (..., U).

    The r rows are the tokens of the chosen unit: averaged (weights *from* a word), then the
    columns summed per unit (weights *into* a word).
    """
    return group_columns(weights.mean(dim=-2), units)


def head_rows(per_layer: list[torch.Tensor], units: Units, k: int) -> list[HeadRow]:
    """One [`HeadRow`][qkv.explain.overview.HeadRow] per (layer, head), in layer/head order.

    Args:
        per_layer: for each layer, the traced weights (h, r, s) of the chosen unit's tokens.
    """
    out = []
    for layer, w in enumerate(per_layer):
        rows = unit_rows(w.double(), units)  # (h, U)
        ent = entropy_bits(rows)
        values, index = rows.topk(min(k, rows.shape[-1]), dim=-1)  # (h, k)
        for head in range(rows.shape[0]):
            top = [(int(i), float(v)) for i, v in zip(index[head], values[head])]
            out.append(HeadRow(layer, head, rows[head], top, float(ent[head])))
    return out


def rank(rows: list[HeadRow]) -> list[HeadRow]:
    """Most focused first; ties by layer, then head, so the order is deterministic.

    Examples:
        >>> from types import SimpleNamespace as E
        >>> from qkv.explain.select import token_units
        >>> u = token_units(E(tokens=["a", "b", "c"], special=[0, 0, 0]))
        >>> w = [torch.tensor([[[0.5, 0.25, 0.25]], [[0.125, 0.125, 0.75]]])]  # 1 layer, 2 heads, r=1
        >>> [(r.layer, r.head, r.top) for r in rank(head_rows(w, u, k=1))]
        [(0, 1, [(2, 0.75)]), (0, 0, [(0, 0.5)])]
    """
    return sorted(rows, key=lambda r: (-round(r.max_weight, 12), r.layer, r.head or 0))


def _heads(n: int) -> str:
    return "the 1 head" if n == 1 else f"the {n} heads"


# A decoder's first token is named an attention sink when at least this share of the heads put
# their largest weight on it (a convention for the display; Xiao et al., 2023, "Efficient
# Streaming Language Models with Attention Sinks", show trained LLMs park attention there).
SINK_SHARE = 0.25


def attention_sink(rows: list[HeadRow], units: Units, unit: int) -> Message | None:
    """Why a decoder's first unit is an attention sink for `unit`'s rows, or None.

    Examples:
        >>> from types import SimpleNamespace as E
        >>> from qkv.explain.select import token_units
        >>> u = token_units(E(tokens=["<s>", "b", "c"], special=[0, 0, 0]))
        >>> w = [torch.tensor([[[0.8, 0.1, 0.1]], [[0.1, 0.1, 0.8]]])]  # 1 layer, 2 heads
        >>> str(attention_sink(head_rows(w, u, 1), u, 2)).split(":")[0]
        'attention sink'
    """
    if unit == 0 or not rows:
        return None
    on_first = [r for r in rows if r.argmax == 0]
    if len(on_first) < SINK_SHARE * len(rows):
        return None
    mean = sum(float(r.weights[0]) for r in rows) / len(rows)
    return Message("attention sink: {n} of {m} heads put their largest weight on the first {kind} "
                   "{first!r} (mean weight on it {mean:.2f}); decoders park attention they do not "
                   "need there (Xiao et al., 2023), so it is not counted as the focus",
                   n=len(on_first), m=len(rows), kind=units.kind, first=units.labels[0], mean=mean)


def choose_focus(rows: list[HeadRow], units: Units, unit: int, *,
                 largest: str = "weight") -> tuple[int | None, Message]:
    """The unit most heads point at, other than the chosen one, its neighbours, specials.

    Examples:
        >>> from types import SimpleNamespace as E
        >>> from qkv.explain.select import token_units
        >>> u = token_units(E(tokens=["a", "b", "c", "d"], special=[0, 0, 0, 0]))
        >>> w = [torch.tensor([[[0.7, 0.1, 0.1, 0.1]], [[0.1, 0.1, 0.1, 0.7]]])]  # 1 layer, 2 heads
        >>> focus, reason = choose_focus(head_rows(w, u, 1), u, 3)
        >>> focus, str(reason).split(",")[0]
        (0, "highlighted: the 1 head whose largest weight is on 'a'")
    """
    plain = [u for u in range(len(units)) if not units.special[u]]
    position = plain.index(unit) if unit in plain else None
    near = {unit}
    if position is not None:
        near |= {plain[p] for p in (position - 1, position + 1) if 0 <= p < len(plain)}
    votes = Counter(r.argmax for r in rows if not units.special[r.argmax] and r.argmax not in near)
    if not votes:
        return None, Message("no head puts its largest {largest} on a word away from the token",
                             largest=largest)
    # Most heads first; ties go to the larger summed weight, then the earlier word.
    strength = Counter()
    for r in rows:
        strength[r.argmax] += r.max_weight
    focus = max(votes, key=lambda u: (votes[u], strength[u], -u))
    return focus, Message("highlighted: {heads} whose largest {largest} is on {focus!r}, the {kind} "
                          "most heads point to (not counting {unit!r} itself, its neighbours or "
                          "[CLS]/[SEP]); choose another with {to}", heads=_heads(votes[focus]),
                          focus=units.labels[focus], kind=units.kind, unit=units.labels[unit],
                          largest=largest)


def chosen_focus(rows: list[HeadRow], units: Units, focus: int, *, largest: str = "weight") -> Message:
    """Why `focus`, named by the caller (`to`), is highlighted."""
    n = sum(r.argmax == focus for r in rows)
    return Message("highlighted: {heads} whose largest {largest} is on {focus!r} ({to})",
                   heads=_heads(n), focus=units.labels[focus], largest=largest)


def explain(model, text: str, *, token: str | None = None, words: bool = False, top: int = 3,
            to: str | None = None, layer: int | None = None, method: str = contributions.DEFAULT,
            target_text: str | None = None) -> Overview:
    """Every layer and head of `model` for one token of `text`, ranked (see the module doc).

    One forward pass, keeping only the chosen token's rows: O(layers · heads · s) numbers.

    Args:
        model: a self-attention model from [`qkv.load`][qkv.load] (BERT, GPT-2 families).
        token: which token — a word (its last occurrence), `"word@N"` (occurrence N, from 0)
            or an index, counting from 0 over the units shown; None: the last word.
        words: show words, not tokens (weights into a word summed, from a word averaged).
        top: how many of each head's largest weights to keep in `HeadRow.top`.
        to: a unit to highlight (as `token`); None picks the one most heads point to.
        layer: keep only this layer's heads.
        method: what the rows hold: `"weight"` (the attention weights) or another name in
            `qkv.explain.contributions.METHODS`, each row as shares of its total.
        target_text: `method="grad"` on an encoder: the second text (see
            `qkv.explain.contributions.grad`).

    Raises:
        ArgumentError: `token`/`to` not in the text, `layer` out of range, `top` < 1,
            an unknown `method` or one that does not apply.
        QkvError: an empty text.

    Examples:
        >>> import qkv
        >>> model = qkv.load("minilm")
        >>> ov = explain(model, "The dog found some pizza next to the baby and ate it", token="it")
        >>> best = ov.rows[0]
        >>> best.layer, best.head, ov.units.labels[best.argmax], round(best.max_weight, 2)
        (0, 2, 'ate', 1.0)
        >>> len(ov.rows), ov.units.labels[ov.focus]          # 6 layers × 12 heads
        (72, 'pizza')
    """
    check_top(top)
    check_text(text)
    check_layer_head(model, layer, None)
    m = contributions.check_method(model, method, target_text)
    encoding = encode(model, text)
    units, choice = choose_in(token, encoding, text, words=words, role="token")
    focus = None if to is None else choose(to, units, role="to").unit
    ids = torch.tensor([encoding.ids], dtype=torch.long)  # (1, t)
    scores = contributions.scores(model, ids, torch.tensor(units.groups[choice.unit]),
                                  method=m.name, target_text=target_text)
    return overview_of(model, text, encoding, units, choice, scores, focus=focus, top=top,
                       layer=layer)


def overview_of(model, text: str, encoding, units: Units, choice, scores, *, focus: int | None,
                top: int, layer: int | None) -> Overview:
    """The [`Overview`][qkv.explain.overview.Overview] of a method's `scores` for the chosen unit:
    rows ranked, the focus and the attention sink found. [`explain`][qkv.explain.overview.explain]
    and [`qkv.explain.long.document.Document.explain`][qkv.explain.long.document.Document.explain]
    (the same answer from a long text's saved log-sum-exp) both end here.

    Args:
        encoding, units, choice: the text's tokens, the units shown, the chosen one.
        scores: a [`Scores`][qkv.explain.contributions.Scores] for the unit's token rows.
        focus: the unit named by `to`, or None to pick one.
    """
    m = contributions.get_method(scores.method)
    per_layer = [m.as_shares(x) for x in scores.per_layer()]  # L × (h or 1, r, s)
    rows = [r for r in head_rows(per_layer, units, top) if r.layer not in scores.unscored]
    if m.per == "layer":
        rows = [replace(r, head=None) for r in rows]
    if layer is not None:
        rows = [r for r in rows if r.layer == layer]
    causal = capabilities_of(model).causal
    sink = attention_sink(rows, units, choice.unit) if causal else None
    largest = m.value
    if focus is None:  # a named sink is not the focus: it says where attention parks, not what it finds
        focus, reason = choose_focus([r for r in rows if r.argmax != 0] if sink else rows, units,
                                     choice.unit, largest=largest)
    else:
        reason = chosen_focus(rows, units, focus, largest=largest)
    return Overview(model=model_name(model), text=text, tokens=list(encoding.tokens), units=units,
                    unit=choice.unit, rows=rank(rows), focus=focus, focus_reason=reason,
                    num_layers=num_layers(model), num_heads=num_heads(model),
                    notes=tuple(n for n in (choice.note, unscored_note(model, scores.unscored)) if n),
                    method=m.name, per=m.per,
                    scores=scores.scores, target=scores.target, causal=causal, sink=sink,
                    unscored=scores.unscored)
