"""The table of probes: `PROBES`, `register_probe`, and `probe`, the one entry
that runs any of them.

Each probe is a `Probe` record defined in its own file
(`coref.COREF`, `induction.INDUCTION` / `PREVIOUS_TOKEN`, `retrieval.RETRIEVAL`);
this table lists the shipped ones in the order the CLI shows them, as
`qkv.explain.contributions.METHODS` lists the methods. A new probe is one file with its
record and one call: `register_probe(MY_PROBE)` (nothing registers on import).

Examples:
    >>> list(PROBES)
    ['coref', 'induction', 'previous-token', 'retrieval']
    >>> compared()                     # faithfulness' probes, the decoders' first
    ['induction', 'previous-token', 'coref']
    >>> register_probe(PROBES["coref"])
    Traceback (most recent call last):
    ...
    ValueError: probe 'coref' is already registered (registered: coref, induction, previous-token, retrieval)
"""

from __future__ import annotations

from typing import Callable

from qkv.explain import contributions
from qkv.explain.probes import coref, induction, retrieval
from qkv.explain.probes.base import Probe
from qkv.explain.wording import ArgumentError
from qkv.models.protocol import capabilities_of

#: name → probe, in the order the CLI lists them.
PROBES: dict[str, Probe] = {p.name: p for p in (
    coref.COREF, induction.INDUCTION, induction.PREVIOUS_TOKEN, retrieval.RETRIEVAL)}


def register_probe(probe: Probe) -> Probe:
    """Add `probe` to `PROBES` (returned, so a file may write `PROBE = register_probe(…)`
    where importing it is meant to register it).

    Raises:
        ValueError: the name is taken (a silent replacement would change every caller's
            numbers), or `probe` is not a `Probe`.
    """
    if not isinstance(probe, Probe):
        raise ValueError(f"probe must be a qkv.explain.probes.base.Probe, got {type(probe).__name__}")
    if probe.name in PROBES:
        raise ValueError(f"probe {probe.name!r} is already registered (registered: {', '.join(PROBES)})")
    PROBES[probe.name] = probe
    return probe


def get_probe(name: str, role: str = "probe") -> Probe:
    """The registered probe `name`; ArgumentError naming `role` and listing the known ones."""
    found = PROBES.get(name) if isinstance(name, str) else None
    if found is None:
        raise ArgumentError(role, "unknown probe {value!r}; known probes: {known}", value=name,
                            known=", ".join(PROBES))
    return found


def names() -> list[str]:
    """Every registered probe's name, in the table's order (`qkv heads --probe`'s choices)."""
    return list(PROBES)


def with_effects() -> list[str]:
    """The probes [`head_effects`][qkv.explain.causal.head_effects.head_effects] measures."""
    return [name for name, p in PROBES.items() if p.effects is not None]


def compared() -> list[str]:
    """The probes [`faithfulness`][qkv.explain.causal.faithfulness.faithfulness] compares methods on
    (their effects have `scores`), those whose metric needs a decoder first (the CLI's help
    says "the first two for decoders")."""
    scored = [p for p in PROBES.values()
              if p.effects is not None and p.effects.scores is not None and p.effects.compared]
    return [p.name for p in sorted(scored, key=lambda p: not p.effects.needs.capabilities)]


def default_probe(model) -> str:
    """The first probe whose `default_for` takes `model`'s capabilities (`coref` for an
    encoder, `induction` for a causal model: a pronoun cannot see its referent's successors
    there, an induction head has its earlier occurrence to find); the first probe otherwise."""
    caps = capabilities_of(model)
    return next((p.name for p in PROBES.values() if p.default_for is not None and p.default_for(caps)),
                next(iter(PROBES)))


def applying(model, needs_of: Callable[[Probe], object], among: list[str]) -> list[str]:
    """Of the probes `among`, those whose needs (`needs_of(probe)`) `model` meets."""
    caps = capabilities_of(model)
    return [n for n in among if not needs_of(PROBES[n]).missing(caps)]


def probe(model, name: str | None = None, *, method: str = contributions.DEFAULT,
          progress: Callable[[str, int, int], None] | None = None):
    """Run the probe `name` (None: `default_probe`) on every head of `model`.

    `coref` → `ProbeResult`: each head's accuracy at
    putting its largest weight (from the pronoun, over the words of the sentence other than the
    pronoun itself) on the labelled referent. `induction` / `previous-token` →
    `HeadScores`
    (`induction_probe`, weights only). `retrieval` →
    `RetrievalScores` (decoders: Wu et al.'s copy-paste
    score on needle-in-a-haystack inputs). A registered probe: what its `run` returns.

    `method`: score by a contribution method's largest share instead (see
    [`qkv.explain.contributions`][qkv.explain.contributions]), for a probe whose record allows it
    (`methods`); a per-layer method scores each layer. `grad` on an encoder does not apply (the
    probe has no second text to compare with).

    `progress(stage, done, total)`: told after each of coref's sentences (`"sentences"`)
    and each of retrieval's needles (`"needles"`); induction's one batched forward tells nothing.

    Raises:
        ArgumentError: an unknown probe `name` (see `PROBES`), a probe the model cannot
            take, an unknown `method` or one that does not apply.
        NonFiniteError: the model computes NaN/inf (named by layer and head).

    Example (49 forward passes, a few seconds; skipped in the doctest run):

    Examples:
        >>> import qkv
        >>> result = probe(qkv.load("minilm"))                      # doctest: +SKIP
        >>> layer, head, accuracy, correct = result.ranked()[0]     # doctest: +SKIP
        >>> len(result.items), accuracy > 4 * result.chance         # doctest: +SKIP
        (49, True)
    """
    p = get_probe(default_probe(model) if name is None else name)
    others = applying(model, lambda q: q.needs, [n for n in PROBES if n != p.name])
    p.needs.check(model, "probe", p.name, others, named=False)
    if not p.methods and method is not None and not contributions.get_method(method).raw:
        raise ArgumentError("method", "{name} {value} does not apply to the {probe} probe: it "
                            "scores the attention weights themselves", value=method, probe=p.name)
    return p.run(model, method=method, progress=progress)


__all__ = ["PROBES", "compared", "default_probe", "get_probe", "names", "probe", "register_probe",
           "with_effects"]
