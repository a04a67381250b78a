"""What each head does to a probe's task when it alone is removed:
[`head_effects`][qkv.explain.causal.head_effects.head_effects].

The attention probes (`qkv.explain.induction`, `qkv.explain.probe`) say where a head
*looks*; this says whether the model *needs* it. For every head (and every layer's heads
together) the probe's metric is measured with that head ablated
(`qkv.explain.interventions`), and the effect is the change from the clean run. Each probe's
record says how (`Effects`: its sequences, where the metric
reads, what it needs of the model); the shipped ones:

* `induction` (decoders) — the mean next-token loss on the *repeated half* of the probe's
  random repeated sequences (prefix, r, r: the second copy's tokens r₁ … rₙ₋₁ are predictable
  only by finding the earlier occurrence and copying what followed). Effect: loss ablated −
  loss clean (positive: the head helps copying).
* `previous-token` (decoders) — the mean next-token loss on *alternating pairs*
  (prefix, x y x y x y …, x ≠ y random): from the third token on, the next token is the one
  *before* the current one, so it can only be predicted by reading the previous token — the
  information a previous-token head moves. Effect: loss ablated − loss clean. These are not
  the repeated random tokens of the previous-token *attention* probe
  (`qkv.explain.probes.induction.induction_probe`): there the next token is random or an
  induction target, and no loss reads the previous token alone. The methods' scores that
  [`faithfulness`][qkv.explain.causal.faithfulness.faithfulness] compares with these effects are
  taken on these same pairs ([`task`][qkv.explain.causal.head_effects.task] is the one definition of
  a probe's data). An induction circuit solves the pairs too (the earlier x was followed by y),
  which itself needs the previous-token head: so ablating one induction head alone barely matters,
  ablating both does.
* `retrieval` (decoders) — the mean next-token loss on the needle's copy in the retrieval
  probe's needle-in-a-haystack inputs (`qkv.explain.probes.retrieval.needle_inputs`): the copy's
  tokens after the first are predictable only by finding the needle earlier in the input.
  Effect: loss ablated − loss clean. (The top-k retrieval heads against k random heads, on the
  needle's accuracy: `qkv.explain.probes.retrieval.retrieval_ablation`.)
* `coref` (any model whose tokenizer splits the probe sentences into the labelled words; made
  for encoders) — 1 − cos(h^L_p ablated, h^L_p clean), h^L_p the pronoun's final vector (its
  tokens averaged), averaged over the shipped coref sentences. An encoder has no next token to
  score; what a coreference head would do is write the referent into the pronoun's
  representation, so removing a head that matters turns the pronoun's final vector; the
  cosine is the measure sentence embeddings are compared with, and it is 0 for a head the
  model does not use (and for the clean run itself).

Batched: one forward holds the clean copy and one copy per head of every probe sequence of one
length (L·h + 1 copies; + L with `layers=True`), so all effects cost about L·h + 1 plain
forwards of the probe data, in a few calls (`MAX_BATCH` rows each).

Examples:
    >>> import qkv
    >>> e = head_effects(qkv.load("lm"), probe="induction", sequences=4)       # doctest: +SKIP
    >>> e.effects.shape                                                        # doctest: +SKIP
    torch.Size([2, 2])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, ClassVar

import torch

from qkv.explain import forward
from qkv.explain.probes import registry
from qkv.explain.probes.base import Task, ranked
from qkv.explain.probes.induction import check_sizes
from qkv.explain.causal import interventions
from qkv.explain.finite import NonFiniteError, describe
from qkv.models.protocol import capabilities_of
from qkv.modules.intervention import Interventions
from qkv.explain.wording import ArgumentError

#: most sequence copies in one forward (bounds memory: copies × t × E numbers per layer)
MAX_BATCH = 512


# -- the probes' data ----------------------------------------------------------------------------
def task(model, probe: str, *, sequences: int, length: int | None, seed: int) -> Task:
    """The probe's data for `model` (its record's `task`);
    ArgumentError when the probe does not apply to it, or for `sequences` and `length` out
    of `qkv.explain.probes.induction.check_sizes`' bounds."""
    check_sizes(sequences, length)
    measured = registry.with_effects()
    if probe not in measured:
        raise ArgumentError("effects_probe", "unknown {name} {value!r}; known: {known}", value=probe,
                            known=", ".join(measured))
    if not capabilities_of(model).self_attention:  # an encoder-decoder: cross-attention only
        raise ArgumentError("effects_probe", "{name} {value} does not apply to {model}: an "
                            "encoder-decoder supports no probe ({known} read the heads of a "
                            "self-attention model); explain its cross-attention instead",
                            value=probe, model=forward.model_name(model),
                            known=", ".join(registry.compared()))
    effects = registry.PROBES[probe].effects
    others = registry.applying(model, lambda p: p.effects.needs, [n for n in measured if n != probe])
    effects.needs.check(model, "effects_probe", probe, others)
    return effects.task(model, sequences=sequences, length=length, seed=seed)


def probes_for(model) -> list[str]:
    """The probes [`faithfulness`][qkv.explain.causal.faithfulness.faithfulness] compares
    methods on that apply to `model`, its default probe
    (`default_probe`) first — what the viewer offers.

    Examples:
        >>> import qkv
        >>> probes_for(qkv.load("lm"))
        ['induction', 'previous-token']
    """
    first = registry.default_probe(model)
    out = []
    for name in [first] + [p for p in registry.compared() if p != first]:
        try:
            task(model, name, sequences=1, length=None, seed=0)
        except ArgumentError:
            continue
        out.append(name)
    return out


# -- the metric ------------------------------------------------------------------------------------
def metric(task_: Task, index: torch.Tensor, output: torch.Tensor, clean: torch.Tensor) -> torch.Tensor:
    """(n,) the probe's metric on n rows: sequence `index` (n,) of the task, output (n, t, ·),
    and the clean run's output of the same sequences `clean` (n, t, ·) (coref compares with it)."""
    if task_.scored is not None:
        ids = torch.cat([task_.ids[int(i)] for i in index])  # (n, t)
        at = task_.scored.nonzero().flatten()  # the predictions read: position i → token i + 1
        logits = output[:, at]  # (n, k, V), in the model's dtype (float32: ~1e-7 of a loss)
        return torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, at + 1],
                                                 reduction="none").double().mean(-1)
    rows = [task_.pronouns[int(i)] for i in index]
    pick = lambda y: torch.stack([y[k, r].double().mean(0) for k, r in enumerate(rows)])  # noqa: E731
    h, ref = pick(output), pick(clean)  # (n, E)
    # an unchanged vector turned by nothing; cos(x, x) is 1 only to a rounding, so say 0 exactly
    return torch.where((h == ref).all(-1), 0.0, 1 - torch.cosine_similarity(h, ref, dim=-1))


# -- the effects ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class HeadEffects:
    """Each head's causal effect on a probe's metric — what
    [`head_effects`][qkv.explain.causal.head_effects.head_effects] returns.

    Attributes:
        model: what ran.
        metric: the metric in words.
        probe: the probe whose task was measured.
        mode: how the heads were ablated (`"zero"` or `"mean"`).
        clean: the metric on the clean run (0 for coref, by definition).
        effects: (L, h) float64 — metric with that head ablated − clean.
        layer_effects: (L,) float64 — the same with all of a layer's heads ablated together
            (`layers=True`), else None.
        sequences: how many probe sequences (sentences) were averaged.
    """

    model: str
    probe: str
    mode: str
    metric: str
    clean: float
    effects: torch.Tensor
    layer_effects: torch.Tensor | None
    sequences: int

    kind: ClassVar[str] = "head_effects"  # what to_dict() says it is

    def ranked(self) -> list[tuple[int, int, float]]:
        """(layer, head, effect), largest first (ties by layer, head)."""
        return ranked(self.effects)

    def to_dict(self) -> dict:
        """`effects[layer][head]`; `heads` the same, ranked."""
        return {"kind": self.kind, "model": self.model, "probe": self.probe, "mode": self.mode,
                "metric": self.metric, "clean": self.clean, "sequences": self.sequences,
                "effects": self.effects.tolist(),
                "layer_effects": None if self.layer_effects is None else self.layer_effects.tolist(),
                "heads": [{"layer": l, "head": h, "effect": e} for l, h, e in self.ranked()]}


def _copies(L: int, H: int, layers: bool) -> list[tuple[int, list[int]]]:
    """The batch's copies after the clean one: (layer, heads ablated) per head, then per layer."""
    per_layer = [(l, list(range(H))) for l in range(L)] if layers else []
    return [(l, [h]) for l in range(L) for h in range(H)] + per_layer


def _group(model, task_: Task, index: torch.Tensor, mode: str, copies,
           done=lambda k: None) -> torch.Tensor:
    """(1 + len(copies), n) the metric on n equally long sequences `index`: row 0 clean, row
    k with copy k's heads ablated; batched, at most `MAX_BATCH` rows a forward
    (`done(k)` after each, k its copies)."""
    ids = torch.cat([task_.ids[int(i)] for i in index])  # (n, t)
    n = ids.shape[0]
    means = interventions.mean_values(interventions.head_outputs(model, ids)) if mode == "mean" else None
    plan = [None] + copies  # copy 0: clean
    per = max(1, MAX_BATCH // n)  # copies per forward
    outputs = []
    for start in range(0, len(plan), per):
        chunk = plan[start:start + per]
        edits = {}  # (layer, head) → that head ablated in the copies that name it
        for k, c in enumerate(chunk):
            for head in [] if c is None else c[1]:
                edits.setdefault((c[0], head), torch.zeros(len(chunk), dtype=torch.bool))[k] = True
        heads = {key: _ablation(where.repeat_interleave(n), None if means is None else
                                means[key[0]][:, :, key[1]].repeat(len(chunk), 1, 1))
                 for key, where in edits.items()}  # rows: copy-major, then sequence
        edits = Interventions(heads=heads)
        batch = ids.repeat(len(chunk), 1)  # (copies · n, t)
        y = interventions.output_of(model, interventions.run(model, batch, edits))
        outputs.append(y.view(len(chunk), n, *y.shape[1:]))
        done(len(chunk))
    y = torch.cat(outputs)  # (1 + copies, n, t, ·)
    clean = y[0]
    return torch.stack([metric(task_, index, y[k], clean) for k in range(y.shape[0])])


def _ablation(where: torch.Tensor, mean: torch.Tensor | None):
    """A function of one head's output o (rows, t, d): the rows `where` (rows,) replaced by
    `mean` (rows, 1, d), or zeroed when `mean` is None; the other rows unchanged."""
    def edit(o: torch.Tensor) -> torch.Tensor:
        new = torch.zeros((), dtype=o.dtype) if mean is None else mean.to(o.dtype)
        return torch.where(where.view(-1, 1, 1), new, o)  # (rows, t, d)
    return edit


def head_effects(model, probe: str = "induction", *, mode: str = "zero", sequences: int = 20,
                 length: int | None = None, seed: int = 0, layers: bool = False,
                 progress: Callable[[str, int, int], None] | None = None) -> HeadEffects:
    """Every head's effect on `probe`'s metric when it alone is ablated (see the module doc).

    Args:
        probe: `"induction"`, `"previous-token"` (decoders) or `"coref"`.
        mode: `"zero"` or `"mean"` (see `qkv.explain.interventions`).
        sequences, length, seed: the random sequences of the decoder probes (as
            `qkv.explain.probes.induction.induction_probe`; the coref sentences are fixed).
        layers: also ablate each layer's heads together (`layer_effects`; L more copies).
        progress: called as `progress("ablating", done, total)` after each batched forward
            (done of total ablated copies of the sequence groups), e.g. to draw a bar.

    Raises:
        ArgumentError: an unknown probe or mode, a probe that does not apply to the model.
    """
    interventions.check_mode(mode, 2)
    task_ = task(model, probe, sequences=sequences, length=length, seed=seed)
    L, H = forward.num_layers(model), forward.num_heads(model)
    copies = _copies(L, H, layers)
    lengths = torch.tensor([ids.shape[1] for ids in task_.ids])
    total = torch.zeros(1 + len(copies), dtype=torch.float64)
    groups = lengths.unique().tolist()
    runs = [0, len(groups) * (1 + len(copies))]  # copies run, of all

    def done(k: int) -> None:
        runs[0] += k
        if progress is not None:
            progress("ablating", *runs)
    with torch.no_grad():
        for t in groups:  # equally long sequences batch together
            interventions.check_mode(mode, t)
            index = (lengths == t).nonzero().flatten()
            total += _group(model, task_, index, mode, copies, done).sum(-1)
    n = len(task_.ids)
    mean = total / n
    if not bool(torch.isfinite(mean).all()):  # a model that computes NaN: no effect to rank
        which = "the clean run" if not torch.isfinite(mean[0]) else "an ablated run"
        raise NonFiniteError(f"the {probe} metric is {describe(mean)} on {which} of "
                             f"{forward.model_name(model)}: the model computes non-finite numbers "
                             f"on the probe's sequences")
    effects = mean[1:] - mean[0]
    return HeadEffects(model=forward.model_name(model), probe=probe, mode=mode,
                       metric=registry.PROBES[probe].effects.metric, clean=float(mean[0]),
                       effects=effects[:L * H].view(L, H),
                       layer_effects=effects[L * H:] if layers else None, sequences=n)
