"""A head atlas: every head's metrics over a corpus, with the contexts where its pattern is
strongest, at O(N) memory in the corpus length.

The corpus is tokenised once and read in windows of W tokens (the tokenizer's prefix, e.g.
`<bos>`, put first in each, so every window starts as a text does); each window is one recorded
forward (`qkv.explain.probes.retrieval.record`: q, k and the log-sum-exp of every layer) and then
forgotten — only per-head sums and each head's top contexts are kept. For a head with weights
w_ij inside a window (i, j window positions; R rows):

```text
induction       mean over the rows i whose token occurred before (last at p < i − 1) of
                w_{i, p+1} — attention to the token after the earlier occurrence
previous-token  mean over rows i ≥ 1 of w_{i, i−1}
entropy         mean over rows of −Σ_j w_ij log2 w_ij (bits)
sink, distance  :func:`qkv.explain.long.document_heads.head_spans` of each window (the share on
                the first token(s), the mean i − j), weighted by its rows
retrieval       :func:`qkv.explain.probes.retrieval.retrieval_probe`'s score, with the corpus's
                tokens as the haystack (a needle is not found in a corpus; it is put there)
```

A head's **top contexts** are the rows where its largest weight on a key past the sink (the
window's first `first` tokens) is largest: the query, the key it looks at, that weight, and the
text around both (from the tokenizer's offsets).

Cost: per window and layer the weights of every row, `rows_per_chunk` rows at a time —
O(L · N · W · d) time, O(h · rows_per_chunk · W) memory; nothing grows with N but the token ids.

Examples:
    >>> import qkv
    >>> a = atlas(qkv.load("lm"), "baka bela dima fona gisa " * 30, retrieval_samples=2)
    >>> sorted(a.metrics), a.metrics["entropy"].shape
    (['distance', 'entropy', 'induction', 'previous-token', 'retrieval', 'sink'], torch.Size([2, 2]))
"""

from __future__ import annotations

import heapq
import sys
from dataclasses import dataclass
from typing import Callable, ClassVar

import torch

from qkv.errors import QkvError
from qkv.explain import forward
from qkv.explain.probes import induction, saved
from qkv.explain.long.document_heads import head_spans
from qkv.explain.overview import entropy_bits
from qkv.explain.probes.retrieval import check_decoder, record, retrieval_probe
from qkv.explain.wording import ArgumentError

METRICS = ("induction", "previous-token", "retrieval", "sink", "distance", "entropy")
DEFAULT_WINDOW = 512  # tokens a window (or the model's limit, if fewer)
ROWS_PER_CHUNK = 128


@dataclass(frozen=True)
class Context:
    """One row where a head's pattern is strong: corpus positions `query` and `key`, the
    weight between them, and the text around each (`before` ends at the query token)."""

    query: int
    key: int
    weight: float
    before: str
    key_text: str

    def to_dict(self) -> dict:
        return {"query": self.query, "key": self.key, "weight": self.weight,
                "distance": self.query - self.key, "text": self.before, "key_text": self.key_text}

    @classmethod
    def from_dict(cls, d, where: str = "context") -> Context:
        """The context a `to_dict()` describes, checked (its `distance` must be query − key)."""
        query, key = saved.whole(d, "query", where), saved.whole(d, "key", where)
        if saved.get(d, "distance", where) != query - key:
            raise QkvError(f"{where}: distance must be query − key = {query - key}, got "
                           f"{repr(d['distance'])[:saved.SHOWN]}")
        return cls(query=query, key=key,
                   weight=saved.number(saved.get(d, "weight", where), "weight", where, low=0),
                   before=saved.text(d, "text", where), key_text=saved.text(d, "key_text", where))


@dataclass(frozen=True)
class Atlas:
    """Every head's metrics over a corpus — what `atlas` returns.

    Attributes:
        model: the model's name.
        tokens: N, the corpus's length.
        window: W, the window's length.
        windows: how many windows.
        first: the sink's tokens.
        metrics: {name: (L, h) float64} for each of `METRICS`.
        retrieval_chance: the retrieval probe's chance.
        contexts: [layer][head] → the head's top `Context`s, strongest first.
    """

    kind: ClassVar[str] = "atlas"  # its row in qkv.explain.kinds.KINDS

    model: str
    tokens: int
    window: int
    windows: int
    first: int
    metrics: dict[str, torch.Tensor]
    retrieval_chance: float
    contexts: list[list[list[Context]]]

    def to_dict(self) -> dict:
        L, H = self.metrics["entropy"].shape
        return {"kind": self.kind, "model": self.model, "tokens": self.tokens, "window": self.window,
                "windows": self.windows, "first": self.first, "metrics": list(METRICS),
                "retrieval_chance": self.retrieval_chance,
                "heads": [{"layer": l, "head": h,
                           **{name: float(self.metrics[name][l, h]) for name in METRICS},
                           "contexts": [c.to_dict() for c in self.contexts[l][h]]}
                          for l in range(L) for h in range(H)]}

    @classmethod
    def from_dict(cls, d) -> Atlas:
        """The atlas a `to_dict()` describes (`qkv atlas --json` read back), every field
        checked first: a `QkvError` naming the first one wrong and its value.

        Examples:
            >>> a = Atlas.from_dict({"kind": "atlas", "model": "m", "tokens": 9, "window": 9,
            ...     "windows": 1, "first": 1, "metrics": list(METRICS), "retrieval_chance": 0.1,
            ...     "heads": [{"layer": 0, "head": 0, "contexts": [], **dict.fromkeys(METRICS, 0.5)}]})
            >>> a.metrics["sink"].shape, a.to_dict()["heads"][0]["entropy"]
            (torch.Size([1, 1]), 0.5)
        """
        where = "atlas"
        saved.kind(d, cls.kind)
        if saved.get(d, "metrics", where) != list(METRICS):
            raise QkvError(f"atlas: metrics must be {', '.join(METRICS)} in that order, got "
                           f"{repr(d['metrics'])[:saved.SHOWN]}")
        heads = saved.items(d, "heads", where, least=1)
        cells = {}
        for n, head in enumerate(heads):
            at = f"atlas heads[{n}]"
            cell = (saved.whole(head, "layer", at), saved.whole(head, "head", at))
            if cell in cells:
                raise QkvError(f"{at}: layer {cell[0]} head {cell[1]} is listed twice")
            cells[cell] = head
        L, H = 1 + max(c[0] for c in cells), 1 + max(c[1] for c in cells)
        if len(cells) != L * H:
            missing = next((l, h) for l in range(L) for h in range(H) if (l, h) not in cells)
            raise QkvError(f"atlas: heads must list every head of {L} layers × {H} heads; layer "
                           f"{missing[0]} head {missing[1]} is missing")
        metrics = {name: torch.tensor([[saved.number(saved.get(cells[l, h], name, f"atlas layer {l} head {h}"),
                                                     name, f"atlas layer {l} head {h}")
                                        for h in range(H)] for l in range(L)], dtype=torch.float64)
                   for name in METRICS}
        return cls(model=saved.text(d, "model", where), tokens=saved.whole(d, "tokens", where, least=1),
                   window=saved.whole(d, "window", where, least=1),
                   windows=saved.whole(d, "windows", where, least=1),
                   first=saved.whole(d, "first", where, least=1),
                   metrics=metrics,
                   retrieval_chance=saved.number(saved.get(d, "retrieval_chance", where),
                                                 "retrieval_chance", where, low=0, high=1),
                   contexts=[[[Context.from_dict(c, f"atlas layer {l} head {h} contexts[{k}]")
                               for k, c in enumerate(saved.items(cells[l, h], "contexts", f"atlas layer {l} head {h}"))]
                              for h in range(H)] for l in range(L)])


def _whole(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _induction_keys(ids: torch.Tensor) -> torch.Tensor:
    """(n,) for each position i the position after the last earlier occurrence p < i − 1 of
    ids[i] (p + 1), or −1 when there is none."""
    out, last = torch.full((len(ids),), -1, dtype=torch.long), {}  # token → its last two positions
    for i, t in enumerate(ids.tolist()):
        seen = [p for p in last.get(t, ()) if p < i - 1]
        if seen:
            out[i] = seen[-1] + 1
        last[t] = (last.get(t, ()) + (i,))[-2:]
    return out


class _Sums:
    """Per-head running sums and each head's top contexts (a min-heap of `k`)."""

    def __init__(self, L: int, H: int, k: int):
        z = lambda: torch.zeros(L, H, dtype=torch.float64)  # noqa: E731
        self.ind, self.ind_n, self.prev, self.prev_n, self.ent = z(), z(), z(), z(), z()
        self.sink, self.dist, self.rows = z(), z(), z()
        self.k, self.top = k, [[[] for _ in range(H)] for _ in range(L)]

    def keep(self, layer: int, head: int, items) -> None:
        heap = self.top[layer][head]
        for item in items:
            if len(heap) < self.k:
                heapq.heappush(heap, item)
            elif item > heap[0]:
                heapq.heapreplace(heap, item)


def _read_window(model, ids: torch.Tensor, offset: int, prefix: int, first: int, sums: _Sums,
                 chunk: int) -> None:
    """Add one window's rows to `sums`; `offset`: the corpus position of its first text
    token (window position `prefix`)."""
    _, doc = record(model, ids, 1)
    spans = head_spans(doc, first=first)
    sums.sink += spans.sink * spans.rows
    sums.dist += spans.distance * spans.rows
    sums.rows += spans.rows
    n = len(ids)
    targets = _induction_keys(ids)
    for layer in range(len(doc.layers)):
        for start in range(0, n, chunk):
            rows = torch.arange(start, min(n, start + chunk))
            w = doc.row_weights(layer, rows).double()  # (h, r, n)
            sums.ent[layer] += entropy_bits(w).sum(-1)
            has_prev = rows >= 1
            prev = w[:, has_prev, rows[has_prev] - 1]  # (h, r')
            sums.prev[layer] += prev.sum(-1)
            sums.prev_n[layer] += int(has_prev.sum())
            t = targets[rows]
            seen = t >= 0
            sums.ind[layer] += w[:, seen.nonzero().flatten(), t[seen]].sum(-1)
            sums.ind_n[layer] += int(seen.sum())
            past = w[:, :, first:] if first < n else w[:, :, :0]
            if past.shape[-1] == 0:
                continue
            best, where = past.max(-1)  # (h, r)
            best[:, rows < prefix] = -1.0  # a prefix row is no context of the text
            for head in range(w.shape[0]):
                v, k = best[head].topk(min(sums.k, len(rows)))
                sums.keep(layer, head, [(float(x), int(rows[int(j)]) - prefix + offset,
                                         int(where[head, int(j)]) + first - prefix + offset)
                                        for x, j in zip(v, k) if x >= 0])


def _snippet(text: str, offsets, lo: int, hi: int) -> str:
    """The text of corpus tokens lo … hi − 1 (clipped), one line."""
    lo, hi = max(0, lo), min(len(offsets), hi)
    if lo >= hi:
        return ""
    return text[offsets[lo][0]:offsets[hi - 1][1]].replace("\n", " ")


def atlas(model, text: str, *, window: int | None = None, first: int = 1, contexts: int = 3,
          retrieval_samples: int = 8, rows_per_chunk: int = ROWS_PER_CHUNK,
          progress: Callable[[str, int, int], None] | None = None) -> Atlas:
    """Every head's metrics over `text` and its top `contexts` (see the module docstring).

    Args:
        window: tokens a window, prefix included (default `DEFAULT_WINDOW` or the model's
            limit).
        first: how many first tokens of a window count as the sink.
        retrieval_samples: inputs of the retrieval probe (its default length).
        progress: called as `progress("windows", done, total)`.

    Raises:
        ArgumentError: not a decoder; an empty text; window, first or contexts out of bounds.
    """
    check_decoder(model)
    forward.check_text(text)
    limit = induction.limit_of(model)
    prefix = induction.prefix_ids(model)
    most = limit if limit is not None else 1 << 17
    window = min(DEFAULT_WINDOW, most) if window is None else window
    if not _whole(window) or not len(prefix) + 2 <= window <= most:
        raise ArgumentError("window", "{name} must be a whole number of tokens in {least}–{most}, "
                            "got {value!r}", value=window, least=len(prefix) + 2, most=most)
    if not _whole(first) or not 1 <= first < window:
        raise ArgumentError("first", "{name} must be a whole number of tokens in 1–{most}, got "
                            "{value!r}", value=first, most=window - 1)
    if not _whole(contexts) or not 0 <= contexts <= 100:
        raise ArgumentError("contexts", "{name} must be a whole number in 0–100, got {value!r}",
                            value=contexts)
    enc = model.tokenizer.encode(text, max_length=sys.maxsize)
    keep = [i for i, s in enumerate(enc.special) if not s]  # the text's own tokens
    ids = torch.tensor([enc.ids[i] for i in keep], dtype=torch.long)  # (N,)
    offsets = [enc.offsets[i] for i in keep]
    n = len(ids)
    if n == 0:
        raise QkvError("the text has no tokens of its own (only the tokenizer's special ones)")
    L, H = forward.num_layers(model), forward.num_heads(model)
    sums = _Sums(L, H, contexts)
    step = window - len(prefix)
    starts = list(range(0, n, step))
    head = torch.tensor(prefix, dtype=torch.long)
    for w, start in enumerate(starts):
        chunk_ids = torch.cat([head, ids[start:start + step]])
        _read_window(model, chunk_ids, start, len(prefix), first, sums, rows_per_chunk)
        if progress is not None:
            progress("windows", w + 1, len(starts))
    probe = retrieval_probe(model, samples=retrieval_samples, haystack=ids.tolist())
    per = lambda total, count: total / count.clamp_min(1)  # noqa: E731
    metrics = {"induction": per(sums.ind, sums.ind_n), "previous-token": per(sums.prev, sums.prev_n),
               "retrieval": probe.scores, "sink": per(sums.sink, sums.rows),
               "distance": per(sums.dist, sums.rows), "entropy": per(sums.ent, sums.rows)}
    tops = [[[Context(query=q, key=k, weight=v, before=_snippet(text, offsets, q - 8, q + 1),
                      key_text=_snippet(text, offsets, k - 2, k + 3))
              for v, q, k in sorted(sums.top[l][h], reverse=True)]
             for h in range(H)] for l in range(L)]
    return Atlas(model=forward.model_name(model), tokens=n, window=window, windows=len(starts),
                 first=first, metrics=metrics, retrieval_chance=probe.chance, contexts=tops)


__all__ = ["Atlas", "Context", "METRICS", "atlas"]
