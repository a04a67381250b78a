"""Every method side by side for one token: which words each one puts first.

One row per method, read off its scores for the chosen token:

* a per-head method (`weight`, `norm`): the mean of its heads' shares — every head of every
  layer, or of `layer` only;
* a per-layer method (`rollout`, `alti`, `value-zeroing`, `grad`): its row after the last
  layer (R^L), or after `layer`.

Rows are over units (words with `words=True`: into a word summed, from a word averaged).
`grad` runs only where it has a target (a decoder, or `target_text` on an encoder), `flow`
only on short texts; otherwise they are left out with a note saying why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, ClassVar

import torch

from qkv.explain import forward
from qkv.explain.contributions import METHODS, check_method, parked, scores, shares
from qkv.explain.select import Units, choose_in, group_columns
from qkv.explain.wording import ArgumentError, Message


@dataclass(frozen=True)
class Comparison:
    """The methods' rows for one unit — what `compare` returns.

    Attributes:
        model: the model's name.
        text: the text as given.
        tokens: its tokens.
        units: the units shown.
        unit: the chosen one.
        layer: the layer read (None: every layer / the last rolled-out row).
        rows: method name → (U,) its row as shares (sums to 1).
        top: method name → the `k` largest (unit index, share), largest first.
        skipped: method name → why it did not run.
        parked: method name → the share of its row on [CLS]/[SEP]/punctuation.
        notes: how an ambiguous `token` was resolved.
    """

    model: str
    text: str
    tokens: list[str]
    units: Units
    unit: int
    layer: int | None
    rows: dict[str, torch.Tensor]
    top: dict[str, list[tuple[int, float]]]
    skipped: dict[str, Message]
    parked: dict[str, float]
    notes: tuple[Message, ...] = ()

    kind: ClassVar[str] = "comparison"  # its row in qkv.explain.kinds.KINDS

    def to_dict(self) -> dict:
        labels = self.units.labels
        return {"kind": self.kind, "model": self.model, "text": self.text, "tokens": self.tokens, "units": labels,
                "unit_index": self.unit, "unit": labels[self.unit], "layer": self.layer,
                "methods": {name: {"row": row.tolist(),
                                   "top": [{"unit": labels[i], "share": w} for i, w in self.top[name]]}
                            for name, row in self.rows.items()},
                "parked": self.parked,
                "skipped": {name: str(why) for name, why in self.skipped.items()}}


def _row(s, layer: int | None) -> torch.Tensor:
    """(s,) the method's summary row over tokens (see the module doc)."""
    if s.per == "head":
        x = shares(s.scores)  # (L, h, r, s)
        x = x[layer] if layer is not None else x.flatten(0, 1)  # (n, r, s)
        return x.mean(0).mean(0)
    x = shares(s.scores[layer if layer is not None else -1])  # (r, s)
    return x.mean(0)


def compare(model, text: str, *, token: str | None = None, words: bool = False, top: int = 3,
            layer: int | None = None, target_text: str | None = None,
            progress: Callable[[str, int, int], None] | None = None) -> Comparison:
    """Run every method of `METHODS` on one token
    (`progress("methods", done, total)` told after each: some take seconds).

    Raises:
        ArgumentError: a bad `token`, `layer` out of range, `top` < 1, an empty
            `target_text`. QkvError: an empty text.

    Examples:
        >>> import qkv
        >>> c = compare(qkv.load("minilm"), "the cat sat on the mat", token="sat", top=1)
        >>> sorted([*c.rows, *c.skipped]) == sorted(METHODS)    # each method: a row, or why not
        True
        >>> list(c.skipped), str(c.skipped["grad"]).split(":")[0]
        (['grad'], "method 'grad' does not apply to all-MiniLM-L6-v2 without a target")
    """
    forward.check_top(top)
    forward.check_layer_head(model, layer, None)
    if target_text is not None and not target_text.strip():
        raise ArgumentError("target_text", "{name} is empty; give a second text, e.g. "
                            "{target_text} \"a dog ate the pizza\"")
    encoding = forward.encode(model, text)
    units, choice = choose_in(token, encoding, text, words=words, role="token")
    ids = torch.tensor([encoding.ids], dtype=torch.long)  # (1, t)
    rows_t = torch.tensor(units.groups[choice.unit])
    rows, best, skipped = {}, {}, {}
    for done, (name, method) in enumerate(METHODS.items()):
        if progress is not None:
            progress("methods", done, len(METHODS))
        given = target_text if method.reads_target else None
        try:  # a method that does not apply (grad without a target, flow on a long text)
            check_method(model, name, given)
            s = scores(model, ids, rows_t, method=name, target_text=given)
        except ArgumentError as e:
            skipped[name] = e.message
            continue
        row = group_columns(_row(s, layer), units)  # (U,)
        rows[name] = row
        values, index = row.topk(min(top, len(row)))
        best[name] = [(int(i), float(v)) for i, v in zip(index, values)]
    if progress is not None:
        progress("methods", len(METHODS), len(METHODS))
    return Comparison(model=forward.model_name(model), text=text, tokens=list(encoding.tokens),
                      units=units, unit=choice.unit, layer=layer, rows=rows, top=best,
                      skipped=skipped, parked={k: float(parked(r, units)) for k, r in rows.items()},
                      notes=(choice.note,) if choice.note else ())
