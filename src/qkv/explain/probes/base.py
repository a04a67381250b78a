"""What a probe is: its sequences, its score, what it needs of a model, and how the causal tools
use it — one `Probe` record.

A probe's file defines its record and the functions the record names; the table of probes is
`qkv.explain.probes.registry.PROBES` (`register_probe`
adds one). `qkv.explain.probe`, [`head_effects`][qkv.explain.causal.head_effects.head_effects],
[`faithfulness`][qkv.explain.causal.faithfulness.faithfulness], the CLI and the viewer read the
record; nothing compares a probe's name.

Examples:
    >>> from qkv.models.protocol import DECODER, ENCODER
    >>> Needs(("next_token",), "measures next-token loss").missing(ENCODER), Needs().missing(DECODER)
    (('next_token',), ())
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from qkv.explain import contributions, forward
from qkv.explain.wording import ArgumentError
from qkv.models.protocol import Capabilities, capabilities_of

#: how a model lacking a capability is described in a message ("{model} is an encoder …")
LACKING = {
    "self_attention": "has no self-attention stack (an encoder-decoder)",
    "causal": "is not causal (an encoder)",
    "encoder": "is not an encoder",
    "cross_attention": "has no cross-attention",
    "next_token": "is an encoder (no next token to predict)",
    "head_weights": "does not expose each head's weights",
}


@dataclass(frozen=True)
class Task:
    """A probe's sequences and where its metric is read — what `Effects.task` returns.

    Attributes:
        ids: n sequences (1, t) each; those of one length batch together.
        scored: (t − 1,) bool — which next-token predictions the loss averages (position i
            predicts token i + 1); None for a probe that reads `pronouns` rows instead.
        pronouns: per sequence the token positions whose final vector the metric compares
            (coref: the pronoun's tokens).
        length: the sequences' random span n, where the probe has one (the repeated span of
            `induction`, the number of x y pairs of `previous-token`, a needle input's tokens).
    """

    ids: list[torch.Tensor]
    scored: torch.Tensor | None = None
    pronouns: list[list[int]] | None = None
    length: int | None = None


def scored_from(t: int, first: int, last: int | None = None) -> torch.Tensor:
    """(t − 1,) bool: the predictions `first` … `last − 1` (default: every one from `first`).

        Examples:
            >>> scored_from(6, 3).tolist()
            [False, False, False, True, True]
    """
    scored = torch.zeros(t - 1, dtype=torch.bool)
    scored[first:t - 1 if last is None else last] = True
    return scored


def method_shares(model, method: str, ids: list[torch.Tensor]) -> torch.Tensor:
    """(L, S, h|1, t, t): `method`'s rows on each of the S equally long sequences `ids` (1, t),
    as shares of their totals (the weights as they are); h|1: a per-layer method's one row."""
    per_seq = []
    for seq in ids:  # (1, t)
        s = contributions.scores(model, seq, torch.arange(seq.shape[1]), method=method)
        rows = s.scores if s.per == "head" else s.scores.unsqueeze(1)  # (L, h|1, t, t)
        per_seq.append(contributions.get_method(method).as_shares(rows))
    return torch.stack(per_seq, dim=1)  # (L, S, h|1, t, t)


def unit_shares(model, encoding, units, unit: int, method: str, target_text: str | None):
    """(L × (h|1, r, s) rows of `unit`'s r tokens by `method` — shares of their totals unless
    the method's scores are the raw weights — and the method record), one text's encoding; a
    layer the method leaves out (`Scores.unscored`: a hybrid's linear / SSM layer) holds no
    heads, (0, r, s)."""
    m = contributions.check_method(model, method, target_text)
    ids = torch.tensor([encoding.ids], dtype=torch.long)  # (1, t)
    s = contributions.scores(model, ids, torch.tensor(units.groups[unit]), method=m.name,
                             target_text=target_text)
    return [m.as_shares(x)[: 0 if i in s.unscored else None] for i, x in enumerate(s.per_layer())], m


def ranked(scores: torch.Tensor, *ties: torch.Tensor) -> list[tuple[int, int, float]]:
    """(layer, head, score) of every cell of `scores` (L, h), highest first; ties broken by
    each of `ties` (L, h), higher first, then by layer and head. A NaN cell is no head (a
    hybrid's layers have different numbers of heads) and is left out.

    Examples:
        >>> ranked(torch.tensor([[0.5, 0.25], [0.5, 1.0]]))
        [(1, 1, 1.0), (0, 0, 0.5), (1, 0, 0.5), (0, 1, 0.25)]
    """
    L, H = scores.shape
    key = lambda c: (*(-float(t[c[0], c[1]]) for t in (scores, *ties)), c[0], c[1])  # noqa: E731
    cells = ((l, h) for l in range(L) for h in range(H) if not torch.isnan(scores[l, h]))
    return [(l, h, float(scores[l, h])) for l, h in sorted(cells, key=key)]


@dataclass(frozen=True)
class Needs:
    """The model capabilities (fields of [`Capabilities`][qkv.models.protocol.Capabilities]) that
    must be true for a probe to apply, and why, in words (`"measures next-token loss"`)."""

    capabilities: tuple[str, ...] = ()
    why: str = ""

    def missing(self, caps: Capabilities) -> tuple[str, ...]:
        """The needed capabilities `caps` lacks."""
        return caps.lacks(self.capabilities)

    def check(self, model, role: str, probe: str, others: list[str], *, named: bool = True) -> None:
        """ArgumentError naming `role` when `model` lacks a needed capability: what the probe
        does that needs it, what the model is, and the `others` that apply instead; `named`:
        the message starts with the role's name (`probe induction …`), else with the probe's."""
        missing = self.missing(capabilities_of(model))
        if missing:
            instead = f": use {', '.join(others)}" if others else ""
            raise ArgumentError(role, ("{name} " if named else "") + "{value} {why}; {model} {lacks}{instead}",
                                value=probe, why=self.why, model=forward.model_name(model),
                                lacks=LACKING[missing[0]], instead=instead)


@dataclass(frozen=True)
class Effects:
    """How [`head_effects`][qkv.explain.causal.head_effects.head_effects] measures what each head
    does to the probe's task, and how [`faithfulness`][qkv.explain.causal.faithfulness.faithfulness]
    scores the contribution methods on the same sequences.

    Attributes:
        task: `task(model, *, sequences, length, seed)` → `Task` (sizes already checked
            by `qkv.explain.probes.induction.check_sizes`); ArgumentError naming
            `effects_probe` when the model cannot take it.
        metric: what the effect measures, in words (`HeadEffects.metric`).
        needs: what the metric needs of the model (a loss: `next_token`).
        scores: `scores(model, method, task)` → (L, h) for a per-head method, (L, 1) for a
            per-layer one: the method's score of each head on `task`'s sequences; None:
            faithfulness does not compare methods on this probe.
        compared: whether faithfulness compares the contribution methods on it; False where
            `scores` is the probe's own score whatever the method (retrieval's copy-paste
            count: every method would tie), shown beside the effects by `qkv heads --ablate`.
    """

    task: Callable[..., Task]
    metric: str
    needs: Needs = Needs()
    scores: Callable[[Any, str, Task], torch.Tensor] | None = None
    compared: bool = True


@dataclass(frozen=True)
class Probe:
    """A probe: which heads do a known job, on which sequences.

    Attributes:
        name: what `qkv.explain.probe`, `head_effects` and `--probe` call it.
        sequences: what it runs on, in words (the CLI's help lists it).
        run: `run(model, *, method, progress)` → a result with `ranked()` (layer, head,
            score, …) best first — the attention probe (`qkv.explain.probe`).
        needs: what the attention probe needs of the model.
        methods: whether a contribution method may score it (`method=`); False: it reads the
            attention weights themselves, and any method but the weights is refused.
        default_for: the models it is the default probe of (by their capabilities), or None.
        effects: how the causal tools use it, or None (no ablation metric).
    """

    name: str
    sequences: str
    run: Callable[..., Any]
    needs: Needs = Needs()
    methods: bool = False
    default_for: Callable[[Capabilities], bool] | None = None
    effects: Effects | None = None


__all__ = ["Effects", "LACKING", "Needs", "Probe", "Task", "method_shares", "ranked", "scored_from", "unit_shares"]
