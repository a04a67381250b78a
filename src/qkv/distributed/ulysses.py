"""DeepSpeed-Ulysses (Jacobs et al., 2023): trade sequence shards for head shards and back.

```text
before: rank r holds all h heads of its t_r tokens        (b, h, t_r, d)
  all-to-all ─► rank r holds h/P heads of all N tokens     (b, h/P, N, d)
local attention over the whole sequence, any mask
  all-to-all ─► back to all heads of its own tokens       (b, h, t_r, d)
```

Two all-to-alls of q, k, v and one of the output per call (each moves (P−1)/P of a rank's
shard), against ring attention's P − 1 transfers of K/V: Ulysses sends less when P is large, but
needs the head count divisible by P (key/value heads too; GQA key/value heads that do not divide
are repeated up to the query heads first). The all-to-all is linear, so its backward is the
reverse all-to-all; the local attention is differentiated by autograd.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from qkv.attention import create_block_mask, scaled_dot_product_attention
from qkv.distributed.checks import Agreed, agree
from qkv.distributed.plan import CAUSAL, EMPTY, PARTIAL, GlobalMask, mask_mod_of


def _all_to_all(x: torch.Tensor, agreed: Agreed, *, to_heads: bool) -> torch.Tensor:
    """(B, h, t_r, d) → (B, h/P, N, d) in global order (`to_heads`), or the reverse."""
    world, rank = agreed.world, agreed.rank
    lengths = [sum(e - s for s, e in r) for r in agreed.ranges]
    order = torch.cat([torch.arange(s, e) for r in agreed.ranges for s, e in r])  # shard order → global
    if to_heads:
        b, h, t, d = x.shape
        pieces = x.reshape(b, world, h // world, t, d).transpose(0, 1)  # (P, B, h/P, t_r, d)
        send = pieces.contiguous().view(-1)
        recv = x.new_empty(sum(b * (h // world) * n * d for n in lengths))
        _exchange(recv, send, [b * (h // world) * n * d for n in lengths],
                  [b * (h // world) * t * d] * world, agreed)
        parts = recv.split([b * (h // world) * n * d for n in lengths])
        full = torch.cat([p.view(b, h // world, n, d) for p, n in zip(parts, lengths)], dim=2)
        out = torch.empty_like(full)
        out[:, :, order] = full  # (B, h/P, N, d), global order
        return out
    b, hp, n, d = x.shape
    mine = x[:, :, order]  # (B, h/P, N, d) in shard order
    parts = mine.split(lengths, dim=2)  # rank i's tokens
    send = torch.cat([p.contiguous().view(-1) for p in parts])
    t = lengths[rank]
    recv = x.new_empty(world * b * hp * t * d)
    _exchange(recv, send, [b * hp * t * d] * world, [b * hp * m * d for m in lengths], agreed)
    return recv.view(world, b, hp, t, d).transpose(0, 1).reshape(b, world * hp, t, d)  # (B, h, t_r, d)


def _exchange(recv, send, recv_sizes, send_sizes, agreed: Agreed) -> None:
    try:
        dist.all_to_all_single(recv, send, output_split_sizes=recv_sizes,
                               input_split_sizes=send_sizes, group=agreed.group)
    except RuntimeError as e:
        raise RuntimeError(f"ulysses_attention: the all-to-all did not complete within the group's "
                           f"timeout: {e}") from e


class _AllToAll(torch.autograd.Function):
    """`_all_to_all` as an autograd op: sequence shards → head shards (`to_heads`) or
    back; its gradient is the same exchange the other way."""

    @staticmethod
    def forward(ctx, x, agreed, to_heads: bool):
        ctx.agreed, ctx.to_heads = agreed, to_heads
        return _all_to_all(x, agreed, to_heads=to_heads)

    @staticmethod
    def backward(ctx, grad):
        return _all_to_all(grad.contiguous(), ctx.agreed, to_heads=not ctx.to_heads), None, None


TO_HEADS, TO_SEQUENCE = True, False  # _AllToAll's direction (apply takes no keywords)

def ulysses_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *, group=None,
                      is_causal: bool = False, block_mask=None,
                      window: tuple[int | None, int | None] | None = None,
                      scale: float | None = None, enable_gqa: bool = False,
                      layout: str = "zigzag", return_lse: bool = False):
    """Exact attention over a sequence sharded across `group`, by all-to-all head exchange.

    Same arguments, shapes and result as [`ring_attention`][qkv.distributed.ring_attention]; the
    head count h must be divisible by the group size P. A `block_mask` is evaluated for the whole
    sequence on every rank with the head index left out (a rank holds h/P of the heads): masks
    that differ per head need `ring_attention`.

    Raises:
        ValueError: on every rank, when h is not divisible by P, or as `ring_attention`.
    """
    agreed = agree(query, key, value, group=group, layout=layout, is_causal=is_causal,
                   window=window, scale=scale, enable_gqa=enable_gqa,
                   has_block_mask=block_mask is not None, what="ulysses_attention")
    lead, (h, t, d), (hkv, _, dv) = query.shape[:-3], query.shape[-3:], value.shape[-3:]
    world = agreed.world
    if h % world:
        raise ValueError(f"ulysses_attention: the {h} query heads must be divisible by the group "
                         f"size {world} (each rank attends h/P heads); use ring_attention instead")
    b = math.prod(lead)  # explicit, not -1: a rank may hold no tokens (t = 0), and reshape(-1) fails
    q = query.reshape(b, h, t, d)  # (B, h, t, d), B = the flattened batch dims
    k = key.reshape(b, hkv, t, d)  # (B, h_kv, t, d)
    v = value.reshape(b, hkv, t, dv)  # (B, h_kv, t, dv)
    if hkv % world:  # too few key/value heads to share out: give every query head its own
        k, v = k.repeat_interleave(h // hkv, dim=1), v.repeat_interleave(h // hkv, dim=1)
    qh, kh, vh = (_AllToAll.apply(x, agreed, TO_HEADS) for x in (q, k, v))  # (B, heads/P, N, ·)
    gqa = kh.shape[1] != qh.shape[1]
    mask = GlobalMask(causal=bool(is_causal), window=tuple(window) if window is not None else None,
                      mask_mod=mask_mod_of(block_mask, agreed.length))
    out, lse = _local(qh, kh, vh, mask, agreed, gqa, return_lse)  # (B, h/P, N, dv), (B, h/P, N)
    out = _AllToAll.apply(out, agreed, TO_SEQUENCE).reshape(*lead, h, t, dv)  # (..., h, t_r, dv)
    if not return_lse:
        return out
    lse_local = _AllToAll.apply(lse.unsqueeze(-1), agreed, TO_SEQUENCE)  # (B, h, t_r, 1)
    return out, lse_local.reshape(*lead, h, t)


def _local(q, k, v, mask: GlobalMask, agreed: Agreed, gqa: bool, want_lse: bool):
    """Attention of h/P heads over the whole sequence with qkv's own attention: out, and the
    log-sum-exp when wanted (blockwise backend), differentiable in q, k, v."""
    n = agreed.length
    kind = mask.pair((0, n), (0, n))
    extra = {}
    if kind == CAUSAL:
        extra["is_causal"] = True
    elif kind == PARTIAL:
        extra["block_mask"] = create_block_mask(mask.combined, None, None, n, n, device=q.device)
    elif kind == EMPTY:
        extra["attn_mask"] = torch.zeros(n, n, dtype=torch.bool, device=q.device)
    res = scaled_dot_product_attention(q, k, v, scale=agreed.scale, enable_gqa=gqa,
                                       return_lse=want_lse, **extra)
    return res if want_lse else (res, None)
