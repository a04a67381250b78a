"""A long text explained across processes: a [`Document`][qkv.explain.long.document.Document] per
rank.

A model given a [`SequenceParallel`][qkv.distributed.SequenceParallel] (`sp.apply(model)`) runs one
forward over the text sharded across the ranks (ring attention, or Ulysses), with
`trace_rows=LSE`: on every rank each layer records its shard's queries and keys (RoPE at the
global positions) and its rows' *global* log-sum-exp, merged across the ranks by the ring. The
keys (and the value norms, for `norm`) are then gathered once per layer — O(L · h_kv · N · d)
on every rank, what a one-process Document holds; the queries stay sharded. Every question of a
[`Document`][qkv.explain.long.document.Document] is then answered from those, blockwise, exactly as
one process would:

```text
w_ij = exp(q_i · k_j · scale − lse_i)      (i a row of this rank, j any key)
```

Which answers are local and which are collective:

    question                                      on each rank                      talks to
    ───────────────────────────────────────────   ───────────────────────────────   ─────────
    weights(layer, head, rows), row_weights,      the rows of its shard (a row of   nobody
    explain(token) / scores (weight, norm)        another rank: QkvError naming it)
    received, block_map, top_received, through    the whole answer, = one process   all ranks
    (rollout), column, sinks                      (its rows' sums, all-reduced)

A collective answer is a sum over every query row; each rank sums its own rows and one
all-reduce (float64) adds them, so every rank gets the whole answer. Like any collective, every
rank must ask it, with the same arguments, in the same order (`explain(token, method="rollout")`
too: every rank the same token); a rank that does not comes back as a RuntimeError after the
group's timeout, never a hang.

Example (every rank, inside a process group):

```text
model = qkv.load("lm")
qkv.distributed.SequenceParallel(layout="zigzag").apply(model)
doc = sharded_document(model, book)
doc.received(3, 0)                          # (N,) on every rank: a collective
mine = doc.rows                             # (t_r,) the global token indices this rank holds
doc.weights(3, 0, mine[:2])                 # (2, N) local
```
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from qkv.attention.backends import repeat_kv
from qkv.attention.block_mask import BlockMask, block_mask_for, create_block_mask
from qkv.attention.blockwise import compute_dtype
from qkv.attention.received import BLOCK, attention_block_sums, attention_received
from qkv.attention.reference import reference_attention
from qkv.distributed.group import gather_rows, group_info
from qkv.distributed.shard import layout_ranges, shard, shard_positions, unshard
from qkv.errors import QkvError
from qkv.explain.long.document import (Document, LayerRecord, _gib, layer_record, TOKEN_BYTES, check_block,
                                  column_weights, encoded, forward_bytes, memory_allowed,
                                  row_index)
from qkv.explain.forward import model_name
from qkv.modules.lse_trace import LSE
from qkv.modules.multihead import MultiHeadAttention


@dataclass(frozen=True)
class Shard:
    """Where this rank's rows sit in the text.

    Attributes:
        group: the process group (None = the default group).
        rank: this rank.
        world: P, the number of ranks.
        layout: `"zigzag"` or `"contiguous"` (`qkv.distributed.shard`).
        length: N, the tokens of the whole text.
        runs: (local slice, global [start, end)) of each run of rows this rank holds, in order.
    """

    group: object
    rank: int
    world: int
    layout: str
    length: int
    runs: tuple[tuple[slice, tuple[int, int]], ...]

    @property
    def rows(self) -> torch.Tensor:
        """(t_r,) the global token index of each local row."""
        return torch.cat([torch.arange(a, b) for _, (a, b) in self.runs]) if self.runs else \
            torch.zeros(0, dtype=torch.long)

    def owner(self, token: int) -> int:
        """The rank that holds token `token`."""
        for r in range(self.world):
            if any(a <= token < b for a, b in layout_ranges(self.length, self.world, r, self.layout)):
                return r
        raise AssertionError(f"token {token} is in no shard of {self.length}")


def _runs(length: int, world: int, rank: int, layout: str) -> tuple:
    out, at = [], 0
    for a, b in layout_ranges(length, world, rank, layout):
        out.append((slice(at, at + b - a), (a, b)))
        at += b - a
    return tuple(out)


def _sum_over_ranks(x: torch.Tensor, shard: Shard, what: str) -> torch.Tensor:
    """Σ over the ranks of `x` (float64, every rank gets it); a timeout is a RuntimeError."""
    x = x.to(torch.float64).contiguous()
    try:
        dist.all_reduce(x, group=shard.group)
    except RuntimeError as e:  # gloo: "Timed out waiting ..." / a peer that went away
        raise RuntimeError(f"{what}: rank {shard.rank} got no answer from every rank within the "
                           f"group's timeout (a collective: did every rank ask {what}, in the same "
                           f"order?): {e}") from e
    return x


class ShardedDocument(Document):
    """One rank's [`Document`][qkv.explain.long.document.Document] of a text run sequence-parallel.

    Built by `sharded_document`. As a Document, plus `shard` (`Shard`). Each
    [`LayerRecord`][qkv.explain.long.document.LayerRecord] holds this rank's `query` (h, t_r, d) and
    `lse` (h, t_r) and every token's `key` (h_kv, N, d) and `value_norms` (h, N). Token
    indices (`rows`, `token`) are global. See the module doc for which answers are collective.
    """

    def __init__(self, model, text: str, encoding, layers: list[LayerRecord], shard: Shard):
        super().__init__(model, text, encoding, layers)
        self.shard = shard

    @property
    def rows(self) -> torch.Tensor:
        """(t_r,) the global token indices whose rows this rank holds."""
        return self.shard.rows

    # -- the mask: over the global N × N scores, and over one run of rows ------------------------
    def block_mask(self, layer: int) -> BlockMask:
        """Layer `layer`'s mask over the whole text, (N × N).

        The attention is square (t = s = N), where both alignments are one: the description is
        read top-left, the form that still means the same on a run of rows (a bottom-right band
        would be re-aligned to the run's own length).
        """
        rec = self.layers[layer]
        if id(rec.mask) not in self._masks:
            n = self.shard.length
            self._masks[id(rec.mask)] = block_mask_for(rec.mask.with_(alignment="top_left"), 1,
                                                       rec.query.shape[0], n, n, device=rec.query.device)
        return self._masks[id(rec.mask)]

    def _run_mask(self, layer: int, start: int, rows: int, block: int) -> BlockMask:
        """The mask of global rows start … start + rows − 1 against every key, in `block` tiles."""
        whole = self.block_mask(layer)
        return create_block_mask(whole.mask_mod, 1, self.layers[layer].query.shape[0], rows,
                                 self.shard.length, block, q_offset=start, device=whole.kinds.device)

    def _kw(self, layer: int) -> dict:
        rec = self.layers[layer]
        return dict(scale=rec.scale, enable_gqa=rec.enable_gqa)

    # -- rows of this rank ---------------------------------------------------------------------
    def _own(self, rows) -> tuple[torch.Tensor, torch.Tensor]:
        """(global rows, local rows) for token indices `rows`; QkvError naming the rank that
        holds a row this rank does not."""
        n = self.shard.length
        index = row_index(rows, n)
        local_of = torch.full((n,), -1, dtype=torch.long)
        local_of[self.rows] = torch.arange(len(self.rows))
        local = local_of[index]
        if bool((local < 0).any()):
            token = int(index[local < 0][0])
            raise QkvError(f"token {token}'s row is held by rank {self.shard.owner(token)}, not by rank "
                           f"{self.shard.rank} (it holds {[r for _, r in self.shard.runs]}): ask that "
                           f"rank's document")
        return index, local

    def _all_heads(self, layer: int, rows, head: int | None = None) -> torch.Tensor:
        """(h, r, N): every head's weights of `rows` ((1, r, N): head `head`'s) — the softmax of
        the row's own scores against every key, as the one-process Document (the reference path)."""
        rec = self.layers[layer]
        index, local = self._own(rows)
        keep = self.block_mask(layer).rows_mask(index, device=rec.query.device)  # (1, H', r, N)
        groups = rec.query.shape[0] // rec.key.shape[0]
        q = rec.query.index_select(1, local)[None]  # (1, h, r, d)
        k = repeat_kv(rec.key[None], groups)  # (1, h, N, d)
        scale = rec.scale if rec.scale is not None else 1.0 / math.sqrt(rec.query.shape[-1])
        # the output is not wanted: a one-wide value keeps it O(r · N)
        weights = reference_attention(q, k, k[..., :1], keep, scale=scale).weights[0]  # (h, r, N)
        return weights if head is None else weights[head:head + 1]

    # -- sums over every row: this rank's rows, then all ranks' --------------------------------
    def through(self, layer: int, v: torch.Tensor) -> torch.Tensor:
        """(h, r, N): v A^{ℓ,h} for row vectors v (r, N) over every query row — each rank applies
        its rows' part, one all-reduce adds them. A collective."""
        rec = self._check(layer)
        v = torch.as_tensor(v)
        if v.ndim != 2 or v.shape[-1] != self.shard.length:
            raise QkvError(f"v must be (r, N) with N = {self.shard.length}, got {tuple(v.shape)}")
        acc = torch.zeros(rec.query.shape[0], v.shape[0], self.shard.length, dtype=torch.float64)
        bs = self.block_mask(layer).block_size
        for rows, (a, b) in self.shard.runs:
            acc += attention_received(rec.query[None, :, rows], rec.key[None], rec.lse[None, :, rows],
                                      row_weights=v[:, a:b], block_mask=self._run_mask(layer, a, b - a, bs),
                                      **self._kw(layer))[0].double()
        return _sum_over_ranks(acc, self.shard, "through").to(compute_dtype(rec.query.dtype))

    def received(self, layer: int, head: int) -> torch.Tensor:
        """(N,): Σ_i w_ij over every query row of every rank (exact). A collective."""
        rec = self._check(layer, head)
        acc = torch.zeros(self.shard.length, dtype=torch.float64)
        bs = self.block_mask(layer).block_size
        for rows, (a, b) in self.shard.runs:
            acc += attention_received(rec.query[None, :, rows], rec.key[None], rec.lse[None, :, rows],
                                      heads=[head], block_mask=self._run_mask(layer, a, b - a, bs),
                                      **self._kw(layer))[0, 0].double()
        return _sum_over_ranks(acc, self.shard, "received").to(compute_dtype(rec.query.dtype))

    def block_map(self, layer: int, head: int, block: int = BLOCK) -> torch.Tensor:
        """(⌈N/block⌉, ⌈N/block⌉): every tile's sum over all ranks' rows (exact). A collective.

        A run of rows rarely starts on a tile's edge: it is widened to whole tiles with rows of
        lse = −inf (weight exp(−inf) = 0), so its tiles are the text's tiles.
        """
        rec = self._check(layer, head)
        check_block(block, self.shard.length)
        n, (h, _, d) = self.shard.length, rec.query.shape
        bs = self.block_mask(layer).block_size  # the sweep's, whatever the tile side
        nt = math.ceil(n / block)
        acc = torch.zeros(nt, nt, dtype=torch.float64)
        for rows, (a, b) in self.shard.runs:
            lo, hi = a // block * block, min(math.ceil(b / block) * block, n)  # whole tiles
            q = rec.query.new_zeros(1, h, hi - lo, d)  # (1, h, rows of whole tiles, d)
            q[0, :, a - lo:b - lo] = rec.query[:, rows]
            lse = rec.lse.new_full((1, h, hi - lo), float("-inf"))
            lse[0, :, a - lo:b - lo] = rec.lse[:, rows]
            tiles = attention_block_sums(q, rec.key[None], lse, heads=[head], block=block,
                                         block_mask=self._run_mask(layer, lo, hi - lo, bs),
                                         **self._kw(layer))[0, 0]  # (tiles of the run, nt)
            acc[lo // block:lo // block + tiles.shape[0]] += tiles.double()
        return _sum_over_ranks(acc, self.shard, "block_map").to(compute_dtype(rec.query.dtype))

    def column(self, layer: int, key: int) -> torch.Tensor:
        """(h, N): the weight every query row of every head puts on key `key`; this rank's rows
        computed, every rank's gathered. A collective."""
        rec = self._check(layer)
        mine = column_weights(rec, self.block_mask(layer), key, self.shard.length, self.rows)  # (h, t_r)
        return unshard(mine, self.shard.group, self.shard.layout, dim=-1)  # (h, N)


# -- building one ----------------------------------------------------------------------------------
def _strategy(model):
    """The one [`SequenceParallel`][qkv.distributed.SequenceParallel] every self-attention of `model`
has."""
    # only qkv's own MultiHeadAttention runs sequence-parallel (SequenceParallel.apply sets its
    # field); any other attention (a transformers model's) does not
    found = {layer.self_attn.sequence_parallel if isinstance(layer.self_attn, MultiHeadAttention) else None
             for layer in model.layers}
    if None in found or len(found) != 1:
        raise QkvError(f"{model_name(model)} does not run sequence-parallel in every layer: call "
                       f"qkv.distributed.SequenceParallel(...).apply(model) first (or use "
                       f"qkv.explain.long.document.document in one process)")
    return found.pop()


def estimate_bytes(model, n: int, world: int) -> int:
    """What `sharded_document` holds on one rank for `n` tokens over `world` ranks: the
    whole text's tokens (every rank tokenises it), its shard of the recorded forward, plus every
    layer's keys and value norms."""
    t = math.ceil(n / world) + 2  # shards differ by at most two tokens
    keys = 0
    for layer in model.layers:
        attn = layer.self_attn
        keys += n * (attn.num_kv_heads * attn.head_dim * attn.q_proj.weight.element_size()
                     + attn.num_heads * 4)
    return n * TOKEN_BYTES + forward_bytes(model, t) + keys


def sharded_document(model, text: str | bytes, *, memory_limit: int | None = None) -> ShardedDocument:
    """This rank's `ShardedDocument` of `text` (every rank of the model's group calls it
    with the same text; the model has a [`SequenceParallel`][qkv.distributed.SequenceParallel]
    applied).

    Every rank tokenizes the whole text, keeps its shard (the strategy's layout) and runs the
    forward at the global positions with `trace_rows=LSE`; then each layer's keys and value
    norms are gathered (one all-gather each).

    Raises:
        QkvError: as [`qkv.explain.long.document.document`][qkv.explain.long.document.document] (on
            every rank: every rank checks the same text), a model without a sequence-parallel
            strategy or without `position_ids`, NaN in some rank's attention (named on every rank).
        ValueError: from [`qkv.distributed`][qkv.distributed], for ranks that disagree (shapes,
            arguments).
        RuntimeError: a rank did not answer within the group's timeout.
    """
    sp = _strategy(model)
    rank, world = group_info(sp.group, what="sharded_document")
    have = memory_allowed(memory_limit)
    text, encoding = encoded(model, text, have=have)
    n = len(encoding.ids)
    need = estimate_bytes(model, n, world)
    if have is not None and need > have:
        raise QkvError(f"a document of {n} tokens over {world} ranks needs about {_gib(need)} on each "
                       f"for {model_name(model)} but {_gib(have)} is available; give a shorter text "
                       f"or more ranks")
    params = inspect.signature(model.forward).parameters
    if "position_ids" not in params:
        raise QkvError(f"{model_name(model)} takes no position_ids: its shards cannot be told their "
                       f"global positions")
    ids = shard(torch.tensor([encoding.ids], dtype=torch.long), sp.group, sp.layout, dim=1)  # (1, t_r)
    positions = shard_positions(n, sp.group, sp.layout)[None]  # (1, t_r) global positions
    kwargs = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
    with torch.no_grad():
        out = model(ids, position_ids=positions, trace_rows=LSE, **kwargs)
        layers = [_gathered(layer_record(layer.self_attn, tr.self_attn), sp)
                  for layer, tr in zip(model.layers, out.traces)]
    _check_finite(model, layers, sp.group)
    return ShardedDocument(model, text, encoding, layers,
                           Shard(sp.group, rank, world, sp.layout, n, _runs(n, world, rank, sp.layout)))


def _gathered(rec: LayerRecord, sp) -> LayerRecord:
    """`rec` with every token's keys (h_kv, N, d) and value norms (h, N), its rows kept local."""
    return dataclasses.replace(rec, key=unshard(rec.key, sp.group, sp.layout, dim=-2),
                               value_norms=unshard(rec.value_norms, sp.group, sp.layout, dim=-1))


def _check_finite(model, layers: list[LayerRecord], group) -> None:
    """QkvError on every rank naming the first rank, layer and head whose lse is NaN."""
    first = [-1, -1]
    for i, rec in enumerate(layers):
        bad = torch.isnan(rec.lse).any(-1)  # (h,)
        if bool(bad.any()):
            first = [i, int(bad.nonzero()[0])]
            break
    for r, (layer, head) in enumerate(gather_rows(first, group, what="sharded_document")):
        if layer >= 0:
            raise QkvError(f"layer {layer}, head {head} of {model_name(model)} (rank {r}'s rows): the "
                           f"attention is NaN (the model computes NaN on this text)")


__all__ = ["Shard", "ShardedDocument", "estimate_bytes", "sharded_document"]
