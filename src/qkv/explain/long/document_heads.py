"""Sinks and spans: where every head of a model looks over a whole document, at O(N).

For one head with weights w_ij over a document of N tokens (the R rows i that see at least one
key; every row of a decoder or an encoder does):

```text
sink share     S = (1/R) Σ_i Σ_{j < first} w_ij     the share of attention parked on the first
                                                     token(s) — the attention sink (Xiao et
                                                     al., 2023): ~1 for a head with nothing
                                                     to do, ~first/(i+1) if uniform
mean distance  D = (1/R) Σ_i Σ_j w_ij (i − j)       how far back the head looks, in tokens
                                                     (negative: it looks ahead, in an encoder)
```

Both come from the document's record ([`Document`][qkv.explain.long.document.Document]: each layer's
q, k and lse), never from an N × N matrix: per layer one blockwise sweep
(`qkv.attention.received.attention_received`) multiplies the row vectors 1 and i into the
attention matrix, giving every key's C_j = Σ_i w_ij and P_j = Σ_i i · w_ij, and then:

```text
S = Σ_{j < first} C_j / R          D = Σ_j (P_j − j · C_j) / R
```

The sweep runs in float64: P_j and j · C_j are both about j · C_j (up to N) and their difference
is a few tokens, so float32 would keep only ~7 − log10(N) of its digits.

Examples:
    >>> import qkv
    >>> from qkv.explain.long.document import document
    >>> doc = document(qkv.load("lm"), "baka bela dima fona " * 8)
    >>> spans = head_spans(doc)
    >>> spans.sink.shape, spans.distance.shape                  # (layers, heads)
    (torch.Size([2, 2]), torch.Size([2, 2]))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from qkv.attention.received import attention_received
from qkv.errors import QkvError
from qkv.explain.long.document import Document
from qkv.explain.forward import model_name
from qkv.explain.wording import ArgumentError

METRICS = ("sink", "distance")


@dataclass(frozen=True)
class HeadSpans:
    """Every head's sink share and mean attention distance over one document.

    Attributes:
        model: the model's name.
        tokens: N.
        first: how many first tokens count as the sink.
        sink: (layers, heads) float64, S above. distance: (layers, heads) float64, D above.
        rows: (layers, heads) how many rows see some key (R).
    """

    kind: ClassVar[str] = "head-spans"

    model: str
    tokens: int
    first: int
    sink: torch.Tensor
    distance: torch.Tensor
    rows: torch.Tensor

    def ranked(self, metric: str = "sink") -> list[tuple[int, int, float]]:
        """(layer, head, value) for `metric` (`"sink"` or `"distance"`), largest first."""
        if metric not in METRICS:
            raise QkvError(f"metric must be one of {', '.join(METRICS)}, got {metric!r}")
        values = {"sink": self.sink, "distance": self.distance}[metric]
        L, H = values.shape
        return sorted(((layer, head, float(values[layer, head])) for layer in range(L) for head in range(H)),
                      key=lambda c: (-c[2], c[0], c[1]))

    def to_dict(self) -> dict:
        L, H = self.sink.shape
        return {"kind": self.kind, "model": self.model, "tokens": self.tokens, "first": self.first,
                "heads": [{"layer": layer, "head": head, "sink": float(self.sink[layer, head]),
                           "distance": float(self.distance[layer, head]),
                           "rows": int(self.rows[layer, head])}
                          for layer in range(L) for head in range(H)]}


def head_spans(doc: Document, *, first: int = 1) -> HeadSpans:
    """Every head's sink share (on the first `first` tokens) and mean attention distance.

    Cost: per layer one sweep over the tiles the mask keeps (a window's band, a causal triangle),
    in float64; memory O(h · N).

    Raises:
        ArgumentError: `first` is not a whole number in 1 … N.
    """
    n = len(doc)
    if isinstance(first, bool) or not isinstance(first, int) or not 1 <= first <= n:
        raise ArgumentError("first", "{name} must be a whole number of tokens in 1–{n}, got {value!r}",
                            value=first, n=n)
    i = torch.arange(n, dtype=torch.float64)
    rows_vectors = torch.stack([torch.ones(n, dtype=torch.float64), i])  # (2, N): 1 and i
    sinks, distances, counts = [], [], []
    for layer, rec in enumerate(doc.layers):
        sums = attention_received(rec.query.double()[None], rec.key.double()[None],
                                  rec.lse.double()[None], row_weights=rows_vectors,
                                  block_mask=doc.block_mask(layer), scale=rec.scale,
                                  enable_gqa=rec.enable_gqa)[0]  # (h, 2, N)
        received, weighted = sums[:, 0], sums[:, 1]  # (h, N): C_j, P_j
        rows = (~torch.isneginf(rec.lse)).sum(-1).double()  # (h,): R
        sinks.append(received[:, :first].sum(-1) / rows)
        distances.append((weighted - i * received).sum(-1) / rows)
        counts.append(rows)
    return HeadSpans(model=model_name(doc.model), tokens=n, first=first, sink=torch.stack(sinks),
                     distance=torch.stack(distances), rows=torch.stack(counts).long())
