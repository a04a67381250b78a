"""Contributions beyond the raw attention weights: what each token actually hands on.

One method per file, each a documented formula (notation in `base`):

* `weight`  (`weight`) — A^{ℓ,h}_ij itself, per head
* `norm`    (`norm`, Kobayashi et al. 2020) — ‖A_ij f^h(h_j)‖ per head (and per layer)
* `rollout` (`rollout`, Abnar & Zuidema 2020) — (½Ā + ½I) multiplied through the layers
* `flow`    (`flow`, the same paper) — max-flow through those capacities (≤ 24 tokens)
* `alti`    (`alti`, Ferrando et al. 2022) — residual and norm included, rolled out
* `value-zeroing` (`value_zeroing`, Mohebbi et al. 2023) — re-run with v_j = 0
* `grad`    (`grad`, Chefer et al. 2021) — (A ⊙ ∂y/∂A)⁺, rolled out
* `attnlrp` (`attnlrp`, Achtibat et al. 2024) — LRP relevance of each weight, per head

`METHODS` maps the names to [`Method`][qkv.explain.contributions.base.Method] records; `per` says
whether a method scores every head (`"head"`) or one row per layer, rolled out through it
(`"layer"`). [`contributions`][qkv.explain.contributions.contributions] runs one on one token of a
text; [`qkv.explain.explain`][qkv.explain.explain], [`heads`][qkv.explain.heads] and `probe` take
`method=` and rank by it.

Examples:
    >>> import qkv
    >>> from qkv.explain.contributions import contributions
    >>> c = contributions(qkv.load("minilm"), "The dog found some pizza next to the baby and ate it",
    ...                   token="it", method="alti")
    >>> c.tokens[c.token_index], c.scores.shape                       # 6 layers × 14 keys
    ('it', torch.Size([6, 14]))
    >>> c.tokens[int(c.scores[-1, 1:-1].argmax()) + 1]                # after the last layer
    'pizza'

Every method's [`run`][qkv.explain.contributions.base.Method.run] answers in its `per`'s shape — (L,
h, r, s) or (L, r, s):

Examples:
    >>> model = qkv.load("minilm")
    >>> ids = torch.tensor([model.tokenizer.encode("the cat sat").ids])   # [CLS] the cat sat [SEP]
    >>> sorted({(m.per, tuple(m.run(model, ids, torch.tensor([3]), "a dog").scores.shape))
    ...         for m in METHODS.values()})                               # "a dog": grad's target
    [('head', (6, 12, 1, 5)), ('layer', (6, 1, 5))]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from qkv.explain import forward
from qkv.explain.contributions import alti, attnlrp, base, flow, grad, norm, rollout, value_zeroing, weight  # noqa: F401
from qkv.explain.contributions.base import Method, Scores, parked, shares
from qkv.explain.select import choose_in
from qkv.explain.wording import ArgumentError, Message

#: name → method, in the order the CLI lists them.
METHODS: dict[str, Method] = {m.name: m for m in (
    weight.METHOD, norm.METHOD, rollout.METHOD, flow.METHOD, alti.METHOD, value_zeroing.METHOD,
    grad.METHOD, attnlrp.METHOD)}

#: The methods that read ``target_text``.
READS_TARGET = tuple(name for name, m in METHODS.items() if m.reads_target)

#: What ``method=`` means when none is given: the attention weights themselves.
DEFAULT = weight.METHOD.name


def get_method(name: str) -> Method:
    """The registered method `name`; ArgumentError listing the known ones otherwise."""
    method = METHODS.get(name)
    if method is None:
        raise ArgumentError("method", "unknown {name} {value!r}; known methods: {known}",
                            value=name, known=", ".join(METHODS))
    return method


def check_method(model, name: str, target_text: str | None = None) -> Method:
    """The method, once it is known to apply to `model` with `target_text`.

    Raises:
        ArgumentError: an unknown name; `target_text` with a method other than `grad`;
            `grad` on an encoder without a target text, or with an empty one; `alti` on
            parallel-residual layers; any method on layers with cross-attention.
    """
    method = get_method(name)
    base.check_layers(model, method.name, hybrid=method.hybrid)
    if method.applies is not None:
        method.applies(model)
    if method.reads_target:
        grad.check_target(model, target_text)
    elif target_text is not None:
        raise ArgumentError("target_text", "{name} is only read by {method} {reader} (the text "
                            "whose similarity is differentiated), not by {method} {value}",
                            value=method.name, reader=", ".join(READS_TARGET))
    return method


def scores(model, ids: torch.Tensor, rows: torch.Tensor, *, method: str,
           target_text: str | None = None) -> Scores:
    """Run `method` on token ids (1, t) for the query rows `rows` (token positions)."""
    return check_method(model, method, target_text).run(model, ids, rows, target_text)


@dataclass(frozen=True)
class Contributions:
    """One token's contributions by one method — what
    [`contributions`][qkv.explain.contributions.contributions] returns.

    Attributes:
        model: what was run.
        text: the text as given.
        tokens: its tokens.
        token_index: the chosen token (with `words`, the word's first token; the rows of its
            tokens are averaged, see `token_indices`).
        token_indices: the tokens whose rows were averaged.
        method: the method's name.
        per: `"head"` or `"layer"`.
        formula: one line.
        scores: (L, h, s) for per-head methods, (L, s) for per-layer ones (the row rolled out
            through each layer), over the t tokens, in the method's own units.
        layer_scores: `norm`'s per-layer norms (L, s), or None.
        target: what `grad` differentiated, or None.
        notes: how an ambiguous `token` was resolved.
    """

    model: str
    text: str
    tokens: list[str]
    token_index: int
    token_indices: tuple[int, ...]
    method: str
    per: str
    formula: str
    scores: torch.Tensor
    layer_scores: torch.Tensor | None = None
    target: str | None = None
    notes: tuple[Message, ...] = ()

    kind: ClassVar[str] = "contributions"  # its row in qkv.explain.kinds.KINDS

    def to_dict(self) -> dict:
        """`{kind, tokens, token_index, method, scores, …}`: `scores[layer][head][key]` for
        per-head methods, `scores[layer][key]` for per-layer ones."""
        out = {"kind": self.kind, "model": self.model, "text": self.text, "tokens": self.tokens,
               "token_index": self.token_index, "token_indices": list(self.token_indices),
               "method": self.method, "per": self.per, "formula": self.formula,
               "scores": self.scores.tolist()}
        if self.layer_scores is not None:
            out["layer_scores"] = self.layer_scores.tolist()
        if self.target is not None:
            out["target"] = self.target
        return out


def contributions(model, text: str, *, method: str, token: str | None = None,
                  words: bool = False, target_text: str | None = None) -> Contributions:
    """Every layer's (and head's) contributions into one token of `text` by `method`.

    Args:
        method: a name in `METHODS`.
        token: as in [`qkv.explain.explain`][qkv.explain.explain] (a word, `"word@N"`, an index;
            None: the last word).
        words: pick `token` among words; a word's rows are averaged over its tokens.
        target_text: `grad` on an encoder: the second text (see `grad`).

    Raises:
        ArgumentError: unknown method, a method that does not apply, a bad `token`.
        QkvError: an empty text.
    """
    m = check_method(model, method, target_text)
    encoding = forward.encode(model, text)
    units, choice = choose_in(token, encoding, text, words=words, role="token")
    group = units.groups[choice.unit]
    ids = torch.tensor([encoding.ids], dtype=torch.long)
    s = scores(model, ids, torch.tensor(group), method=m.name, target_text=target_text)
    layer = s.layer_scores.double().mean(-2) if s.layer_scores is not None else None
    return Contributions(model=forward.model_name(model), text=text, tokens=list(encoding.tokens),
                         token_index=group[0], token_indices=tuple(group), method=m.name,
                         per=m.per, formula=m.formula, scores=s.scores.double().mean(-2),  # rows averaged: (L, h, s) / (L, s)

                         layer_scores=layer, target=s.target,
                         notes=(choice.note,) if choice.note else ())


__all__ = ["DEFAULT", "METHODS", "READS_TARGET", "Contributions", "Method", "Scores", "check_method", "contributions",
           "get_method", "parked", "scores", "shares"]
