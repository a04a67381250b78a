"""Which explanation methods agree with causal ground truth?
[`faithfulness`][qkv.explain.causal.faithfulness.faithfulness].

For one probe, every contribution method scores each head
([`qkv.explain.contributions`][qkv.explain.contributions]), and ablation measures what each head
does to the probe's task (`head_effects`). A method is *faithful* on the probe when the heads it
scores high are the heads whose removal hurts: the table is Spearman's ρ between the two, per
method.

A method's per-head probe score, on the *same sequences* the effects are measured on (the
probe's task, [`task`][qkv.explain.causal.head_effects.task], one definition for both sides):

* `induction`: on the repeated random sequences (prefix, r, r), each row as shares of its
  total (the weights as they are), the second copy's share on "the token after the earlier
  occurrence" (`induction_scores_of`);
* `previous-token`: on the alternating pairs (prefix, x y x y …) the effects are measured on,
  each token's share on the one before it (`previous_token_scores_of`). This differs from
  `qkv.explain.probe`'s previous-token *attention* probe, which reads TransformerLens's
  repeated random tokens: a head's score there and here may differ (`lm`'s previous-token head,
  `L0 H1`: 0.71 there, 0.68 here), but scoring the methods on other sequences than the ones
  ablated would compare two experiments, not a method with the ground truth;
* `coref`: `qkv.explain.probe`'s accuracy — how often the head's largest share from the
  pronoun lands on its referent.

Per-layer methods (`rollout`, `flow`, `alti`, `value-zeroing`, `grad`) score layers, not
heads: their ρ is over layers, against the effect of ablating all of a layer's heads at once
(`per` says which, `n` how many points; with few layers ρ says little). A method that does not
apply (`flow` past 24 tokens, `grad` on an encoder without a second text) is listed in
`skipped` with the reason.

Examples:
    >>> import qkv
    >>> f = faithfulness(qkv.load("lm"), probe="induction", sequences=4)     # doctest: +SKIP
    >>> sorted([*f.spearman, *f.skipped]) == sorted(contributions.METHODS)  # doctest: +SKIP
    True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, ClassVar, Iterable

import torch

from qkv.errors import QkvError
from qkv.explain import contributions, forward
from qkv.explain.probes import registry
from qkv.explain.contributions.grad import is_decoder
from qkv.explain.causal.head_effects import HeadEffects, head_effects, task
from qkv.explain.wording import ArgumentError


def ranks(x: torch.Tensor) -> torch.Tensor:
    """(n,) float64 ranks from 1, ties given their average rank.

    Examples:
        >>> ranks(torch.tensor([10.0, 30.0, 20.0, 30.0])).tolist()
        [1.0, 3.5, 2.0, 3.5]
    """
    x = x.double().flatten()
    order = torch.argsort(x, stable=True)
    r = torch.empty_like(x)
    r[order] = torch.arange(1, len(x) + 1, dtype=torch.float64)
    for v in x.unique():  # ties share the mean of their ranks
        same = x == v
        r[same] = r[same].mean()
    return r


def spearman(a: torch.Tensor, b: torch.Tensor) -> float | None:
    """Spearman's ρ of two equally long score lists: Pearson's r of their ranks; None when
    either is constant (no order to compare) or shorter than 2."""
    ra, rb = ranks(a), ranks(b)
    if len(ra) != len(rb):
        raise ValueError(f"a and b must have the same length, got {len(ra)} and {len(rb)}")
    da, db = ra - ra.mean(), rb - rb.mean()
    denom = float(da.norm() * db.norm())
    return float(da @ db) / denom if len(ra) >= 2 and denom > 0 else None


# -- each method's per-head (or per-layer) probe score ---------------------------------------------
def method_scores(model, probe: str, method: str, *, sequences: int, length: int | None,
                  seed: int) -> torch.Tensor:
    """(L, h) for a per-head method, (L, 1) for a per-layer one: the method's probe score on the
    sequences that are ablated (the probe's `scores`)."""
    task_ = task(model, probe, sequences=sequences, length=length, seed=seed)
    return registry.PROBES[probe].effects.scores(model, method, task_)


# -- the table ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Faithfulness:
    """Each method's agreement with ablation on one probe — what
    [`faithfulness`][qkv.explain.causal.faithfulness.faithfulness] returns.

    Attributes:
        model: what ran.
        probe: see `model`.
        effects: the [`HeadEffects`][qkv.explain.causal.head_effects.HeadEffects] (with
            `layer_effects`).
        scores: {method: (L, h) per-head or (L,) per-layer probe scores}.
        per: {method: `"head"` or `"layer"`}.
        spearman: {method: ρ between its scores and the effects, or None (no order)}.
        skipped: {method: why it did not run on this probe}.
    """

    model: str
    probe: str
    effects: HeadEffects
    scores: dict[str, torch.Tensor]
    per: dict[str, str]
    spearman: dict[str, float | None]
    skipped: dict[str, str]

    kind: ClassVar[str] = "faithfulness"  # what to_dict() says it is

    def to_dict(self) -> dict:
        """The effects' fields
        ([`HeadEffects.to_dict`][qkv.explain.causal.head_effects.HeadEffects.to_dict]: mode, metric,
        clean, sequences, effects, layer_effects, heads), then each method's scores and ρ, and what
        was skipped."""
        effects = {k: v for k, v in self.effects.to_dict().items() if k != "kind"}
        return {"kind": self.kind, **effects, "model": self.model, "probe": self.probe,
                "methods": [{"method": m, "per": self.per[m], "spearman": self.spearman[m],
                             "n": self.scores[m].numel(), "scores": self.scores[m].tolist()}
                            for m in self.scores],
                "skipped": dict(self.skipped)}


def faithfulness(model, probe: str = "induction", *, methods: list[str] | None = None,
                 mode: str = "zero", sequences: int = 8, length: int | None = None,
                 seed: int = 0,
                 progress: Callable[[str, int, int], None] | None = None) -> Faithfulness:
    """Spearman's ρ between each method's per-head probe scores and the heads' ablation effects.

    Args:
        probe: `"induction"`, `"previous-token"` (decoders) or `"coref"`.
        methods: names in `qkv.explain.contributions.METHODS` (default: all).
        mode: the ablation (`"zero"` or `"mean"`).
        sequences, length, seed: the decoder probes' random sequences (both sides use them).
        progress: called as `progress(stage, done, total)` while it works: `"ablating"`
            ([`head_effects`][qkv.explain.causal.head_effects.head_effects]' copies), then
            `"methods"` (one step per method), e.g. to draw bars (`qkv faithfulness` does on a
            terminal).

    Raises:
        ArgumentError: an unknown probe, method or mode; a probe that does not apply.
    """
    names = list(contributions.METHODS) if methods is None else \
        [] if isinstance(methods, (str, bytes)) or not isinstance(methods, Iterable) else list(methods)
    if not names:  # a str would be read letter by letter
        raise ArgumentError("methods", "{name} must be a non-empty list of method names (None: all "
                            "of {known}), got {value!r}", value=methods,
                            known=", ".join(contributions.METHODS))
    for name in names:
        contributions.get_method(name)
    task(model, probe, sequences=1, length=length, seed=seed)  # a probe that does not apply: now
    if probe not in registry.compared():
        raise ArgumentError("effects_probe", "{name} {value}: no contribution method scores its "
                            "heads, so there is nothing to compare (faithfulness compares methods "
                            "on {known})", value=probe, known=", ".join(registry.compared()))
    tell = progress if progress is not None else (lambda stage, done, total: None)
    effects = head_effects(model, probe, mode=mode, sequences=sequences, length=length, seed=seed,
                           layers=True, progress=progress)
    scores, per, rho, skipped = {}, {}, {}, {}
    for i, name in enumerate(names):
        tell("methods", i, len(names))
        if contributions.METHODS[name].reads_target and not is_decoder(model):
            # a target text is what such a method differentiates on an encoder; a probe's
            # sentences come without one (so no flag could give it: say so, suggest none)
            skipped[name] = (f"on an encoder ({forward.model_name(model)}) {name} differentiates the "
                             "similarity to a second text, and a probe's sentences come without one")
            continue
        try:
            s = method_scores(model, probe, name, sequences=sequences, length=length, seed=seed)
        except (ArgumentError, QkvError) as e:
            skipped[name] = str(e)
            continue
        per[name] = contributions.METHODS[name].per
        scores[name] = s if per[name] == "head" else s[:, 0]
        truth = effects.effects if per[name] == "head" else effects.layer_effects
        rho[name] = spearman(scores[name], truth)
    tell("methods", len(names), len(names))
    return Faithfulness(model=forward.model_name(model), probe=probe, effects=effects,
                        scores=scores, per=per, spearman=rho, skipped=skipped)
