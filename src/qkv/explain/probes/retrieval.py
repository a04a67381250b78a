"""Retrieval heads (Wu et al., 2024, "Retrieval Head Mechanistically Explains Long-Context
Factuality"), measured on needle-in-a-haystack inputs at O(N) memory.

An input is a haystack with a *needle* — m random tokens — at some depth, and the same needle
again at the end as the query, teacher-forced (a model without instruction tuning is measured
by whether it copies the rest of the needle once its first token is given):

```text
<bos>  h₀ … h_a   n₀ n₁ … nₘ₋₁   h_a+1 … h_H−1   n₀ n₁ … nₘ₋₁
                  └─ needle ─┘                  └─ query: row q+k predicts n_k+1 ─┘
```

At step k (query row q + k, k = 0 … m − 2) the model predicts the next needle token n_{k+1}.
A head **copy-pastes** at that step when (Wu et al.'s definition):

* the model's prediction (the argmax of its logits) is n_{k+1}, and
* the key the head weights most (argmax_j w_{q+k, j}) lies inside the needle and holds the
  token n_{k+1}.

**Retrieval score** of a head = the share of the needle tokens n₁ … nₘ₋₁ it copy-pastes,
averaged over the inputs. **Chance** is the score of a head whose top key is drawn uniformly
from the keys its mask lets the row see, in a model that predicts every needle token: at
step k, (visible needle positions holding n_{k+1}) / (visible keys); averaged like the score;
computed per layer from that layer's mask (a sliding window that cannot reach the needle makes
it 0) and reported as the largest over layers. **Needle attention** of a head: the mean over
the query rows of the weight they put on the needle's m positions.

Memory: one forward per input records q, k and the log-sum-exp of every layer
([`qkv.explain.document`][qkv.explain.document]), then the m − 1 query rows' weights are recomputed
from them — O(h · m · N) per layer, never an N × N map.

Examples:
    >>> import qkv
    >>> r = retrieval_probe(qkv.load("lm"), samples=2)
    >>> r.scores.shape, 0.0 <= r.chance < 1.0
    (torch.Size([2, 2]), True)
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Callable, ClassVar, Sequence

import torch

from qkv.explain import forward
from qkv.explain.probes import induction
from qkv.explain.probes.base import Effects, Needs, Probe, Task, ranked, scored_from
from qkv.explain.long.document import Document, layer_record, check_finite_record
from qkv.explain.wording import ArgumentError
from qkv.models.protocol import capabilities_of
from qkv.modules.lse_trace import LSE

DEFAULT_LENGTH = 64  # tokens of one input (fits lm's 65 positions); qkv needle takes 1k-32k
DEFAULT_NEEDLE = 8   # tokens of the needle: 7 copy steps
DEFAULT_SAMPLES = 8
MAX_LENGTH = 1 << 17
MAX_SAMPLES = 1000


@dataclass(frozen=True)
class NeedleInput:
    """One needle-in-a-haystack input.

    Attributes:
        ids: (t,) the tokens.
        start: the needle's first position.
        needle: m, its length.
        query: the query copy's first position (t − m).
        depth: where in the haystack the needle sits (0: first, 1: last).
    """

    ids: torch.Tensor
    start: int
    needle: int
    query: int
    depth: float

    @property
    def rows(self) -> torch.Tensor:
        """(m − 1,) the query rows q … q + m − 2, each predicting the next needle token."""
        return torch.arange(self.query, self.query + self.needle - 1)

    @property
    def targets(self) -> torch.Tensor:
        """(m − 1,) the needle tokens n₁ … nₘ₋₁ those rows predict."""
        return self.ids[self.start + 1:self.start + self.needle]


def _whole(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def check_needle(model, *, length: int, needle: int, depth: float) -> int:
    """The haystack's length H = length − prefix − 2·needle; ArgumentError naming `length`,
    `needle` or `depth` when one is out of bounds or the model cannot take `length`."""
    if not _whole(needle) or not 2 <= needle <= 256:
        raise ArgumentError("needle", "{name} must be a whole number of tokens in 2–256 (one "
                            "token leaves nothing to copy), got {value!r}", value=needle)
    if not isinstance(depth, (int, float)) or isinstance(depth, bool) or not 0.0 <= depth <= 1.0:
        raise ArgumentError("depth", "{name} must be a fraction of the haystack in 0–1, got "
                            "{value!r}", value=depth)
    prefix = len(induction.prefix_ids(model))
    if not _whole(length) or not prefix + 2 * needle <= length <= MAX_LENGTH:
        raise ArgumentError("length", "{name} must be a whole number of tokens in {least}–{most} "
                            "(room for the prefix and the needle twice), got {value!r}",
                            value=length, least=prefix + 2 * needle, most=MAX_LENGTH)
    limit = induction.limit_of(model)
    if limit is not None and length > limit:
        raise ArgumentError("length", "{name} {value} is more tokens than {model} takes "
                            "({limit})", value=length, model=forward.model_name(model), limit=limit)
    return length - prefix - 2 * needle


def needle_input(model, *, length: int, depth: float, needle: int = DEFAULT_NEEDLE, seed: int = 0,
                 haystack: Sequence[int] | None = None) -> NeedleInput:
    """A needle input of `length` tokens (see the module docstring).

    The needle is `needle` distinct random ordinary tokens; the haystack is `haystack` (token
    ids, e.g. a text's: read cyclically from a seeded offset) or, when None, random ordinary
    tokens other than the needle's, so the needle's tokens occur only in the needle and its copy.

    Examples:
        >>> import qkv
        >>> x = needle_input(qkv.load("lm"), length=30, depth=0.5, needle=4)
        >>> x.ids.shape, x.start, x.query, bool((x.ids[x.start:x.start + 4] == x.ids[-4:]).all())
        (torch.Size([30]), 11, 26, True)
    """
    hay = check_needle(model, length=length, needle=needle, depth=depth)
    rng = random.Random(seed)
    ordinary = model.tokenizer.ordinary_ids()
    if len(ordinary) < needle + 1:
        raise ArgumentError("needle", "{name} {value} needs more distinct tokens than {model}'s "
                            "{n} ordinary ones", value=needle, model=forward.model_name(model),
                            n=len(ordinary))
    pin = rng.sample(ordinary, needle)
    if haystack is not None and len(haystack) > 0:
        offset = rng.randrange(len(haystack))
        fill = [int(haystack[(offset + i) % len(haystack)]) for i in range(hay)]
    else:
        others = sorted(set(ordinary) - set(pin))
        fill = [rng.choice(others) for _ in range(hay)]
    prefix = induction.prefix_ids(model)
    before = round(depth * hay)
    ids = prefix + fill[:before] + pin + fill[before:] + pin
    start = len(prefix) + before
    return NeedleInput(ids=torch.tensor(ids, dtype=torch.long), start=start, needle=needle,
                       query=len(ids) - needle, depth=float(depth))


@dataclass(frozen=True)
class NeedleReading:
    """What one needle input says about every head.

    Attributes:
        correct: (m − 1,) bool — the model predicted needle token n_{k+1} at step k.
        copied: (L, h, m − 1) bool — the head copy-pasted at step k (see the module docstring).
        needle_weight: (L, h) float64 — mean over the query rows of the weight on the needle.
        chance: (L,) float64 — uniform-top-key chance at each layer's mask.
    """

    correct: torch.Tensor
    copied: torch.Tensor
    needle_weight: torch.Tensor
    chance: torch.Tensor


def record(model, ids: torch.Tensor, keep: int) -> tuple[torch.Tensor, Document]:
    """(the last `keep` rows' logits (keep, V), the [`Document`][qkv.explain.long.document.Document]
    of `ids` (t,)): one forward that keeps each layer's q, k and log-sum-exp (O(N)), as `document`
    does for a text."""
    x = ids[None]  # (1, t)
    with torch.no_grad():
        out = model(x, torch.ones_like(x), trace_rows=LSE, logits_to_keep=keep)
        layers = [layer_record(layer.self_attn, tr.self_attn) for layer, tr in zip(model.layers, out.traces)]
    check_finite_record(model, layers)
    tokens = [model.tokenizer.id_to_token(int(i)) for i in ids]
    encoding = SimpleNamespace(ids=ids.tolist(), tokens=tokens)  # what a Document reads of one
    return out.logits[0, -keep:], Document(model, "", encoding, layers)


def _visible(doc: Document, layer: int, rows: torch.Tensor) -> torch.Tensor:
    """(r, N) bool: the keys layer `layer`'s mask lets each of `rows` see."""
    mask, n = doc.layers[layer].mask, len(doc)
    mod = mask.mask_mod
    if mod is None:  # every key takes part
        return torch.ones(len(rows), n, dtype=torch.bool)
    zero = torch.zeros((), dtype=torch.long)
    return mod.bind(n, n)(zero, zero, rows[:, None], torch.arange(n)[None]).expand(len(rows), n)


def read_needle(model, x: NeedleInput) -> NeedleReading:
    """Every head's copy-paste steps, needle attention and chance on one input (O(h · m · N)
    numbers a layer)."""
    rows, targets = x.rows, x.targets  # (r,), (r,)
    logits, doc = record(model, x.ids, x.needle)
    correct = logits[:-1].argmax(-1) == targets  # rows q … q+m−2 are the kept rows but the last
    span = slice(x.start, x.start + x.needle)
    in_needle = torch.zeros(len(x.ids), dtype=torch.bool)
    in_needle[span] = True
    holds = (x.ids[None, :] == targets[:, None]) & in_needle  # (r, N): needle positions holding n_k+1
    copied, weight, chance = [], [], []
    for layer in range(len(doc.layers)):
        w = doc.row_weights(layer, rows)  # (h, r, N)
        top = w.argmax(-1)  # (h, r)
        copied.append(holds.gather(1, top.T).T & correct)  # (h, r)
        weight.append(w[:, :, span].double().sum(-1).mean(-1))  # (h,)
        seen = _visible(doc, layer, rows)  # (r, N)
        chance.append(((holds & seen).sum(-1).double() / seen.sum(-1).clamp_min(1)).mean())
    return NeedleReading(correct=correct, copied=torch.stack(copied),
                         needle_weight=torch.stack(weight), chance=torch.stack(chance))


@dataclass(frozen=True)
class RetrievalScores:
    """Every head's retrieval score — what `retrieval_probe` returns.

    Attributes:
        model: the model's name.
        probe: `"retrieval"`.
        scores: (L, h) float64, the share of needle tokens each head copy-pasted.
        chance: the largest over layers of `chance_per_layer` (L,).
        accuracy: the share of needle tokens the model predicted.
        needle_weight: (L, h) mean attention of the query rows on the needle.
        samples: the inputs: how many (sample s at depth `depths[s]`).
        length: the inputs' length in tokens.
        needle: the needle's length m.
        depths: each sample's depth.
        seed: the first input's seed.
        haystack: `"random"` or `"text"`.
    """

    kind: ClassVar[str] = "retrieval-scores"  # its row in qkv.explain.kinds.KINDS

    model: str
    probe: str
    scores: torch.Tensor
    chance: float
    chance_per_layer: torch.Tensor
    accuracy: float
    needle_weight: torch.Tensor
    samples: int
    length: int
    needle: int
    depths: tuple[float, ...]
    seed: int
    haystack: str

    def ranked(self) -> list[tuple[int, int, float]]:
        """(layer, head, score), highest first (ties: more needle attention, then layer, head)."""
        return ranked(self.scores, self.needle_weight)

    def top(self, k: int) -> list[tuple[int, int]]:
        """The `k` best (layer, head) by `ranked`."""
        return [(l, h) for l, h, _ in self.ranked()[:k]]

    def to_dict(self) -> dict:
        return {"kind": self.kind, "model": self.model, "probe": self.probe, "chance": self.chance,
                "chance_per_layer": self.chance_per_layer.tolist(), "accuracy": self.accuracy,
                "samples": self.samples, "length": self.length, "needle": self.needle,
                "depths": list(self.depths), "seed": self.seed, "haystack": self.haystack,
                "heads": [{"layer": l, "head": h, "score": s,
                           "needle_weight": float(self.needle_weight[l, h])}
                          for l, h, s in self.ranked()]}


def default_length(model) -> int:
    """`DEFAULT_LENGTH`, or the model's limit when it takes fewer tokens."""
    limit = induction.limit_of(model)
    return DEFAULT_LENGTH if limit is None else min(DEFAULT_LENGTH, limit)


def check_decoder(model, role: str = "model") -> None:
    """ArgumentError unless `model` is a causal self-attention model with a next token."""
    caps = capabilities_of(model)
    if not (caps.self_attention and caps.causal and caps.next_token):
        raise ArgumentError(role, "retrieval needs a decoder that predicts the next token (a "
                            "needle is copied token by token); {model} is not one",
                            model=forward.model_name(model))


def check_samples(samples) -> None:
    if not _whole(samples) or not 1 <= samples <= MAX_SAMPLES:
        raise ArgumentError("samples", "{name} must be a whole number in 1–{most}, got {value!r}",
                            value=samples, most=MAX_SAMPLES)


def needle_inputs(model, *, samples: int = DEFAULT_SAMPLES, length: int | None = None,
                  needle: int = DEFAULT_NEEDLE, seed: int = 0,
                  haystack: Sequence[int] | None = None) -> list[NeedleInput]:
    """The probe's `samples` inputs, sample s with its needle at depth (s + ½)/samples and
    seed `seed + s` (the one definition `retrieval_probe`, the ablations and
    [`qkv.explain.causal.head_effects.head_effects`][qkv.explain.causal.head_effects.head_effects]
    read)."""
    check_samples(samples)
    length = default_length(model) if length is None else length
    return [needle_input(model, length=length, depth=(s + 0.5) / samples, needle=needle,
                         seed=seed + s, haystack=haystack) for s in range(samples)]


def retrieval_probe(model, *, samples: int = DEFAULT_SAMPLES, length: int | None = None,
                    needle: int = DEFAULT_NEEDLE, seed: int = 0,
                    haystack: Sequence[int] | None = None,
                    progress: Callable[[str, int, int], None] | None = None) -> RetrievalScores:
    """Score every head of a decoder by Wu et al.'s retrieval score (see the module docstring).

    Args:
        samples: inputs, sample s with its needle at depth (s + ½)/samples of the haystack.
        length: tokens per input (default `default_length`).
        needle: m.
        haystack: token ids to fill the haystack with (a text's); None: random tokens.
        progress: called as `progress("needles", done, samples)`.

    Raises:
        ArgumentError: not a decoder; sizes out of bounds (`check_needle`).
    """
    check_decoder(model)
    inputs = needle_inputs(model, samples=samples, length=length, needle=needle, seed=seed,
                           haystack=haystack)
    length, depths = len(inputs[0].ids), tuple(x.depth for x in inputs)
    readings = []
    for s, x in enumerate(inputs):
        readings.append(read_needle(model, x))
        if progress is not None:
            progress("needles", s + 1, samples)
    scores = torch.stack([r.copied.double().mean(-1) for r in readings]).mean(0)  # (L, h)
    chance = torch.stack([r.chance for r in readings]).mean(0)  # (L,)
    return RetrievalScores(
        model=forward.model_name(model), probe="retrieval", scores=scores,
        chance=float(chance.max()), chance_per_layer=chance,
        accuracy=float(torch.stack([r.correct.double().mean() for r in readings]).mean()),
        needle_weight=torch.stack([r.needle_weight for r in readings]).mean(0),
        samples=samples, length=length, needle=needle, depths=depths, seed=seed,
        haystack="random" if haystack is None else "text")


# -- ablation: do the retrieval heads matter? ------------------------------------------------------
@dataclass(frozen=True)
class RetrievalAblation:
    """Needle accuracy with the top-k retrieval heads ablated vs k random heads —
    what `retrieval_ablation` returns.

    Attributes:
        model: the model's name.
        k: how many heads are zeroed at once.
        heads: the top-k (layer, head) by the retrieval score.
        random: the k-head sets drawn from the other heads (one per trial).
        clean: the model's accuracy on the needle tokens.
        top_ablated: the accuracy with `heads` zeroed.
        random_ablated: (trials,) the accuracy with each random set zeroed.
        samples: the inputs (`needle_inputs`): how many.
        length: the inputs' length in tokens.
        needle: the needle's length m.
        seed: the first input's seed.
    """

    kind: ClassVar[str] = "retrieval-ablation"

    model: str
    k: int
    heads: tuple[tuple[int, int], ...]
    random: tuple[tuple[tuple[int, int], ...], ...]
    clean: float
    top_ablated: float
    random_ablated: torch.Tensor
    samples: int
    length: int
    needle: int
    seed: int

    def to_dict(self) -> dict:
        return {"kind": self.kind, "model": self.model, "k": self.k, "clean": self.clean,
                "heads": [list(h) for h in self.heads], "top_ablated": self.top_ablated,
                "random": [[list(h) for h in r] for r in self.random],
                "random_ablated": self.random_ablated.tolist(),
                "random_ablated_mean": float(self.random_ablated.mean()),
                "samples": self.samples, "length": self.length, "needle": self.needle,
                "seed": self.seed}


def needle_accuracy(model, inputs: list[NeedleInput], heads: Sequence[tuple[int, int]] = ()) -> float:
    """The share of needle tokens n₁ … nₘ₋₁ the model predicts (argmax) with `heads` zeroed
    (`Interventions`), over equally long `inputs`."""
    from qkv.modules.intervention import Interventions

    ids = torch.stack([x.ids for x in inputs])  # (b, t)
    m = inputs[0].needle
    edits = Interventions(heads={(int(l), int(h)): None for l, h in heads})
    with torch.no_grad():
        logits = model(ids, torch.ones_like(ids), interventions=edits, logits_to_keep=m).logits
    targets = torch.stack([x.targets for x in inputs])  # (b, m − 1)
    return float((logits[:, -m:-1].argmax(-1) == targets).double().mean())


def retrieval_ablation(model, *, k: int = 2, trials: int = 4, samples: int = DEFAULT_SAMPLES,
                       length: int | None = None, needle: int = DEFAULT_NEEDLE, seed: int = 0,
                       scores: RetrievalScores | None = None) -> RetrievalAblation:
    """Needle accuracy with the `k` best retrieval heads zeroed vs `trials` sets of `k`
    random other heads (Wu et al.'s Figure: masking retrieval heads breaks the needle test,
    masking random ones does not).

    `scores`: the ranking to take the top k from (default: `retrieval_probe` on the
    same inputs' settings). Raises ArgumentError: `k` not in 1 … heads − 1 (random sets are
    drawn from the heads outside the top k), or as `retrieval_probe`.

    Examples:
        >>> import qkv
        >>> a = retrieval_ablation(qkv.load("lm"), k=1, trials=2, samples=2)
        >>> len(a.heads), a.random_ablated.shape
        (1, torch.Size([2]))
    """
    check_decoder(model)
    L, H = forward.num_layers(model), forward.num_heads(model)
    if not _whole(k) or not 1 <= k < L * H:
        raise ArgumentError("k", "{name} must be a whole number of heads in 1–{most} (random sets "
                            "come from the others), got {value!r}", value=k, most=L * H - 1)
    if not _whole(trials) or not 1 <= trials <= 100:
        raise ArgumentError("trials", "{name} must be a whole number in 1–100, got {value!r}",
                            value=trials)
    inputs = needle_inputs(model, samples=samples, length=length, needle=needle, seed=seed)
    if scores is None:
        scores = retrieval_probe(model, samples=samples, length=len(inputs[0].ids), needle=needle,
                                 seed=seed)
    top = tuple(scores.top(k))
    others = [(l, h) for l in range(L) for h in range(H) if (l, h) not in top]
    rng = random.Random(seed)
    drawn = tuple(tuple(sorted(rng.sample(others, min(k, len(others))))) for _ in range(trials))
    return RetrievalAblation(
        model=forward.model_name(model), k=k, heads=top, random=drawn,
        clean=needle_accuracy(model, inputs), top_ablated=needle_accuracy(model, inputs, top),
        random_ablated=torch.tensor([needle_accuracy(model, inputs, r) for r in drawn],
                                    dtype=torch.float64),
        samples=samples, length=len(inputs[0].ids), needle=needle, seed=seed)


# -- the probe's record ------------------------------------------------------------------------------
def needle_task(model, *, sequences: int, length: int | None, seed: int) -> Task:
    """The retrieval probe's needle inputs (`needle_inputs`, `length` = tokens per input);
    scored: the query copy's predictions of the needle tokens n₁ … nₘ₋₁ (row q + k predicts
    n_{k+1}), predictable only by finding the needle earlier in the input."""
    inputs = needle_inputs(model, samples=sequences, length=length, seed=seed)
    t = len(inputs[0].ids)
    rows = inputs[0].rows  # (m − 1,) consecutive
    return Task(ids=[x.ids[None] for x in inputs], scored=scored_from(t, int(rows[0]), int(rows[-1]) + 1),
                length=t)


RETRIEVAL = Probe(
    name="retrieval", sequences="on needle-in-a-haystack inputs (decoders)",
    run=lambda model, *, method, progress: retrieval_probe(model, progress=progress),
    needs=Needs(("self_attention", "causal", "next_token"),
                "needs a decoder that predicts the next token (a needle is copied token by token)"),
    # no method scores a head on it (its score is the copy-paste count): faithfulness leaves it
    # out, and qkv heads --ablate shows that count beside each head's effect
    effects=Effects(task=needle_task, needs=induction.LOSS, compared=False,
                    scores=lambda model, method, task: retrieval_probe(model).scores,
                    metric="mean next-token loss on the needle's copy (its tokens after the first, "
                           "teacher-forced) in needle-in-a-haystack inputs"))

PROBES = (RETRIEVAL.name,)  # this file's probe

__all__ = ["RETRIEVAL", "RetrievalAblation", "needle_accuracy", "needle_inputs", "retrieval_ablation", "NeedleInput", "NeedleReading", "PROBES", "RetrievalScores", "check_needle",
           "needle_input", "read_needle", "record", "retrieval_probe"]
