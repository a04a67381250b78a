"""Induction and previous-token heads, scored the way TransformerLens does.

Feed the model *repeated random tokens*: a prefix the tokenizer puts first (`<bos>`, if it
has one), n random tokens r, then the same n tokens again:

```text
position:  0     1 … n        n+1 … 2n
token:     <bos> r₀ … rₙ₋₁    r₀  … rₙ₋₁
                     ▲ └─ next ─┘   │
                     └──────────────┘ query r_k (second copy) → key: the token after
                                      r_k's first occurrence (position k + 2 with <bos>)
```

* **induction score** of a head: its mean attention from each token of the second copy to the
  token *after* that token's earlier occurrence — key = query − (n − 1) — averaged over the
  second copy's n queries and all sequences. A head that has learned "find the earlier
  occurrence of this token and look at what followed" scores near 1.
* **previous-token score**: mean attention from every position ≥ 1 to the one just before it.

**Chance level** is the score of a head that spreads its weight uniformly over the keys it may
see (all earlier tokens and itself in a decoder: 1/(i+1) for query i; all t tokens in an
encoder), averaged over the same queries.

**On a hybrid** (linear-attention, state-space, differential layers beside softmax ones) every
layer is scored: a layer no softmax mixes through its exact effective map M (o = M·v, see
`qkv.explain.mixer_maps`), whose rows are signed and need not sum to 1. So that one ranking
holds every layer, a row is read as *shares of its absolute weight*, |M[i, k]| / Σ_j |M[i, j]|
— exactly the weight on a softmax row (non-negative, summing to 1), and on any row a number in
[0, 1] whose uniform chance is the softmax's. The sign is dropped: a head that subtracts its
target's value ranks as one that adds it (`qkv.explain.probes.effective.absolute_shares`).

One difference from TransformerLens: the n random tokens are drawn *without* replacement when
the vocabulary has enough ordinary tokens, so no token occurs twice inside r and "its earlier
occurrence" is unique (with replacement, a small vocabulary would make the target ambiguous).
Special tokens are never drawn.

Example (the scores of a hand-built pattern; see `induction_scores_of`):

Examples:
    >>> w = torch.zeros(1, 1, 7, 7)                     # <bos> a b c a b c, one head
    >>> for q in range(7): w[0, 0, q, max(q - 2, 0)] = 1.0   # key = query − (n − 1), n = 3
    >>> induction_scores_of(w, n=3).item()
    1.0
"""

from __future__ import annotations

from typing import Callable, ClassVar

import random
from dataclasses import dataclass

import torch

from qkv.errors import QkvError
from qkv.explain import forward
from qkv.explain.probes.base import Effects, Needs, Probe, Task, method_shares, ranked, scored_from
from qkv.explain.wording import ArgumentError
from qkv.explain.finite import check_layers
from qkv.explain.probes.effective import LayerMaps, layer_maps, plain_softmax
from qkv.models.protocol import capabilities_of


def _second_copy_queries(t: int, n: int) -> torch.Tensor:
    """Positions of the second copy of r in a sequence of length t = prefix + 2n."""
    return torch.arange(t - n, t)


@dataclass(frozen=True)
class Pattern:
    """Where a head's weight is read on a probe's sequences (t tokens, random span n): from each
    query row i of `rows(t, n)` to key i − `back(n)`; a head's score is the mean of those
    weights, its chance that of a head attending uniformly to every key it may see."""

    rows: Callable[[int, int], torch.Tensor]
    back: Callable[[int], int]

    def scores(self, weights: torch.Tensor, n: int) -> torch.Tensor:
        """(h,) the mean over sequences and rows of `weights` (b, h, t, t) on the pattern."""
        q = self.rows(weights.shape[-1], n)
        return weights[:, :, q, q - self.back(n)].double().mean(dim=(0, 2))  # (h,)

    def chance(self, t: int, n: int, causal: bool) -> float:
        """The score of a head that attends uniformly to every key it may see."""
        q = self.rows(t, n)
        visible = (q + 1).double() if causal else torch.full((len(q),), float(t), dtype=torch.float64)
        return float((1.0 / visible).mean())


#: the second copy's rows → the token after their earlier occurrence: key = query − (n − 1)
INDUCTION_PATTERN = Pattern(rows=_second_copy_queries, back=lambda n: n - 1)
#: every row i ≥ 1 → the token before it
PREVIOUS_TOKEN_PATTERN = Pattern(rows=lambda t, n: torch.arange(1, t), back=lambda n: 1)


def induction_scores_of(weights: torch.Tensor, n: int) -> torch.Tensor:
    """(…, h) mean attention from the second copy to "the token after the earlier occurrence".

    Args:
        weights: (b, h, t, t) attention weights on sequences `prefix + r + r` with `len(r) = n`.

    Returns:
        (h,) the mean over sequences and the n queries of `weights[:, :, q, q - (n - 1)]`.
    """
    b, h, t, s = weights.shape
    if t != s or t < 2 * n or n < 2:
        raise ValueError(f"weights must be (b, h, t, t) with t >= 2n and n >= 2, got "
                         f"{tuple(weights.shape)} and n={n}")
    return INDUCTION_PATTERN.scores(weights, n)


def previous_token_scores_of(weights: torch.Tensor) -> torch.Tensor:
    """(h,) mean attention from every position i ≥ 1 to position i − 1. weights (b, h, t, t)."""
    b, h, t, s = weights.shape
    if t != s or t < 2:
        raise ValueError(f"weights must be (b, h, t, t) with t >= 2, got {tuple(weights.shape)}")
    return PREVIOUS_TOKEN_PATTERN.scores(weights, 1)


@dataclass(frozen=True)
class HeadScores:
    """Every head's score on one probe — what `induction_probe` returns.

    Attributes:
        model: the model's name.
        probe: `"induction"` or `"previous-token"`.
        scores: (layers, heads) float64 mean attention on the probe's target; NaN where a layer
            has fewer heads than the widest (a hybrid's layers differ) or none (feed-forward only).
        chance: the score of uniform attention over the visible keys.
        sequences: how many repeated random sequences, each prefix + 2 × `length`.
        length: see `sequences`.
        prefix: the tokens put first (e.g. `["<bos>"]`).
        causal: a decoder's mask was used.
        mixers: each layer's scored mixer kind (`MixerKind` value; "" for a layer with none).
        effective: the layers scored on their effective maps' absolute shares (see the module
            doc), not on softmax weights.
        unscored: (layer, why) of what has no score: a feed-forward-only layer, a mixer run
            beside a layer's attention (Falcon-H1's, Zamba2's Mamba-2).
    """

    kind: ClassVar[str] = "head-scores"  # its row in qkv.explain.kinds.KINDS

    model: str
    probe: str
    scores: torch.Tensor
    chance: float
    sequences: int
    length: int
    prefix: tuple[str, ...]
    causal: bool
    seed: int
    mixers: tuple[str, ...] = ()
    effective: tuple[int, ...] = ()
    unscored: tuple[tuple[int, str], ...] = ()

    def ranked(self) -> list[tuple[int, int, float]]:
        """(layer, head, score) of every scored head, highest first (ties by layer, head)."""
        return ranked(self.scores)

    def to_dict(self) -> dict:
        mixer = (lambda layer: self.mixers[layer]) if self.mixers else (lambda layer: "softmax")
        return {"kind": self.kind, "model": self.model, "probe": self.probe, "chance": self.chance,
                "sequences": self.sequences, "length": self.length, "prefix": list(self.prefix),
                "causal": self.causal, "seed": self.seed, "effective": list(self.effective),
                "unscored": [{"layer": layer, "why": why} for layer, why in self.unscored],
                "heads": [{"layer": layer, "head": head, "score": score, "mixer": mixer(layer),
                           "effective": layer in self.effective}
                          for layer, head, score in self.ranked()]}


def prefix_ids(model) -> list[int]:
    """The special tokens the tokenizer puts before any text (`<bos>`, `[CLS]`), if any."""
    tok = model.tokenizer
    word = tok.id_to_token(tok.ordinary_ids()[0])
    enc = tok.encode(word if word else "a")
    out = []
    for i, special in zip(enc.ids, enc.special):
        if not special:
            break
        out.append(i)
    return out


def limit_of(model) -> int | None:
    """The most tokens the model takes: its tokenizer's limit (the model's positions)."""
    return model.tokenizer.max_length


def repeated_random_tokens(model, *, sequences: int, length: int, seed: int) -> torch.Tensor:
    """(sequences, prefix + 2·length) ids: prefix, r, r with r drawn from the ordinary tokens."""
    ids = model.tokenizer.ordinary_ids()
    rng = random.Random(seed)
    prefix = prefix_ids(model)
    rows = []
    for _ in range(sequences):
        r = rng.sample(ids, length) if len(ids) >= length else [rng.choice(ids) for _ in range(length)]
        rows.append(prefix + r + r)
    return torch.tensor(rows, dtype=torch.long)


def alternating_pairs(model, *, sequences: int, length: int, seed: int) -> torch.Tensor:
    """(sequences, prefix + 2·length) ids: prefix, then x y repeated `length` times (x ≠ y)."""
    ordinary = model.tokenizer.ordinary_ids()
    prefix = prefix_ids(model)
    rng = random.Random(seed)
    rows = [prefix + rng.sample(ordinary, 2) * length for _ in range(sequences)]
    return torch.tensor(rows, dtype=torch.long)


def attention_on(model, ids: torch.Tensor) -> list[torch.Tensor | None]:
    """Every layer's map (b, h, t, t) on `ids` (`maps_on`'s weights)."""
    return maps_on(model, ids).weights


def maps_on(model, ids: torch.Tensor) -> LayerMaps:
    """Every layer's map (b, h, t, t) on `ids`, from the model's own forward: softmax weights,
    or on a hybrid's other layers the absolute shares of the exact effective map
    (`qkv.explain.probes.effective.layer_maps`); `NonFiniteError` naming the first layer and head
    that computes NaN/inf (a broken model's scores would be NaN and rank nothing)."""
    if not plain_softmax(model):
        return layer_maps(model, ids)
    with torch.no_grad():
        out = model(ids, torch.ones_like(ids), trace_rows=slice(None), output_hidden_states=True)
    check_layers(out.traces, model=forward.model_name(model), output=out.hidden_states[-1])
    return LayerMaps.softmax(model, [trace.self_attn.attention.weights for trace in out.traces])


DEFAULT_LENGTH = 25  # TransformerLens's tutorials use 50; 25 fits small models' context too
#: the most random sequences a probe draws (1000 × (prefix + 2 · length) ids, then a forward per
#: batch of them): the library's bound, and ``--sequences``' (qkv faithfulness)
MAX_SEQUENCES = 1000
MAX_LENGTH = 4096  # tokens of one random span (a model's context is the other bound)


def check_sizes(sequences, length) -> None:
    """ArgumentError naming `sequences` unless it is a whole number in 1 … `MAX_SEQUENCES`,
    or `length` unless it is None or a whole number in 2 … `MAX_LENGTH` — a one-token span
    leaves nothing to measure: no repeated token r₁ … rₙ₋₁ to predict, no pair to read back."""
    def whole(x) -> bool:
        return isinstance(x, int) and not isinstance(x, bool)

    if not whole(sequences) or not 1 <= sequences <= MAX_SEQUENCES:
        raise ArgumentError("sequences", "{name} must be a whole number in 1–{most}, got {value!r}",
                            value=sequences, most=MAX_SEQUENCES)
    if length is not None and (not whole(length) or not 2 <= length <= MAX_LENGTH):
        raise ArgumentError("length", "{name} must be a whole number in 2–{most} (a span of one "
                            "random token leaves nothing to measure: no later token of it to "
                            "predict), got {value!r}", value=length, most=MAX_LENGTH)


def default_length(model) -> int:
    """The random span's default: `DEFAULT_LENGTH`, or what fits the model twice after
    the prefix (at least 2)."""
    limit = limit_of(model)
    room = (limit - len(prefix_ids(model))) // 2 if limit is not None else DEFAULT_LENGTH
    return max(2, min(DEFAULT_LENGTH, room))


def pattern_probe(model, name: str, pattern: Pattern, *, sequences: int = 20,
                  length: int | None = None, seed: int = 0) -> HeadScores:
    """Score every head of `model` by `pattern` on repeated random tokens (prefix + r + r,
    `len(r) = length`; default `default_length`); the result says it is probe `name`.

    Raises:
        ArgumentError: sizes out of bounds (`check_sizes`).
        QkvError: a length the model cannot take.
    """
    length = default_length(model) if length is None else length
    check_sizes(sequences, length)
    ids = repeated_random_tokens(model, sequences=sequences, length=length, seed=seed)  # (b, t)
    limit = limit_of(model)
    if limit is not None and ids.shape[1] > limit:
        raise QkvError(f"the probe's sequences are {ids.shape[1]} tokens; "
                       f"{forward.model_name(model)} takes at most {limit}")
    maps = maps_on(model, ids)
    scores = maps.stack([None if w is None else pattern.scores(w, length) for w in maps.weights])  # (L, h)
    causal = capabilities_of(model).causal
    prefix = tuple(model.tokenizer.id_to_token(i) for i in ids[0, :ids.shape[1] - 2 * length].tolist())
    return HeadScores(model=forward.model_name(model), probe=name, scores=scores,
                      chance=pattern.chance(ids.shape[1], length, causal), sequences=sequences,
                      length=length, prefix=prefix, causal=causal, seed=seed, mixers=maps.mixers,
                      effective=maps.effective, unscored=maps.unscored)


#: this file's probes' patterns, by probe name
PATTERNS = {"induction": INDUCTION_PATTERN, "previous-token": PREVIOUS_TOKEN_PATTERN}


def induction_probe(model, probe: str = "induction", *, sequences: int = 20,
                    length: int | None = None, seed: int = 0) -> HeadScores:
    """Score every head of `model` on repeated random tokens (see the module docstring).

    Args:
        probe: `"induction"` or `"previous-token"`.
        sequences, length: `sequences` random sequences, each prefix + r + r with `len(r) = length`
            (default 25, or less when the model takes fewer than prefix + 50 tokens).
        seed: which random tokens.

    Raises:
        QkvError: an unknown probe, a length the model cannot take.

    Examples:
        >>> import qkv                                               # doctest: +SKIP
        >>> r = induction_probe(qkv.load("src/qkv/data/lm"))          # doctest: +SKIP
        >>> r.ranked()[0][2] > 10 * r.chance                          # doctest: +SKIP
        True
    """
    pattern = PATTERNS.get(probe)
    if pattern is None:
        raise QkvError(f"unknown probe {probe!r}; known: {', '.join(PATTERNS)} (and coref)")
    return pattern_probe(model, probe, pattern, sequences=sequences, length=length, seed=seed)


# -- the probes' records: what head_effects ablates, and how faithfulness scores methods there --
def check_fits(model, ids: torch.Tensor, n: int) -> None:
    """ArgumentError naming `length` when the sequences `ids` (b, t) are longer than the model takes."""
    t, limit = ids.shape[1], limit_of(model)
    if limit is not None and t > limit:
        raise ArgumentError("length", "{name} {value} makes {t}-token sequences; {model} takes at "
                            "most {limit}", value=n, t=t, model=forward.model_name(model), limit=limit)


def repeated_task(model, *, sequences: int, length: int | None, seed: int) -> Task:
    """Repeated random tokens (prefix, r, r); scored: the predictions from r₀ (second copy) on,
    r₁ … rₙ₋₁ — predictable only by finding the earlier occurrence and copying what followed."""
    n = default_length(model) if length is None else length
    ids = repeated_random_tokens(model, sequences=sequences, length=n, seed=seed)  # (b, prefix + 2n)
    check_fits(model, ids, n)
    return Task(ids=list(ids.split(1)), scored=scored_from(ids.shape[1], len(prefix_ids(model)) + n),
                length=n)


def pairs_task(model, *, sequences: int, length: int | None, seed: int) -> Task:
    """Alternating pairs (prefix, x y x y …); scored: from the second y on, where the next token
    is the one before the current one — readable only by a previous-token head's move."""
    n = default_length(model) if length is None else length
    ids = alternating_pairs(model, sequences=sequences, length=n, seed=seed)  # (b, prefix + 2n)
    check_fits(model, ids, n)
    return Task(ids=list(ids.split(1)), scored=scored_from(ids.shape[1], len(prefix_ids(model)) + 1),
                length=n)


def scores_by(pattern: Pattern) -> Callable[[object, str, Task], torch.Tensor]:
    """An `scores` reading `pattern` off a method's shares
    on the task's sequences: (L, h) or (L, 1)."""
    def scores(model, method: str, task: Task) -> torch.Tensor:
        shares = method_shares(model, method, task.ids)  # (L, S, h|1, t, t)
        return torch.stack([pattern.scores(w, task.length) for w in shares])  # (L, h|1)
    return scores


LOSS = Needs(("next_token",), "measures next-token loss")

INDUCTION = Probe(
    name="induction", sequences="on repeated random tokens",
    run=lambda model, *, method, progress: induction_probe(model, "induction"),
    default_for=lambda caps: caps.causal,
    effects=Effects(task=repeated_task, needs=LOSS, scores=scores_by(INDUCTION_PATTERN),
                    metric="mean next-token loss on the repeated half of random repeated sequences"))

PREVIOUS_TOKEN = Probe(
    name="previous-token", sequences="on repeated random tokens",
    run=lambda model, *, method, progress: induction_probe(model, "previous-token"),
    effects=Effects(task=pairs_task, needs=LOSS, scores=scores_by(PREVIOUS_TOKEN_PATTERN),
                    metric="mean next-token loss on alternating pairs x y x y … (the next token is "
                           "the one before the current)"))

PROBES = (INDUCTION.name, PREVIOUS_TOKEN.name)  # this file's probes
