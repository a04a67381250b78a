"""Induction and previous-token heads, scored the way TransformerLens does.

Feed the model *repeated random tokens*: a prefix the tokenizer puts first (``<bos>``, if it
has one), n random tokens r, then the same n tokens again::

    position:  0     1 … n        n+1 … 2n
    token:     <bos> r₀ … rₙ₋₁    r₀  … rₙ₋₁
                         ▲ └─ next ─┘   │
                         └──────────────┘ query r_k (second copy) → key: the token after
                                          r_k's first occurrence (position k + 2 with <bos>)

* **induction score** of a head: its mean attention from each token of the second copy to the
  token *after* that token's earlier occurrence — key = query − (n − 1) — averaged over the
  second copy's n queries and all sequences. A head that has learned "find the earlier
  occurrence of this token and look at what followed" scores near 1.
* **previous-token score**: mean attention from every position ≥ 1 to the one just before it.

**Chance level** is the score of a head that spreads its weight uniformly over the keys it may
see (all earlier tokens and itself in a decoder: 1/(i+1) for query i; all t tokens in an
encoder), averaged over the same queries.

One difference from TransformerLens: the n random tokens are drawn *without* replacement when
the vocabulary has enough ordinary tokens, so no token occurs twice inside r and "its earlier
occurrence" is unique (with replacement, a small vocabulary would make the target ambiguous).
Special tokens are never drawn.

Example (the scores of a hand-built pattern; see :func:`induction_scores_of`):
    >>> w = torch.zeros(1, 1, 7, 7)                     # <bos> a b c a b c, one head
    >>> for q in range(7): w[0, 0, q, max(q - 2, 0)] = 1.0   # key = query − (n − 1), n = 3
    >>> induction_scores_of(w, n=3).item()
    1.0
"""

from __future__ import annotations

from typing import ClassVar

import random
from dataclasses import dataclass

import torch

from qkv.errors import QkvError
from qkv.explain import forward
from qkv.explain.wording import ArgumentError
from qkv.explain.finite import check_layers
from qkv.models.protocol import capabilities_of

PROBES = ("induction", "previous-token")


def _second_copy_queries(t: int, n: int) -> torch.Tensor:
    """Positions of the second copy of r in a sequence of length t = prefix + 2n."""
    return torch.arange(t - n, t)


def induction_scores_of(weights: torch.Tensor, n: int) -> torch.Tensor:
    """(…, h) mean attention from the second copy to "the token after the earlier occurrence".

    Args:
        weights: (b, h, t, t) attention weights on sequences ``prefix + r + r`` with ``len(r) = n``.

    Returns:
        (h,) the mean over sequences and the n queries of ``weights[:, :, q, q - (n - 1)]``.
    """
    b, h, t, s = weights.shape
    if t != s or t < 2 * n or n < 2:
        raise ValueError(f"weights must be (b, h, t, t) with t >= 2n and n >= 2, got "
                         f"{tuple(weights.shape)} and n={n}")
    q = _second_copy_queries(t, n)
    return weights[:, :, q, q - (n - 1)].double().mean(dim=(0, 2))  # (h,)


def previous_token_scores_of(weights: torch.Tensor) -> torch.Tensor:
    """(h,) mean attention from every position i ≥ 1 to position i − 1. weights (b, h, t, t)."""
    b, h, t, s = weights.shape
    if t != s or t < 2:
        raise ValueError(f"weights must be (b, h, t, t) with t >= 2, got {tuple(weights.shape)}")
    q = torch.arange(1, t)
    return weights[:, :, q, q - 1].double().mean(dim=(0, 2))


def chance_of(probe: str, t: int, n: int, causal: bool) -> float:
    """The score of a head that attends uniformly to every key it may see."""
    q = _second_copy_queries(t, n) if probe == "induction" else torch.arange(1, t)
    visible = (q + 1).double() if causal else torch.full((len(q),), float(t), dtype=torch.float64)
    return float((1.0 / visible).mean())


@dataclass(frozen=True)
class HeadScores:
    """Every head's score on one probe — what :func:`induction_probe` returns.

    Fields:
        model: the model's name; probe: ``"induction"`` or ``"previous-token"``.
        scores: (layers, heads) float64 mean attention on the probe's target.
        chance: the score of uniform attention over the visible keys.
        sequences, length: how many repeated random sequences, each prefix + 2 × ``length``.
        prefix: the tokens put first (e.g. ``["<bos>"]``); causal: a decoder's mask was used.
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

    def ranked(self) -> list[tuple[int, int, float]]:
        """(layer, head, score), highest first (ties by layer, head)."""
        L, H = self.scores.shape
        cells = [(layer, head, float(self.scores[layer, head])) for layer in range(L) for head in range(H)]
        return sorted(cells, key=lambda c: (-c[2], c[0], c[1]))

    def to_dict(self) -> dict:
        return {"kind": self.kind, "model": self.model, "probe": self.probe, "chance": self.chance,
                "sequences": self.sequences, "length": self.length, "prefix": list(self.prefix),
                "causal": self.causal, "seed": self.seed,
                "heads": [{"layer": layer, "head": head, "score": score}
                          for layer, head, score in self.ranked()]}


def _prefix_ids(model) -> list[int]:
    """The special tokens the tokenizer puts before any text (``<bos>``, ``[CLS]``), if any."""
    tok = model.tokenizer
    word = tok.id_to_token(tok.ordinary_ids()[0])
    enc = tok.encode(word if word else "a")
    out = []
    for i, special in zip(enc.ids, enc.special):
        if not special:
            break
        out.append(i)
    return out


def _limit(model) -> int | None:
    """The most tokens the model takes: its tokenizer's limit (the model's positions)."""
    return model.tokenizer.max_length


def repeated_random_tokens(model, *, sequences: int, length: int, seed: int) -> torch.Tensor:
    """(sequences, prefix + 2·length) ids: prefix, r, r with r drawn from the ordinary tokens."""
    ids = model.tokenizer.ordinary_ids()
    rng = random.Random(seed)
    prefix = _prefix_ids(model)
    rows = []
    for _ in range(sequences):
        r = rng.sample(ids, length) if len(ids) >= length else [rng.choice(ids) for _ in range(length)]
        rows.append(prefix + r + r)
    return torch.tensor(rows, dtype=torch.long)


def attention_on(model, ids: torch.Tensor) -> list[torch.Tensor]:
    """Every layer's attention weights (b, h, t, t) on ``ids``, from the model's own forward;
    :class:`~qkv.explain.finite.NonFiniteError` naming the first layer and head that computes
    NaN/inf (a broken model's scores would be NaN and rank nothing)."""
    with torch.no_grad():
        out = model(ids, torch.ones_like(ids), trace_rows=slice(None), output_hidden_states=True)
    check_layers(out.traces, model=forward.model_name(model), output=out.hidden_states[-1])
    return [trace.self_attn.attention.weights for trace in out.traces]


DEFAULT_LENGTH = 25  # TransformerLens's tutorials use 50; 25 fits small models' context too
#: the most random sequences a probe draws (1000 × (prefix + 2 · length) ids, then a forward per
#: batch of them): the library's bound, and ``--sequences``' (qkv faithfulness)
MAX_SEQUENCES = 1000
MAX_LENGTH = 4096  # tokens of one random span (a model's context is the other bound)


def check_sizes(sequences, length) -> None:
    """ArgumentError naming ``sequences`` unless it is a whole number in 1 … :data:`MAX_SEQUENCES`,
    or ``length`` unless it is None or a whole number in 2 … :data:`MAX_LENGTH` — a one-token span
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


def induction_probe(model, probe: str = "induction", *, sequences: int = 20,
                    length: int | None = None, seed: int = 0) -> HeadScores:
    """Score every head of ``model`` on repeated random tokens (see the module docstring).

    Args:
        probe: ``"induction"`` or ``"previous-token"``.
        sequences, length: ``sequences`` random sequences, each prefix + r + r with ``len(r) = length``
            (default 25, or less when the model takes fewer than prefix + 50 tokens).
        seed: which random tokens.

    Raises:
        QkvError: an unknown probe, a length the model cannot take.

    Example:
        >>> import qkv                                               # doctest: +SKIP
        >>> r = induction_probe(qkv.load("src/qkv/data/lm"))          # doctest: +SKIP
        >>> r.ranked()[0][2] > 10 * r.chance                          # doctest: +SKIP
        True
    """
    if probe not in PROBES:
        raise QkvError(f"unknown probe {probe!r}; known: {', '.join(PROBES)} (and coref)")
    if length is None:
        limit = _limit(model)
        room = (limit - len(_prefix_ids(model))) // 2 if limit is not None else DEFAULT_LENGTH
        length = max(2, min(DEFAULT_LENGTH, room))
    check_sizes(sequences, length)
    ids = repeated_random_tokens(model, sequences=sequences, length=length, seed=seed)
    limit = _limit(model)
    if limit is not None and ids.shape[1] > limit:
        raise QkvError(f"the probe's sequences are {ids.shape[1]} tokens; "
                       f"{forward.model_name(model)} takes at most {limit}")
    layers = attention_on(model, ids)
    score = (lambda w: induction_scores_of(w, length)) if probe == "induction" else previous_token_scores_of
    scores = torch.stack([score(w) for w in layers])  # (L, h)
    causal = capabilities_of(model).causal
    prefix = tuple(model.tokenizer.id_to_token(i) for i in ids[0, :ids.shape[1] - 2 * length].tolist())
    return HeadScores(model=forward.model_name(model), probe=probe, scores=scores,
                      chance=chance_of(probe, ids.shape[1], length, causal), sequences=sequences,
                      length=length, prefix=prefix, causal=causal, seed=seed)
