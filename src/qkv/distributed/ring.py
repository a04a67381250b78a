"""Ring attention: each rank keeps its queries; key/value shards travel round the ring.

P ranks, each holding a shard of one sequence (see `qkv.distributed.shard`):

```text
step 0          step 1          …   step P−1
rank r: K/V_r   rank r: K/V_r−1     rank r: K/V_r+1       (indices mod P)
     ──send K/V to r+1, receive from r−1──►
```

At every step the next shard is already on its way (`batch_isend_irecv` posted *before* this
step's compute, into a second buffer: double buffering), so communication hides behind compute
when a chunk's compute takes longer than its transfer. Each step's partial result is merged into
the running one with the log-sum-exp (`qkv.distributed.merge`, fp32); pairs of chunks the
mask leaves empty are skipped (`qkv.distributed.plan`). P − 1 messages (K and V) per rank.

**Backward** (FlashAttention-2's, per chunk, from the saved global log-sum-exp): K/V go round
again, and with them two accumulators dK, dV: at each step a rank adds its queries' share of the
gradient of the K/V it holds and passes the sum on; after P steps the accumulators are back at
the rank that owns those keys. The accumulator of step i travels while step i + 1 computes.

Example (every rank, inside a process group):

```text
q, k, v = (qkv.distributed.shard(x, layout="zigzag") for x in (Q, K, V))  # (b, h, t_r, d)
out = qkv.distributed.ring_attention(q, k, v, is_causal=True)             # (b, h, t_r, d)
# == qkv.distributed.shard(qkv.scaled_dot_product_attention(Q, K, V, is_causal=True))
```
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from qkv.attention.blockwise import backward_chunk, compute_dtype, forward_chunk
from qkv.attention.flash_cpu import any_nan
from qkv.distributed.checks import Agreed, agree
from qkv.distributed.chunk import chunk_backward, chunk_forward
from qkv.distributed.merge import merge_into
from qkv.distributed.plan import CAUSAL, EMPTY, PARTIAL, GlobalMask, mask_mod_of

# message tags: one per role, so K, V and the gradient accumulators never match each other
_TAG_K, _TAG_V, _TAG_DK, _TAG_DV = 1, 2, 3, 4


@dataclass
class _Ring:
    """Everything the forward and backward share: who is where, the mask, the scale."""

    agreed: Agreed
    mask: GlobalMask
    groups: int  # GQA: query heads per key/value head

    @property
    def next(self) -> int:
        return (self.agreed.rank + 1) % self.agreed.world

    @property
    def prev(self) -> int:
        return (self.agreed.rank - 1) % self.agreed.world

    def owner(self, step: int) -> int:
        """The rank whose K/V this rank holds at `step`."""
        return (self.agreed.rank - step) % self.agreed.world

    def segments(self, rank: int) -> list[tuple[slice, tuple[int, int]]]:
        """(local rows, global [start, end)) of each run of `rank`'s shard."""
        out, at = [], 0
        for s, e in self.agreed.ranges[rank]:
            out.append((slice(at, at + e - s), (s, e)))
            at += e - s
        return out

    def length(self, rank: int) -> int:
        return sum(e - s for s, e in self.agreed.ranges[rank])

    def exchange(self, sends: list[torch.Tensor], recvs: list[torch.Tensor], tags: tuple[int, ...]):
        """Post sends to the next rank and receives from the previous one; return the requests.

        Empty tensors (a shard of no tokens: t = 0 on a rank) are not sent: both ends know every
        rank's length, so the receiver posts no receive for them either, on any backend."""
        group = self.agreed.group
        ops = [dist.P2POp(dist.isend, t.contiguous(), group=group, tag=tag, group_peer=self.next)
               for t, tag in zip(sends, tags) if t.numel()]
        ops += [dist.P2POp(dist.irecv, t, group=group, tag=tag, group_peer=self.prev)
                for t, tag in zip(recvs, tags) if t.numel()]
        return dist.batch_isend_irecv(ops) if ops else []

    def pairs(self, step: int):
        """(query rows, key rows, kind, query start, key start) of every non-empty pair of runs
        at `step` (starts are global positions)."""
        for q_rows, q_range in self.segments(self.agreed.rank):
            for k_rows, k_range in self.segments(self.owner(step)):
                kind = self.mask.pair(q_range, k_range)
                if kind != EMPTY:
                    yield q_rows, k_rows, kind, q_range[0], k_range[0]

    def attend(self, q, k, v, kind: str, q_start: int, k_start: int, nan_keys=None):
        """(out, lse) of one pair: torch's flash kernel for full and diagonal chunks, the
        blockwise kernel (mask in global positions) for partial ones. `nan_keys` (B, h, s) or
        None: the pair's keys holding a NaN (the blockwise kernel keeps NaN itself)."""
        if kind == PARTIAL:
            return forward_chunk(q, k, v, mask_mod=self.mask, q_offset=q_start, k_offset=k_start,
                                 scale=self.agreed.scale)
        return chunk_forward(q, k, v, scale=self.agreed.scale, causal=kind == CAUSAL,
                             nan_keys=nan_keys)

    def attend_backward(self, dout, q, k, v, out, lse, kind: str, q_start: int, k_start: int):
        """(dq, dk, dv) of one pair from the merged `out`/`lse` of its query rows."""
        if kind == PARTIAL:
            return backward_chunk(q, k, v, out, dout, lse, mask_mod=self.mask, q_offset=q_start,
                                  k_offset=k_start, scale=self.agreed.scale)
        return chunk_backward(dout, q, k, v, out, lse, scale=self.agreed.scale, causal=kind == CAUSAL)


def _wait(requests, what: str) -> None:
    try:
        for r in requests:
            r.wait()
    except RuntimeError as e:
        raise RuntimeError(f"{what}: a neighbour in the ring did not answer within the group's "
                           f"timeout: {e}") from e


def _expand(x: torch.Tensor, groups: int) -> torch.Tensor:
    """(B, h_kv, s, d) → (B, h_kv·groups, s, d): query head i reads key/value head i // groups."""
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


def _reduce(dx: torch.Tensor, groups: int) -> torch.Tensor:
    """(B, h, s, d) → (B, h / groups, s, d): the gradient of a shared key/value head is the sum."""
    if groups == 1:
        return dx
    b, h, s, d = dx.shape
    return dx.view(b, h // groups, groups, s, d).sum(2)


def _forward(q, k, v, ring: _Ring):
    """q (B, h, t, d), k/v (B, h_kv, t, d·) → out (B, h, t, dv) in q's dtype, lse (B, h, t) fp32+."""
    acc = compute_dtype(q.dtype)
    out = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=acc, device=q.device)  # (B, h, t, dv)
    lse = torch.full(q.shape[:-1], float("-inf"), dtype=acc, device=q.device)  # (B, h, t)
    world, cur = ring.agreed.world, (k, v)
    for step in range(world):
        pending, nxt = (), None
        if step < world - 1:  # the next shard starts travelling before this one is computed
            n = ring.length(ring.owner(step + 1))
            nxt = tuple(x.new_empty(*x.shape[:-2], n, x.shape[-1]) for x in cur)
            pending = ring.exchange(list(cur), list(nxt), (_TAG_K, _TAG_V))
        kc, vc = (_expand(x, ring.groups) for x in cur)  # (B, h, s_owner, d·)
        nan_keys = kc.isnan().any(-1) if any_nan(cur[0]) else None  # (B, h, s_owner); one check a step
        for q_rows, k_rows, kind, q_start, k_start in ring.pairs(step):
            part, part_lse = ring.attend(q[:, :, q_rows], kc[:, :, k_rows], vc[:, :, k_rows], kind,
                                         q_start, k_start,
                                         None if nan_keys is None else nan_keys[:, :, k_rows])
            merge_into(out, lse, part, part_lse, q_rows)
        _wait(pending, "ring_attention")
        cur = nxt if nxt is not None else cur
    _nan_rows(q, out, lse)
    return out.to(q.dtype), lse


def _nan_rows(q: torch.Tensor, out: torch.Tensor, lse: torch.Tensor) -> None:
    """NaN in → NaN out: a query row holding a NaN gets a NaN output row and lse, as on every
    backend — torch's CPU kernel gives such a row zeros, and the merge would keep them."""
    bad = q.isnan().any(-1)  # (B, h, t)
    if bool(bad.any()):
        out.masked_fill_(bad.unsqueeze(-1), float("nan"))
        lse.masked_fill_(bad, float("nan"))


def _backward(dout, q, k, v, out, lse, ring: _Ring):
    """The ring backward (see the module doc): (dq, dk, dv) for this rank's shard."""
    world, groups = ring.agreed.world, ring.groups
    acc = compute_dtype(q.dtype)
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)  # (B, h, t, d)
    cur, incoming, pending_grad = (k, v), None, ()
    for step in range(world):
        pending_kv, nxt = (), None
        if step < world - 1:
            n = ring.length(ring.owner(step + 1))
            nxt = tuple(x.new_empty(*x.shape[:-2], n, x.shape[-1]) for x in cur)
            pending_kv = ring.exchange(list(cur), list(nxt), (_TAG_K, _TAG_V))
        kc, vc = (_expand(x, groups) for x in cur)  # (B, h, s_owner, d·)
        dk = torch.zeros(kc.shape, dtype=acc, device=q.device)  # this step's share, (B, h, s, d)
        dv = torch.zeros(vc.shape, dtype=acc, device=q.device)
        for q_rows, k_rows, kind, q_start, k_start in ring.pairs(step):
            g = ring.attend_backward(dout[:, :, q_rows], q[:, :, q_rows], kc[:, :, k_rows],
                                     vc[:, :, k_rows], out[:, :, q_rows], lse[:, :, q_rows], kind,
                                     q_start, k_start)
            dq[:, :, q_rows] += g[0]
            dk[:, :, k_rows] += g[1]
            dv[:, :, k_rows] += g[2]
        dk, dv = _reduce(dk, groups), _reduce(dv, groups)  # (B, h_kv, s, d·)
        _wait(pending_grad, "ring_attention (backward)")  # the accumulators of these keys, so far
        if incoming is not None:
            dk, dv = dk + incoming[0], dv + incoming[1]
        n = ring.length(ring.owner(step + 1))  # after the last step: this rank's own keys
        incoming = (dk.new_empty(*dk.shape[:-2], n, dk.shape[-1]),
                    dv.new_empty(*dv.shape[:-2], n, dv.shape[-1]))
        if world > 1:  # pass the sums on; after the last step they reach the keys' owner
            pending_grad = ring.exchange([dk, dv], list(incoming), (_TAG_DK, _TAG_DV))
        else:
            incoming = (dk, dv)
        _wait(pending_kv, "ring_attention (backward)")
        cur = nxt if nxt is not None else cur
    _wait(pending_grad, "ring_attention (backward)")
    return dq.to(q.dtype), incoming[0].to(k.dtype), incoming[1].to(v.dtype)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, ring):
        out, lse = _forward(q, k, v, ring)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.ring = ring
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse = ctx.saved_tensors
        return (*_backward(dout, q, k, v, out, lse, ctx.ring), None)


def ring_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *, group=None,
                   is_causal: bool = False, block_mask=None,
                   window: tuple[int | None, int | None] | None = None, scale: float | None = None,
                   enable_gqa: bool = False, layout: str = "zigzag", return_lse: bool = False):
    """Exact attention over a sequence sharded across `group`; this rank's queries' results.

    Every rank of `group` calls it with its shard (from `shard` with
    the same `layout`). Masks are over *global* positions.

    Args:
        query: (..., h, t_r, d) this rank's queries. key, value: (..., h_kv, t_r, d / dv).
        group: the process group (None = the default group).
        is_causal: query i attends keys j ≤ i (global positions).
        block_mask: FlexAttention-style mask over the global sequence: a block mask with a
            `mask_mod`, or a `mask_mod(b, h, q_idx, kv_idx) -> bool` itself (documents, …).
        window: (left, right): keys i − left … i + right (None = unbounded on that side).
        scale: multiplies q·kᵀ (default 1/√d). enable_gqa: h a multiple of h_kv.
        layout: how the sequence was sharded: `"zigzag"` or `"contiguous"`.
        return_lse: also return the log-sum-exp (..., h, t_r), float32 (float64 for float64
            inputs), −inf for a query with no key.

    Returns:
        out (..., h, t_r, dv), or (out, lse) with `return_lse`. Differentiable in q, k, v.

    Raises:
        ValueError: on every rank, for an uninitialised group and for shards or arguments that
            disagree between ranks (see `qkv.distributed.checks.agree`).
        RuntimeError: a rank did not answer within the group's timeout.
    """
    agreed = agree(query, key, value, group=group, layout=layout, is_causal=is_causal,
                   window=window, scale=scale, enable_gqa=enable_gqa,
                   has_block_mask=block_mask is not None, what="ring_attention")
    mask = GlobalMask(causal=bool(is_causal), window=tuple(window) if window is not None else None,
                      mask_mod=mask_mod_of(block_mask, agreed.length))
    lead, (h, t, d), (hkv, _, dv) = query.shape[:-3], query.shape[-3:], value.shape[-3:]
    ring = _Ring(agreed, mask, groups=h // hkv)
    b = math.prod(lead)  # explicit, not -1: a rank may hold no tokens (t = 0), and reshape(-1) fails
    q = query.reshape(b, h, t, d)  # (B, h, t, d), B = the flattened batch dims
    k = key.reshape(b, hkv, t, d)  # (B, h_kv, t, d)
    v = value.reshape(b, hkv, t, dv)  # (B, h_kv, t, dv)
    out, lse = _RingAttention.apply(q, k, v, ring)
    out = out.reshape(*lead, h, t, dv)  # (..., h, t, dv)
    return (out, lse.reshape(*lead, h, t)) if return_lse else out
