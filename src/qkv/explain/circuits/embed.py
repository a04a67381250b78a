"""What enters layer 0, by table: the token's row, the position's row, the segment's row.

A model embeds token i of ids as the sum of rows of its tables, normalised where it has an
embedding norm (BERT, DistilBERT):

```text
hidden_states[0]_i = norm( token[id_i] + position[offset + i] + type[0] )

embed.token      the token table's row (Gemma's scaled embedding: the module's own output)
embed.position   a learned position table's row (BERT, GPT-2, OPT); RoPE models have none
embed.type       the segment table's row (BERT's token types; one text reads row 0)
```

The norm is frozen at the scale the forward computed (`norms`): each row carried through
as (row − mean(row)) · γ/σ, β going to `bias`. The tables are the ones the model protocol
names (`model.parts.embeddings`, [`Embeddings`][qkv.models.protocol.Embeddings]). `split` checks
that the rows rebuild what entered layer 0; a model whose protocol names no tables (a projection
after them: ELECTRA's `embeddings_project`), or whose tables do not rebuild it, keeps one component,
`embed`: `hidden_states[0]` whole, still exact.

Examples:
    >>> import qkv, torch
    >>> minilm = qkv.load("minilm")
    >>> names(minilm)
    ('embed.token', 'embed.position', 'embed.type')
"""

from __future__ import annotations

import torch

from qkv.errors import QkvError
from qkv.explain.circuits.norms import linearise, rebuilds
from qkv.explain.circuits.parts import parts_of
from qkv.models.protocol import Embeddings

EMBED, TOKEN, POSITION, TYPE = "embed", "embed.token", "embed.position", "embed.type"

#: A component's name for each table the model protocol names (``model.parts.embeddings``).
TABLES = {"token": TOKEN, "position": POSITION, "type": TYPE}


def tables(model) -> Embeddings | None:
    """The model's embedding tables as its protocol names them (`model.parts.embeddings`),
    or None where it names none that rebuild layer 0's input."""
    return parts_of(model).embeddings


def names(model) -> tuple[str, ...]:
    """The embedding's components as the model's tables say: `embed.token` and, where the model
    has them, `embed.position` and `embed.type`; `("embed",)` where no table is found (a
    forward's own are `split`'s, `("embed",)` too where the tables do not rebuild it)."""
    found = tables(model)
    return (EMBED,) if found is None else tuple(TABLES[n] for n in found.tables)


def _rows(found: Embeddings, ids: torch.Tensor, positions: torch.Tensor, dtype) -> torch.Tensor:
    """(P, n, E) each table's rows for the tokens at `positions` (n,) of the text `ids` (t,),
    times the embedding's scale."""
    rows = found.rows(ids)
    scaled = (lambda r: r) if found.scale == 1 else (lambda r: r * found.scale)  # × 1: exact, skipped
    return torch.stack([scaled(r[positions].to(dtype)) for r in rows.values()])  # (P, n, E)


@torch.no_grad()
def split(model, ids: torch.Tensor, first: torch.Tensor, positions: torch.Tensor
          ) -> tuple[tuple[str, ...], torch.Tensor, torch.Tensor]:
    """Layer 0's input at `positions` (n,) by table: (names, parts (P, n, E) float64, bias
    (n, E) float64: the embedding norm's β, else 0), checked to sum to `first` (n, E), what the
    forward fed layer 0, for the text `ids` (t,); `(("embed",), first, 0)` where the tables
    are not found or do not rebuild it."""
    found = tables(model)
    bias = torch.zeros(first.shape, dtype=torch.float64, device=first.device)
    whole = lambda: ((EMBED,), first.double()[None], bias)  # noqa: E731
    if found is None:
        return whole()
    rows = _rows(found, ids, positions, first.dtype)  # (P, n, E') in the model's dtype
    if rows.shape[1:] != first.shape:  # E' ≠ E: the rows are projected (ELECTRA)
        return whole()
    parts, total = rows.double(), None  # total: the sum of the parts, bias included
    if found.norm is not None:  # BERT: the sum normalised, frozen at the forward's scale
        try:
            lin = linearise(found.norm, rows.sum(0))
        except QkvError:  # not a LayerNorm / RMSNorm qkv can freeze: the embedding stays whole
            return whole()
        parts, bias = lin.apply(parts), bias + lin.shift
        total = parts.sum(0) + bias
    # one table and no norm: its rows are the input exactly, or the check to rounding decides
    exact = total is None and len(rows) == 1 and torch.equal(rows[0], first)
    if not exact and not rebuilds(parts.sum(0) if total is None else total, first):  # no norm: bias 0
        return whole()
    return tuple(TABLES[n] for n in found.tables), parts, bias


__all__ = ["EMBED", "POSITION", "TABLES", "TOKEN", "TYPE", "names", "split", "tables"]
