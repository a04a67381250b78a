"""Needle in a haystack over depth × length: where a decoder finds a needle and where it loses it.

For every input length T and needle depth δ (0: the haystack's start, 1: its end) the inputs of
`qkv.explain.retrieval` — a random-token needle, copied again at the end — are read once
each (O(N) memory: the Document's record, never an N × N map) and give two numbers per cell:

```text
accuracy(δ, T)   the share of the needle's tokens n₁ … nₘ₋₁ the model predicts (argmax)
attention(δ, T)  the mean weight the retrieval heads' query rows put on the needle
```

The retrieval heads are the `top` heads by `retrieval_probe`'s
score at the probe's short default length (or the caller's `heads`). A sliding window shows as
the cells whose needle lies further back than the window: their attention is 0 in every
windowed layer, and the accuracy is what the layers' stacked windows can still reach.

Examples:
    >>> import qkv
    >>> m = needle_map(qkv.load("lm"), lengths=[32, 64], depths=[0.0, 1.0], top=1)
    >>> m.accuracy.shape, m.heads                                   # (depths, lengths)
    (torch.Size([2, 2]), ((1, 1),))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, ClassVar, Sequence

import torch

from qkv.errors import QkvError
from qkv.explain import forward
from qkv.explain.probes import saved
from qkv.explain.probes.retrieval import (DEFAULT_NEEDLE, check_decoder, check_needle, check_samples,
                                   needle_input, read_needle, retrieval_probe)
from qkv.explain.wording import ArgumentError

DEFAULT_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
MAX_CELLS = 400  # depths × lengths


@dataclass(frozen=True)
class NeedleMap:
    """Needle accuracy and the retrieval heads' attention on it, per depth and length — what
    `needle_map` returns.

    Attributes:
        model: the model's name.
        lengths: (n_len,) the grid's input lengths.
        depths: (n_depth,) the grid's needle depths.
        samples: inputs per cell (seeds `seed … seed + samples − 1`).
        needle: m, the needle's length.
        heads: the retrieval heads read.
        accuracy: (n_depth, n_len) float64.
        attention: (n_depth, n_len) float64, the mean over `heads` of their query rows' weight
            on the needle.
        haystack: `"random"` or `"text"`.
    """

    kind: ClassVar[str] = "needle-map"  # its row in qkv.explain.kinds.KINDS

    model: str
    lengths: tuple[int, ...]
    depths: tuple[float, ...]
    samples: int
    needle: int
    heads: tuple[tuple[int, int], ...]
    accuracy: torch.Tensor
    attention: torch.Tensor
    haystack: str
    seed: int

    def to_dict(self) -> dict:
        return {"kind": self.kind, "model": self.model, "lengths": list(self.lengths),
                "depths": list(self.depths), "samples": self.samples, "needle": self.needle,
                "heads": [list(h) for h in self.heads], "haystack": self.haystack, "seed": self.seed,
                "accuracy": self.accuracy.tolist(), "attention": self.attention.tolist()}

    @classmethod
    def from_dict(cls, d) -> NeedleMap:
        """The map a `to_dict()` describes (`qkv needle --json` read back), every field checked
        first: a `QkvError` naming the first one wrong and its value.

        Examples:
            >>> m = NeedleMap.from_dict({"kind": "needle-map", "model": "m", "lengths": [32, 64],
            ...     "depths": [0.5], "samples": 1, "needle": 8, "heads": [[1, 0]], "haystack": "random",
            ...     "seed": 0, "accuracy": [[1.0, 0.5]], "attention": [[0.25, 0.0]]})
            >>> m.accuracy.shape, m.heads
            (torch.Size([1, 2]), ((1, 0),))
        """
        where = "needle map"
        saved.kind(d, cls.kind)
        lengths = saved.items(d, "lengths", where, least=1)
        depths = saved.items(d, "depths", where, least=1)
        lengths = tuple(saved.whole({"lengths": n}, "lengths", f"{where} lengths[{k}]", least=2)
                        for k, n in enumerate(lengths))
        depths = tuple(saved.number(x, f"depths[{k}]", where, low=0, high=1) for k, x in enumerate(depths))

        def grid(name: str) -> torch.Tensor:
            rows = saved.items(d, name, where, least=len(depths))
            if len(rows) != len(depths):
                raise QkvError(f"{where}: {name} must have a row per depth ({len(depths)}), got {len(rows)}")
            for i, row in enumerate(rows):
                if not isinstance(row, list) or len(row) != len(lengths):
                    raise QkvError(f"{where}: {name}[{i}] must be a list of a number per length "
                                   f"({len(lengths)}), got {repr(row)[:saved.SHOWN]}")
            return torch.tensor([[saved.number(v, f"{name}[{i}][{j}]", where, low=0, high=1)
                                  for j, v in enumerate(row)] for i, row in enumerate(rows)],
                                dtype=torch.float64)

        heads = []
        for k, pair in enumerate(saved.items(d, "heads", where, least=1)):
            if not isinstance(pair, list) or len(pair) != 2 or not all(
                    isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in pair):
                raise QkvError(f"{where}: heads[{k}] must be [layer, head], two whole numbers, got "
                               f"{repr(pair)[:saved.SHOWN]}")
            heads.append((pair[0], pair[1]))
        haystack = saved.text(d, "haystack", where)
        if haystack not in ("random", "text"):
            raise QkvError(f"{where}: haystack must be 'random' or 'text', got {haystack[:saved.SHOWN]!r}")
        return cls(model=saved.text(d, "model", where), lengths=lengths, depths=depths,
                   samples=saved.whole(d, "samples", where, least=1),
                   needle=saved.whole(d, "needle", where, least=2), heads=tuple(heads),
                   accuracy=grid("accuracy"), attention=grid("attention"), haystack=haystack,
                   seed=saved.whole(d, "seed", where))


def _check_grid(model, lengths, depths, needle) -> None:
    for name, values in (("lengths", lengths), ("depths", depths)):
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
            raise ArgumentError(name, "{name} must be a non-empty list, got {value!r}", value=values)
    if len(lengths) * len(depths) > MAX_CELLS:
        raise ArgumentError("lengths", "{name} × depths is {n} cells; at most {most}",
                            n=len(lengths) * len(depths), most=MAX_CELLS)
    for length in lengths:
        check_needle(model, length=length, needle=needle, depth=0.5)
    for depth in depths:
        check_needle(model, length=lengths[0], needle=needle, depth=depth)


def needle_map(model, *, lengths: Sequence[int], depths: Sequence[float] = DEFAULT_DEPTHS,
               samples: int = 1, needle: int = DEFAULT_NEEDLE, top: int = 4,
               heads: Sequence[tuple[int, int]] | None = None, seed: int = 0,
               haystack: Sequence[int] | None = None,
               progress: Callable[[str, int, int], None] | None = None) -> NeedleMap:
    """Needle accuracy and retrieval-head attention over `depths` × `lengths` (module doc).

    Args:
        lengths: input lengths in tokens (each within the model's limit).
        depths: 0 … 1.
        samples: inputs per cell.
        needle: m.
        seed: the first input's seed.
        top, heads: the retrieval heads — `heads` as given, else the `top` best by
            `retrieval_probe` (at its default length).
        haystack: token ids to fill the haystack with (a text's); None: random tokens.
        progress: called as `progress("needles", done, cells × samples)`.

    Raises:
        ArgumentError: not a decoder; a length, depth, needle, sample count or head out of
            bounds — all checked before the first forward.
    """
    check_decoder(model)
    _check_grid(model, lengths, depths, needle)
    check_samples(samples)
    L, H = forward.num_layers(model), forward.num_heads(model)
    if heads is None:
        if isinstance(top, bool) or not isinstance(top, int) or not 1 <= top <= L * H:
            raise ArgumentError("top", "{name} must be a whole number of heads in 1–{most}, got "
                                "{value!r}", value=top, most=L * H)
        heads = retrieval_probe(model, needle=needle, seed=seed).top(top)
    heads = tuple((int(l), int(h)) for l, h in heads)
    for l, h in heads:
        forward.check_layer_head(model, l, h)
    if not heads:
        raise ArgumentError("heads", "{name} must name at least one (layer, head)")
    rows = torch.tensor([l for l, _ in heads]), torch.tensor([h for _, h in heads])
    accuracy = torch.zeros(len(depths), len(lengths), dtype=torch.float64)
    attention = torch.zeros_like(accuracy)
    total, done = len(depths) * len(lengths) * samples, 0
    for j, length in enumerate(lengths):
        for i, depth in enumerate(depths):
            for s in range(samples):
                x = needle_input(model, length=length, depth=depth, needle=needle, seed=seed + s,
                                 haystack=haystack)
                r = read_needle(model, x)
                accuracy[i, j] += r.correct.double().mean() / samples
                attention[i, j] += r.needle_weight[rows].mean() / samples
                done += 1
                if progress is not None:
                    progress("needles", done, total)
    return NeedleMap(model=forward.model_name(model), lengths=tuple(lengths),
                     depths=tuple(float(d) for d in depths), samples=samples, needle=needle,
                     heads=heads, accuracy=accuracy, attention=attention,
                     haystack="random" if haystack is None else "text", seed=seed)


__all__ = ["DEFAULT_DEPTHS", "NeedleMap", "needle_map"]
