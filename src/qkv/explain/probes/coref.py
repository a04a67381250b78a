"""The coreference probe (`coref`): how often each head's largest weight from a pronoun lands
on its referent, over labelled sentences shipped with qkv (`qkv/data/coref.jsonl`) — and, for
[`head_effects`][qkv.explain.causal.head_effects.head_effects], how far removing a head turns the
pronoun's final vector.

Words, not tokens: weights into a word are summed over its tokens, weights from a word averaged
(see `qkv.explain.select`), so a referent split into pieces still counts as one word.
`method=` scores by a contribution method's share instead of the weight (each row as shares
of its total; a per-layer method scores layers).
"""

from __future__ import annotations

from typing import Callable, ClassVar

import json
import sys
from dataclasses import dataclass
from importlib import resources

import torch

from qkv.explain import contributions, forward
from qkv.explain.probes.base import Effects, Probe, Task, unit_shares
from qkv.explain.overview import unit_rows
from qkv.explain.select import Units, choose, word_units
from qkv.explain.wording import ArgumentError

SENTENCE_PROBES = ("coref",)  # the sentence sets shipped with qkv (qkv/data/<name>.jsonl)


# -- the coreference probe ---------------------------------------------------------------------
@dataclass(frozen=True)
class ProbeItem:
    """One probe sentence: the pronoun, its referent, and the decoy words between them."""

    text: str
    pronoun: str
    referent: str
    decoys: tuple[str, ...]


@dataclass(frozen=True)
class ProbeResult:
    """Per-head accuracy over the probe set — what `probe` returns.

    Attributes:
        model: the model's name.
        name: the probe's (`"coref"`).
        items: the sentences, in file order.
        hits: (n, layers, heads) bool — head's largest weight from the pronoun on the referent.
        candidates: (n,) how many words each argmax chose among (chance = 1/candidates).
        chosen: (n, layers, heads) the word each head picked, as text.
        method: what the heads were scored by; with a per-layer method `heads` is 1 and
            the rows are layers.
        per: see `method`.
        parked: (n,) the share of the pronoun's row on [CLS]/[SEP]/punctuation, mean over the
            heads (layers), by `method`; `parked_weight` the same for the raw weights.
    """

    kind: ClassVar[str] = "probe"  # its row in qkv.explain.kinds.KINDS

    model: str
    name: str
    items: list[ProbeItem]
    hits: torch.Tensor
    candidates: torch.Tensor
    chosen: list[list[list[str]]]
    method: str = contributions.DEFAULT
    per: str = "head"
    parked: torch.Tensor | None = None
    parked_weight: torch.Tensor | None = None

    @property
    def accuracy(self) -> torch.Tensor:
        """(layers, heads) fraction of sentences each head got right."""
        return self.hits.double().mean(0)

    @property
    def chance(self) -> float:
        """Expected accuracy of a head that picks a candidate word uniformly at random."""
        return float((1.0 / self.candidates.double()).mean())

    def ranked(self) -> list[tuple[int, int, float, int]]:
        """(layer, head, accuracy, correct count), best first; ties by layer, head."""
        acc, n = self.accuracy, self.hits.sum(0)
        cells = [(l, h, float(acc[l, h]), int(n[l, h]))
                 for l in range(acc.shape[0]) for h in range(acc.shape[1])]
        return sorted(cells, key=lambda c: (-c[3], c[0], c[1]))

    def held_out(self) -> tuple[tuple[int, int], float, float]:
        """Pick the best head on the even-numbered sentences, score it on the odd ones.

        The ranking above is measured on the same sentences it ranks heads by; this split says
        how much of the best head's score survives on sentences it was not chosen on.
        Returns ((layer, head), accuracy on even, accuracy on odd).
        """
        even, odd = self.hits[0::2].double().mean(0), self.hits[1::2].double().mean(0)
        flat = int(even.flatten().argmax())
        layer, head = divmod(flat, even.shape[1])
        return (layer, head), float(even[layer, head]), float(odd[layer, head])

    def to_dict(self) -> dict:
        """Every head's score; `qkv heads --probe coref --json` prints its `"heads"` list
        (`weight` repeats `accuracy`, the figure heads are ranked by)."""
        n = len(self.items)
        (layer, head), even, odd = self.held_out()
        per_head = self.per == "head"
        return {
            "kind": self.kind, "model": self.model, "probe": self.name, "sentences": n,
            "chance": self.chance,
            "method": self.method, "per": self.per,
            "parked": None if self.parked is None else float(self.parked.mean()),
            "parked_weight": None if self.parked_weight is None else float(self.parked_weight.mean()),
            "held_out": {"layer": layer, "head": head if per_head else None, "even": even, "odd": odd},
            "heads": [{"layer": l, "head": h if per_head else None, "weight": acc, "accuracy": acc,
                       "correct": c, "n": n}
                      for l, h, acc, c in self.ranked()],
        }


def load_probe(name: str) -> list[ProbeItem]:
    """The probe set shipped with qkv (`qkv/data/<name>.jsonl`)."""
    if name not in SENTENCE_PROBES:
        raise ArgumentError("probe", "unknown probe {value!r}; known probes: {known}", value=name,
                            known=", ".join(SENTENCE_PROBES))
    text = resources.files("qkv").joinpath("data", f"{name}.jsonl").read_text(encoding="utf-8")
    items = []
    for line in text.splitlines():
        if line.strip():
            d = json.loads(line)
            items.append(ProbeItem(d["text"], d["pronoun"], d["referent"], tuple(d.get("decoys", ()))))
    return items


def _parked(per_layer: list[torch.Tensor], units: Units) -> float:
    """The mean over heads (or layers) of the rows' share on [CLS]/[SEP]/punctuation."""
    rows = torch.stack([unit_rows(w.double(), units) for w in per_layer])  # (L, h, U)
    return float(contributions.parked(rows, units).mean())


def coref_item(model, item: ProbeItem, *, role: str = "probe"):
    """(encoding, units, pronoun unit, referent unit) of one coref sentence for `model`;
    ArgumentError naming `role` when its tokenizer cannot hold the labelled words or the
    model has fewer positions than the sentence has tokens (the user gave no text to shorten)."""
    limit = model.tokenizer.max_length
    if limit is not None:
        n = len(model.tokenizer.encode(item.text, max_length=sys.maxsize).ids)
        if n > limit:
            raise ArgumentError(role, "{name} coref cannot run on {model}: its probe sentence "
                                "{text!r} is {n} tokens, more than the {limit} positions {model} "
                                "has", model=forward.model_name(model), text=item.text, n=n,
                                limit=limit)
    encoding = forward.encode(model, item.text, unknown_ok=True)  # the probe says why below
    units = word_units(encoding, item.text)
    try:
        pronoun = choose(item.pronoun, units, role="pronoun").unit
        referent = choose(item.referent, units, role="referent").unit
    except ArgumentError as e:  # a tokenizer that keeps "it." as one word (the shipped lm's)
        raise ArgumentError(role, "{name} coref cannot run on {model}: its tokenizer does not "
                            "split the probe sentence {text!r} into words holding the labelled "
                            "ones ({reason})", model=forward.model_name(model), text=item.text,
                            reason=str(e)) from e
    return encoding, units, pronoun, referent


def _probe_one(model, item: ProbeItem, method: str = contributions.DEFAULT
               ) -> tuple[torch.Tensor, int, list[list[str]], float, float]:
    """(layers, heads) hits, the number of candidate words, each head's pick, and the share
    parked on [CLS]/[SEP]/punctuation by the method and by the weights."""
    encoding, units, pronoun, referent = coref_item(model, item)
    per_layer, m = unit_shares(model, encoding, units, pronoun, method, None)
    plain = per_layer if m.raw else unit_shares(model, encoding, units, pronoun, contributions.DEFAULT, None)[0]
    # Candidates: every word except the pronoun itself; special tokens are not words.
    excluded = torch.tensor([s or u == pronoun for u, s in enumerate(units.special)])
    hits, picks = [], []
    for weights in per_layer:
        rows = unit_rows(weights.double(), units)  # (h, U)
        best = rows.masked_fill(excluded, -1.0).argmax(-1)  # (h,)
        hits.append(best == referent)
        picks.append([units.labels[int(b)] for b in best])
    return (torch.stack(hits), int((~excluded).sum()), picks, _parked(per_layer, units),
            _parked(plain, units))


def coref_probe(model, *, method: str = contributions.DEFAULT,
                progress: Callable[[str, int, int], None] | None = None) -> ProbeResult:
    """Each head's accuracy at putting its largest weight (from the pronoun, over the words of
    the sentence other than the pronoun itself) on the labelled referent, over the shipped coref
    sentences; `method`: score by a contribution method's largest share instead (a per-layer
    method scores each layer). `progress("sentences", done, total)` after each sentence.

    Raises:
        ArgumentError: an unknown `method` or one that does not apply; a tokenizer that does
            not split the sentences into the labelled words (`coref_item`).
    """
    m = contributions.check_method(model, method)
    items = load_probe("coref")
    results = []
    for item in items:
        results.append(_probe_one(model, item, m.name))
        if progress is not None:
            progress("sentences", len(results), len(items))
    return ProbeResult(model=forward.model_name(model), name="coref", items=items,
                       hits=torch.stack([r[0] for r in results]),
                       candidates=torch.tensor([r[1] for r in results]),
                       chosen=[r[2] for r in results], method=m.name, per=m.per,
                       parked=torch.tensor([r[3] for r in results], dtype=torch.float64),
                       parked_weight=torch.tensor([r[4] for r in results], dtype=torch.float64))


def coref_task(model, *, sequences: int, length: int | None, seed: int) -> Task:
    """The coref sentences (fixed: `sequences`, `length` and `seed` do not apply) and each
    one's pronoun tokens, whose final vector the metric compares with the clean run's."""
    ids, pronouns = [], []
    for item in load_probe("coref"):
        encoding, units, unit, _ = coref_item(model, item, role="effects_probe")
        ids.append(torch.tensor([encoding.ids], dtype=torch.long))  # (1, t)
        pronouns.append(list(units.groups[unit]))
    return Task(ids=ids, pronouns=pronouns)


COREF = Probe(
    name="coref", sequences="over labelled sentences shipped with qkv",
    run=lambda model, *, method, progress: coref_probe(model, method=method, progress=progress),
    methods=True, default_for=lambda caps: not caps.causal,
    effects=Effects(task=coref_task,
                    scores=lambda model, method, task: coref_probe(model, method=method).accuracy,
                    metric="1 − cos(pronoun's final vector, clean run's), mean over the coref sentences"))


__all__ = ["COREF", "ProbeItem", "ProbeResult", "SENTENCE_PROBES", "coref_item", "coref_probe",
           "coref_task", "load_probe"]
