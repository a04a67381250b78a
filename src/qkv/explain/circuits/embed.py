"""What enters layer 0, by table: the token's row, the position's row, the segment's row.

A model embeds token i of ids as the sum of rows of its tables, normalised where it has an
embedding norm (BERT, DistilBERT)::

    hidden_states[0]_i = norm( token[id_i] + position[offset + i] + type[0] )

    embed.token      the token table's row (Gemma's scaled embedding: the module's own output)
    embed.position   a learned position table's row (BERT, GPT-2, OPT); RoPE models have none
    embed.type       the segment table's row (BERT's token types; one text reads row 0)

The norm is frozen at the scale the forward computed (:mod:`.norms`): each row carried through
as (row − mean(row)) · γ/σ, β going to ``bias``. The tables are found by the names qkv's
families and transformers give them (:data:`TABLES`) among the children of the module that
holds the token table. :func:`split` checks that the rows rebuild what entered layer 0; a model
where no table is found, or whose tables do not rebuild it (a projection or a multiplier after
them: ELECTRA's ``embeddings_project``, Granite's ``embedding_multiplier``), keeps one component,
``embed``: ``hidden_states[0]`` whole, still exact.

Example:
    >>> import qkv, torch
    >>> minilm = qkv.load("minilm")
    >>> names(minilm)
    ('embed.token', 'embed.position', 'embed.type')
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from qkv.errors import QkvError
from qkv.explain.circuits.norms import linearise, rebuilds

EMBED, TOKEN, POSITION, TYPE = "embed", "embed.token", "embed.position", "embed.type"

#: Each table's module names (the last part of a qualified name) in qkv's families and in
#: transformers (BERT's ``word_embeddings``, GPT-2's ``wte``/``wpe``, OPT's ``embed_positions``).
TABLES = {TOKEN: ("word", "word_embeddings", "embed_tokens", "wte"),
          POSITION: ("position", "position_embeddings", "wpe", "embed_positions"),
          TYPE: ("token_type", "token_type_embeddings")}
#: The embedding norm's names, looked for only beside tables held apart from the layers.
NORMS = ("norm", "LayerNorm")


@dataclass(frozen=True)
class Tables:
    """Where a model keeps its embeddings: ``tables`` (name → module) in :data:`TABLES`' order,
    ``offset`` the position table's row for position 0, ``pad`` the padding id a transformers
    RoBERTa's positions skip (None: positions are 0 … t − 1), ``norm`` the embedding norm or
    None."""

    tables: dict[str, nn.Module]
    offset: int
    pad: int | None
    norm: nn.Module | None

    def position_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """(t,) the position table's row each token of ``ids`` (t,) reads: offset + its
        position; a transformers RoBERTa counts the tokens that are not padding from pad + 1
        (padding reads row pad)."""
        if self.pad is None:
            return self.offset + torch.arange(len(ids), device=ids.device)
        real = (ids != self.pad).long()  # (t,)
        return torch.cumsum(real, 0) * real + self.pad


def _position_rows(holder: nn.Module, table: nn.Module) -> tuple[int, int | None]:
    """(offset, pad) of :class:`Tables`: qkv's RoBERTa says its offset (``offset``), OPT's table
    says its own (``offset`` = 2), a transformers RoBERTa's table has a padding row."""
    for value in (getattr(holder, "offset", None), getattr(table, "offset", None)):
        if isinstance(value, int):
            return value, None
    pad = getattr(table, "padding_idx", None)
    return (0, pad) if isinstance(pad, int) else (0, None)


def tables(model) -> Tables | None:
    """The model's embedding tables, or None where no token table is found outside its layers."""
    inside = {id(m) for layer in model.layers for m in layer.modules()}
    for holder in model.modules():
        children = dict(holder.named_children())
        token = next((m for n, m in children.items() if n in TABLES[TOKEN]
                      and isinstance(m, nn.Embedding) and id(m) not in inside), None)
        if token is None:
            continue
        found = {TOKEN: token}
        for part in (POSITION, TYPE):
            for n, m in children.items():
                if n in TABLES[part]:
                    weight = getattr(m, "weight", None)
                    if not (isinstance(weight, torch.Tensor) and weight.ndim == 2):
                        return None  # a computed code (sinusoidal positions): no rows to read
                    found[part] = m
        holds_layers = any(id(m) in inside for m in holder.modules())
        norm = None if holds_layers else next(
            (m for n, m in children.items() if n in NORMS), None)
        offset, pad = _position_rows(holder, found[POSITION]) if POSITION in found else (0, None)
        return Tables(found, offset, pad, norm)
    return None


def names(model) -> tuple[str, ...]:
    """The embedding's components as the model's tables say: ``embed.token`` and, where the model
    has them, ``embed.position`` and ``embed.type``; ``("embed",)`` where no table is found (a
    forward's own are :func:`split`'s, ``("embed",)`` too where the tables do not rebuild it)."""
    found = tables(model)
    return (EMBED,) if found is None else tuple(found.tables)


def _rows(found: Tables, ids: torch.Tensor, positions: torch.Tensor, dtype) -> torch.Tensor:
    """(P, n, E) each table's rows for the tokens at ``positions`` (n,) of the text ``ids`` (t,)."""
    out = []
    for part, table in found.tables.items():
        if part == TOKEN:  # the module itself: a scaled embedding (Gemma) scales its rows
            rows = table(ids[positions])
        elif part == POSITION:
            rows = table.weight[found.position_rows(ids)[positions]]
        else:  # one text: every token is segment 0
            rows = table.weight[0].expand(len(positions), -1)
        out.append(rows.to(dtype))
    return torch.stack(out)  # (P, n, E)


@torch.no_grad()
def split(model, ids: torch.Tensor, first: torch.Tensor, positions: torch.Tensor
          ) -> tuple[tuple[str, ...], torch.Tensor, torch.Tensor]:
    """Layer 0's input at ``positions`` (n,) by table: (names, parts (P, n, E) float64, bias
    (n, E) float64: the embedding norm's β, else 0), checked to sum to ``first`` (n, E), what the
    forward fed layer 0, for the text ``ids`` (t,); ``(("embed",), first, 0)`` where the tables
    are not found or do not rebuild it."""
    found = tables(model)
    bias = torch.zeros(first.shape, dtype=torch.float64, device=first.device)
    whole = (EMBED,), first.double()[None], bias
    if found is None:
        return whole
    rows = _rows(found, ids, positions, first.dtype)  # (P, n, E') in the model's dtype
    if rows.shape[1:] != first.shape:  # E' ≠ E: the rows are projected (ELECTRA)
        return whole
    parts = rows.double()
    if found.norm is not None:  # BERT: the sum normalised, frozen at the forward's scale
        try:
            lin = linearise(found.norm, rows.sum(0))
        except QkvError:  # not a LayerNorm / RMSNorm qkv can freeze: the embedding stays whole
            return whole
        parts, bias = lin.apply(parts), bias + lin.shift
    if not rebuilds(parts.sum(0) + bias, first):
        return whole
    return tuple(found.tables), parts, bias


__all__ = ["EMBED", "NORMS", "POSITION", "TABLES", "TOKEN", "TYPE", "Tables", "names", "split",
           "tables"]
