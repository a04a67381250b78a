"""Head finding: which (layer, head) sends the most weight from one word to another
([`heads`][qkv.explain.probes.find_heads.heads]). The probes — which heads do a known job — are each
a record in `qkv.explain.probes.registry`, run by `qkv.explain.probe`; the coreference probe is
`qkv.explain.probes.coref` (its names are importable from here too).

Words, not tokens: weights into a word are summed over its tokens, weights from a word averaged
(see `qkv.explain.select`), so a referent split into pieces still counts as one word.

`method=` ranks by a contribution method instead of the weights (see
[`qkv.explain.contributions`][qkv.explain.contributions]): each row as shares of its total; a
per-layer method ranks layers (`head` None).
"""

from __future__ import annotations

from typing import ClassVar

from dataclasses import dataclass, replace

import torch

from qkv.explain import contributions, forward
from qkv.explain.mixer_maps import unscored_note
from qkv.explain.probes.base import unit_shares
from qkv.explain.probes.coref import (  # noqa: F401  (importable from here, as before)
    SENTENCE_PROBES, ProbeItem, ProbeResult, coref_item, coref_probe, load_probe,
)
from qkv.explain.probes.registry import default_probe, probe  # noqa: F401  (as before)
from qkv.explain.overview import unit_rows
from qkv.explain.select import Units, choose, word_units
from qkv.explain.wording import Message
from qkv.models.protocol import capabilities_of


@dataclass(frozen=True)
class HeadWeight:
    """The weight (or a method's share) one head sends from the `source` word to the
    `target` word; `head` is None for a per-layer method's row."""

    layer: int
    head: int | None
    weight: float


@dataclass(frozen=True)
class HeadRanking:
    """Every (layer, head) by the weight it sends from one word to another — what `heads`
    returns.

    Attributes:
        model: what was run.
        units: its words.
        source: an index into `units`.
        target: an index into `units`.
        text: the text as given.
        heads: one [`HeadWeight`][qkv.explain.probes.find_heads.HeadWeight] per head, largest weight
            first (ties by layer, head).
        notes: how an ambiguous `source`/`target` was resolved.
        method: what ranks the heads (`"weight"`).
        per: whether its rows are heads or layers (`"head"` or `"layer"`).
    """

    kind: ClassVar[str] = "heads"  # its row in qkv.explain.kinds.KINDS

    model: str
    text: str
    units: Units
    source: int
    target: int
    heads: list[HeadWeight]
    notes: tuple[Message, ...] = ()
    method: str = contributions.DEFAULT
    per: str = "head"

    def to_dict(self) -> dict:
        """The ranking; `qkv heads TEXT --from A --to B --json` prints its `"heads"` list."""
        return {"kind": self.kind, "model": self.model, "text": self.text, "units": self.units.labels,
                "source": self.source, "target": self.target, "method": self.method,
                "heads": [{"layer": h.layer, "head": h.head, "weight": h.weight} for h in self.heads]}


def rank_pair(per_layer: list[torch.Tensor], units, source: int, target: int) -> list[HeadWeight]:
    """Every (layer, head) by the weight from unit `source` to unit `target`, largest first.

    Args:
        per_layer: for each layer, the traced weights (h, r, s) for the r tokens of `source`.

    Examples:
        >>> from qkv.explain.select import token_units
        >>> from types import SimpleNamespace as E
        >>> u = token_units(E(tokens=["a", "b"], special=[0, 0]))
        >>> w = [torch.tensor([[[0.75, 0.25]], [[0.5, 0.5]]])]     # 1 layer, 2 heads, r=1
        >>> [(h.layer, h.head, h.weight) for h in rank_pair(w, u, 1, 1)]
        [(0, 1, 0.5), (0, 0, 0.25)]
    """
    out = []
    for layer, w in enumerate(per_layer):
        rows = unit_rows(w.double(), units)  # (h, U)
        out += [HeadWeight(layer, head, float(rows[head, target])) for head in range(rows.shape[0])]
    return sorted(out, key=lambda h: (-h.weight, h.layer, h.head))


def heads(model, text: str, *, source: str | None = None, target: str, method: str = contributions.DEFAULT,
          target_text: str | None = None) -> HeadRanking:
    """Rank every head of `model` by the weight from word `source` to word `target`.

    Args:
        source, target: a word (its last occurrence), `"word@N"` or an index over the words
            (see `qkv.explain.select.choose`); `source` None: the last word.
        method, target_text: rank by a contribution method's share instead of the weight
            (see [`qkv.explain.explain`][qkv.explain.explain]).

    Raises:
        ArgumentError: a word that is not in the text, an index out of range.
        QkvError: an empty text.

    Examples:
        >>> import qkv
        >>> r = heads(qkv.load("minilm"), "The dog found some pizza next to the baby and ate it",
        ...           source="it", target="pizza")
        >>> best = r.heads[0]
        >>> len(r.heads), (best.layer, best.head), round(best.weight, 2)
        (72, (3, 1), 0.75)
    """
    contributions.check_method(model, method, target_text)
    encoding = forward.encode(model, text)
    units = word_units(encoding, text)
    src = choose(source, units, role="source")
    tgt = choose(target, units, role="target")
    m = contributions.check_method(model, method, target_text)
    rows = torch.tensor(units.groups[src.unit], device=forward.device_of(model))
    ids = torch.tensor([encoding.ids], dtype=torch.long, device=rows.device)  # (1, t)
    # the weights alone: each layer's rows traced as the method's forward traces them, nothing
    # else kept (O(h · r · t) per layer, not its keys, values and residual)
    per_layer = forward.row_weights(model, ids, rows) if m.name == "weight" else None
    if per_layer is None:
        per_layer, m = unit_shares(model, encoding, units, src.unit, method, target_text)
    ranked = rank_pair(per_layer, units, src.unit, tgt.unit)
    if m.per == "layer":
        ranked = [replace(h, head=None) for h in ranked]
    notes = tuple(c.note for c in (src, tgt) if c.note)
    left_out = unscored_note(model, tuple(i for i, w in enumerate(per_layer) if not len(w)))
    notes += (left_out,) if left_out else ()
    if capabilities_of(model).causal and tgt.unit > src.unit:
        notes += (Message("decoder: {target!r} comes after {source!r}, and a token attends only to "
                          "itself and the tokens before it, so every weight here is 0",
                          target=units.labels[tgt.unit], source=units.labels[src.unit]),)
    return HeadRanking(model=forward.model_name(model), text=text, units=units, source=src.unit,
                       target=tgt.unit, heads=ranked, notes=notes, method=m.name, per=m.per)


