"""Block masks: every built-in's analytic block kinds against kinds counted from its definition;
custom mask_mods evaluated one block row at a time; lengths, batch and heads checked."""

from __future__ import annotations

import pytest
import torch

import qkv
from qkv.attention.block_mask import EMPTY, FULL, PARTIAL, BlockMask, create_block_mask
from qkv.masks import and_masks, causal, document, or_masks, prefix_lm, sliding_window


def definition(kind: str, t: int, s: int, ids: torch.Tensor | None = None) -> torch.Tensor:
    """(t, s) bool from the mask's definition, one (i, j) at a time (p_i = i + offset)."""
    keep = torch.zeros(t, s, dtype=torch.bool)
    for i in range(t):
        for j in range(s):
            if kind == "causal":
                keep[i, j] = j <= i
            elif kind == "causal_br":
                keep[i, j] = j <= i + (s - t)
            elif kind == "window":  # sliding_window(5, 2), bottom-right
                p = i + (s - t)
                keep[i, j] = p - 5 <= j <= p + 2
            elif kind == "document":
                keep[i, j] = bool(ids[i] == ids[j])
            elif kind == "prefix":  # prefix_lm(6)
                keep[i, j] = j < 6 or j <= i
            elif kind == "doc_causal_or_first":  # (document ∧ causal) ∨ key 0
                keep[i, j] = (bool(ids[i] == ids[j]) and j <= i) or j == 0
    return keep


def kinds_from(keep: torch.Tensor, bs: int) -> torch.Tensor:
    t, s = keep.shape
    nq, nk = -(-t // bs), -(-s // bs)
    out = torch.empty(nq, nk, dtype=torch.int8)
    for r in range(nq):
        for c in range(nk):
            tile = keep[r * bs:(r + 1) * bs, c * bs:(c + 1) * bs]
            out[r, c] = FULL if tile.all() else EMPTY if not tile.any() else PARTIAL
    return out


def built_in(kind: str, ids):
    return {
        "causal": causal(), "causal_br": causal("bottom_right"),
        "window": sliding_window(5, 2, alignment="bottom_right"), "document": document(ids),
        "prefix": prefix_lm(6),
        "doc_causal_or_first": or_masks(and_masks(document(ids), causal()),
                                        lambda b, h, q, k: k == 0),
    }[kind]


@pytest.mark.parametrize("kind,t,s", [
    (kind, t, s)
    for kind in ["causal", "causal_br", "window", "document", "prefix", "doc_causal_or_first"]
    for t, s in [(1, 1), (7, 7), (23, 23), (9, 23), (23, 9)]
    if not (kind.startswith("doc") and t != s)])  # documents are self-attention (t = s)
@pytest.mark.parametrize("bs", [1, 4, 8])
def test_kinds_and_mask_follow_the_definition(kind, t, s, bs):
    n = max(t, s)
    ids = torch.tensor([0] * (n // 3) + [1] * (n // 4) + [2] * (n - n // 3 - n // 4))
    keep = definition(kind, t, s, ids)
    bm = create_block_mask(built_in(kind, ids), None, None, t, s, block_size=bs)
    assert torch.equal(bm.materialize()[0, 0], keep)
    assert torch.equal(bm.kinds[0, 0], kinds_from(keep, bs))


def test_custom_mask_mod_is_evaluated_one_block_row_at_a_time():
    seen = []

    def mod(b, h, q, k):
        seen.append(torch.broadcast_shapes(q.shape, k.shape))
        return ((q * 7 + k * 3 + h) % 5 != 0) & (b >= 0)

    bm = create_block_mask(mod, 2, 3, 50, 70, block_size=16)
    assert all(shape[-2] <= 16 and shape[-1] == 70 for shape in seen)  # (…, block, s), never (t, s)
    b = torch.arange(2).view(2, 1, 1, 1)
    h = torch.arange(3).view(1, 3, 1, 1)
    want = ((torch.arange(50).view(1, 1, 50, 1) * 7 + torch.arange(70) * 3 + h) % 5 != 0) & (b >= 0)
    assert torch.equal(bm.materialize(), want.expand(2, 3, 50, 70))
    for bb in range(2):
        for hh in range(3):
            assert torch.equal(bm.kinds[bb, hh], kinds_from(want[bb, hh].expand(50, 70), 16))


def test_per_batch_document_ids():
    ids = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1, 1, 1]])
    bm = create_block_mask(document(ids), 2, None, 8, 8, block_size=4)
    assert bm.kinds.shape == (2, 1, 2, 2)
    assert bm.kinds[0, 0].tolist() == [[FULL, EMPTY], [EMPTY, FULL]]
    assert bm.kinds[1, 0].tolist() == [[PARTIAL, PARTIAL], [PARTIAL, FULL]]
    with pytest.raises(ValueError, match="B=3"):
        create_block_mask(document(ids), 3, None, 8, 8)


def test_sparsity_string_and_repr():
    bm = create_block_mask(sliding_window(256, 0), None, None, 1024, 1024, block_size=128)
    assert "■" in bm.to_string() and "◩" in bm.to_string() and "·" in bm.to_string()
    empty = int((bm.kinds == EMPTY).sum())
    assert bm.sparsity() == pytest.approx(100 * empty / 64)
    assert "sparsity" in repr(bm) and isinstance(bm, BlockMask)


def test_operators_compose_like_the_functions():
    a = causal() & sliding_window(3, None)
    b = and_masks(causal(), sliding_window(3, None))
    ma = create_block_mask(a, None, None, 20, 20, block_size=4).materialize()
    mb = create_block_mask(b, None, None, 20, 20, block_size=4).materialize()
    assert torch.equal(ma, mb)
    u = create_block_mask(causal() | prefix_lm(5), None, None, 20, 20, block_size=4)
    assert torch.equal(u.materialize(), create_block_mask(prefix_lm(5), None, None, 20, 20).materialize())


def test_chunk_offsets_evaluate_global_indices():
    whole = create_block_mask(causal(), None, None, 40, 40, block_size=8).materialize()[0, 0]
    part = create_block_mask(causal(), None, None, 16, 24, block_size=8, q_offset=16, k_offset=8)
    assert torch.equal(part.materialize()[0, 0], whole[16:32, 8:32])


def test_builtins_build_fast_for_long_sequences():
    # O(blocks) work, no (t × s) evaluation: 64k tokens build in milliseconds (timed in
    # benchmarks/long.py); here a mask of 2^20 tokens must not allocate t × s (it would be 1 TB).
    bm = create_block_mask(and_masks(sliding_window(512, 0), document(torch.arange(2**20) // 2048)),
                           None, None, 2**20, 2**20, block_size=1024)
    assert bm.kinds.shape == (1, 1, 1024, 1024)
    # What the tiles must be, from the arithmetic: a query i sees keys i − 512 … i of its own
    # document (2048 tokens = block rows 2m, 2m + 1). The diagonal tile holds both seen and unseen
    # pairs (partial); the tile left of it has pairs 1 … 2047 apart, some within 512 (partial)
    # when both blocks are one document (odd block rows), none otherwise (empty); tiles further
    # left are ≥ 1025 apart and tiles right of the diagonal are in the future (empty). No tile full.
    r = torch.arange(1024)
    want = torch.full((1024, 1024), EMPTY, dtype=bm.kinds.dtype)
    want[r, r] = PARTIAL
    odd = r[1::2]
    want[odd, odd - 1] = PARTIAL
    assert torch.equal(bm.kinds[0, 0], want)


@pytest.mark.parametrize("bad,match", [
    (dict(block_size=0), "block_size must be a positive int, got 0"),
    (dict(block_size=-3), "block_size must be a positive int, got -3"),
    (dict(Lq=-1), "Lq must be an int >= 0, got -1"),
    (dict(B=0), "B must be a positive int or None, got 0"),
])
def test_bad_arguments_name_the_value(bad, match):
    args = dict(mask_mod=causal(), B=None, H=None, Lq=8, Lk=8, block_size=4) | bad
    with pytest.raises(ValueError, match=match):
        create_block_mask(**args)


def test_bad_mask_mods_are_named():
    with pytest.raises(ValueError, match="mask_mod must return a bool tensor, got torch.int32"):
        create_block_mask(lambda b, h, q, k: q - k, None, None, 8, 8)
    with pytest.raises(ValueError, match=r"returned shape \(3, 5\)"):
        create_block_mask(lambda b, h, q, k: torch.ones(3, 5, dtype=torch.bool), None, None, 8, 8)
    with pytest.raises(ValueError, match="mask_mod must be callable"):
        create_block_mask("causal", None, None, 8, 8)
    with pytest.raises(ValueError, match="sliding_window left must be an int >= 0"):
        sliding_window(-1)
    with pytest.raises(ValueError, match="document ids must be a"):
        document(torch.tensor([0.5, 1.0]))
    with pytest.raises(ValueError, match="prefix_len must be an int >= 0"):
        prefix_lm(-2)
    with pytest.raises(ValueError, match="alignment must be one of"):
        causal("middle")


@pytest.mark.parametrize("make", [
    lambda: sliding_window(2**70, 0), lambda: sliding_window(8, 2**63), lambda: prefix_lm(2**64),
    lambda: create_block_mask(causal(), None, None, 8, 8, q_offset=2**70),
    lambda: qkv.scaled_dot_product_attention(*torch.randn(3, 1, 8, 4), window=(2**70, 0)),
], ids=["window left", "window right", "prefix", "offset", "sdpa window"])
def test_sizes_beyond_any_sequence_are_one_value_error(make):
    # (issue 40) the int64 tensors masks compute in overflowed: OverflowError, not a message
    with pytest.raises(ValueError, match=r"must be at most 2\*\*60, wider than any sequence"):
        make()


def test_a_block_mask_refuses_other_lengths_batch_and_heads():
    q = k = v = torch.randn(2, 4, 16, 8)
    bm = create_block_mask(causal(), None, None, 16, 16, block_size=4)
    with pytest.raises(ValueError, match="built for t=16, s=16, but the attention has t=16, s=12"):
        qkv.scaled_dot_product_attention(q, k[:, :, :12], v[:, :, :12], block_mask=bm)
    per_head = create_block_mask(lambda b, h, q, k: k <= q + h, None, 3, 16, 16, block_size=4)
    with pytest.raises(ValueError, match="built for H=3 heads, but the attention has 4"):
        qkv.scaled_dot_product_attention(q, k, v, block_mask=per_head)
    per_batch = create_block_mask(document(torch.zeros(3, 16, dtype=torch.long)), 3, None, 16, 16)
    with pytest.raises(ValueError, match="built for batch B=3, but the attention has batch 2"):
        qkv.scaled_dot_product_attention(q, k, v, block_mask=per_batch)
    with pytest.raises(ValueError, match="block_mask must be a BlockMask"):
        qkv.scaled_dot_product_attention(q, k, v, block_mask=torch.ones(16, 16, dtype=torch.bool))
    with pytest.raises(ValueError, match="pass either block_mask= or"):
        qkv.scaled_dot_product_attention(q, k, v, block_mask=bm, is_causal=True)


def test_descriptions_get_64_row_tiles_for_a_window_and_128_otherwise():
    from qkv.attention import AttentionMask, VarLen
    from qkv.attention.block_mask import block_mask_for

    def tile(mask):
        return block_mask_for(mask, 1, 1, 1000, 1000).block_size

    assert tile(AttentionMask(causal=True, window=(512, 0))) == 64
    assert tile(AttentionMask(window=(16, 16))) == 64
    assert tile(AttentionMask(causal=True)) == 128
    assert tile(AttentionMask(varlen=VarLen.from_lengths([500, 500]), window=(16, 0))) == 128
    window = AttentionMask(causal=True, window=(40, 0))
    assert torch.equal(block_mask_for(window, 1, 1, 300, 300).materialize(),
                       create_block_mask(sliding_window(40, 0), None, None, 300, 300).materialize())
