"""plan.py: a pair of chunks is classified the way create_block_mask classifies a block — the same
mask_mod asked about the same bounds — and never wrongly against the mask's definition, written
here entry by entry. No process group: planning is arithmetic on global positions."""

from __future__ import annotations

import itertools

import pytest
import torch

from qkv.attention.block_mask import EMPTY as EMPTY_BLOCK, FULL as FULL_BLOCK, create_block_mask
from qkv.distributed.plan import CAUSAL, EMPTY, FULL, PARTIAL, GlobalMask
from qkv.masks import and_masks, causal, document, or_masks, prefix_lm, sliding_window

N = 23
IDS = [0] * 7 + [1] * 9 + [2] * 7  # packed documents, sorted
ROWS = torch.tensor([IDS, [0] * 12 + [1] * 11])  # per batch row


def _same(i, j):
    return IDS[i] == IDS[j]


# name, GlobalMask, definition(b, i, j) -> bool, analytic (classified from bounds alone)
CASES = [
    ("none", GlobalMask(), lambda b, i, j: True, True),
    ("causal", GlobalMask(causal=True), lambda b, i, j: j <= i, True),
    ("window", GlobalMask(window=(3, 2)), lambda b, i, j: i - 3 <= j <= i + 2, True),
    ("causal window", GlobalMask(causal=True, window=(4, None)), lambda b, i, j: i - 4 <= j <= i, True),
    ("causal ∩ window closed", GlobalMask(causal=True, window=(2, 5)), lambda b, i, j: i - 2 <= j <= i, True),
    ("documents", GlobalMask(mask_mod=document(IDS)), lambda b, i, j: _same(i, j), True),
    ("causal documents", GlobalMask(causal=True, mask_mod=document(IDS)),
     lambda b, i, j: j <= i and _same(i, j), True),
    ("and_masks", GlobalMask(mask_mod=and_masks(document(IDS), causal())),
     lambda b, i, j: j <= i and _same(i, j), True),
    ("prefix_lm", GlobalMask(mask_mod=prefix_lm(5)), lambda b, i, j: j < 5 or j <= i, True),
    ("window or prefix", GlobalMask(window=(None, 1), mask_mod=or_masks(sliding_window(2, 0), prefix_lm(3))),
     lambda b, i, j: j <= i + 1 and (i - 2 <= j <= i or j < 3 or j <= i), True),
    ("per-batch documents", GlobalMask(causal=True, mask_mod=document(ROWS)),
     lambda b, i, j: j <= i and bool(ROWS[b, i] == ROWS[b, j]), True),
    ("custom", GlobalMask(causal=True, mask_mod=lambda b, h, q, k: (q + k) % 3 != 0),
     lambda b, i, j: j <= i and (i + j) % 3 != 0, False),
]


def _truth(definition, batch: int) -> torch.Tensor:
    """(B, N, N) bool from the definition, one (b, i, j) at a time."""
    out = torch.zeros(batch, N, N, dtype=torch.bool)
    for b, i, j in itertools.product(range(batch), range(N), range(N)):
        out[b, i, j] = bool(definition(b, i, j))
    return out


def _as_block(kind: str) -> int:
    return {EMPTY: EMPTY_BLOCK, FULL: FULL_BLOCK, CAUSAL: 1, PARTIAL: 1}[kind]


@pytest.mark.parametrize("name, mask, definition, analytic", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("chunk", [1, 4, 5, N])
def test_a_pair_of_chunks_is_classified_as_its_block(name, mask, definition, analytic, chunk):
    """The pair [r·c, (r+1)·c) × [k·c, (k+1)·c) is the block (r, k) of a block mask of side c."""
    if mask.combined is None:
        want = torch.full((1, 1, -(-N // chunk), -(-N // chunk)), FULL_BLOCK, dtype=torch.int8)
    else:
        want = create_block_mask(mask.combined, None, None, N, N, block_size=chunk).kinds
    empty, full = (want == EMPTY_BLOCK).flatten(0, 1).all(0), (want == FULL_BLOCK).flatten(0, 1).all(0)
    for r, k in itertools.product(range(want.shape[-2]), range(want.shape[-1])):
        got = mask.pair((r * chunk, min((r + 1) * chunk, N)), (k * chunk, min((k + 1) * chunk, N)))
        expected = EMPTY_BLOCK if empty[r, k] else FULL_BLOCK if full[r, k] else 1
        if analytic:
            assert _as_block(got) == expected, (r, k, got)
        else:  # a custom mask_mod is not classified from bounds: PARTIAL unless the band says empty
            assert got in (EMPTY, PARTIAL, CAUSAL) and (got != EMPTY or expected == EMPTY_BLOCK), (r, k)


@pytest.mark.parametrize("name, mask, definition, analytic", CASES, ids=[c[0] for c in CASES])
def test_a_pair_of_runs_is_never_classified_wrongly(name, mask, definition, analytic):
    """Any runs, of any lengths (a zigzag shard's): EMPTY has no entry, FULL every entry, CAUSAL
    is square on the diagonal and exactly lower-triangular; PARTIAL is what is left."""
    batch = ROWS.shape[0] if name == "per-batch documents" else 1
    keep = _truth(definition, batch)
    runs = [(0, 3), (2, 9), (5, 6), (7, 16), (11, 23), (16, 23), (20, 21), (4, 4)]
    for (qa, qb), (ka, kb) in itertools.product(runs, runs):
        got = mask.pair((qa, qb), (ka, kb))
        tile = keep[:, qa:qb, ka:kb]
        if got == EMPTY:
            assert not tile.any(), ((qa, qb), (ka, kb))
        elif got == FULL:
            assert tile.all(), ((qa, qb), (ka, kb))
        elif got == CAUSAL:
            tril = torch.ones(qb - qa, qb - qa, dtype=torch.bool).tril()
            assert (qa, qb) == (ka, kb) and torch.equal(tile, tril.expand_as(tile)), (qa, qb)
        if analytic and name != "per-batch documents" and got in (PARTIAL, CAUSAL):
            assert tile.any() and not tile.all(), ((qa, qb), (ka, kb))  # exact for these


def test_a_causal_diagonal_pair_runs_on_the_causal_kernel():
    """The ring's fast path: a square pair on the diagonal whose mask is exactly causal there."""
    assert GlobalMask(causal=True).pair((5, 12), (5, 12)) == CAUSAL
    assert GlobalMask(causal=True, window=(6, None)).pair((5, 12), (5, 12)) == CAUSAL  # reaches key 5
    assert GlobalMask(causal=True, window=(5, None)).pair((5, 12), (5, 12)) == PARTIAL  # does not
    assert GlobalMask(causal=True, mask_mod=document(IDS)).pair((7, 16), (7, 16)) == CAUSAL  # one document
    assert GlobalMask(causal=True, mask_mod=document(IDS)).pair((5, 12), (5, 12)) == PARTIAL  # two
    assert GlobalMask(mask_mod=and_masks(causal(), document(IDS))).pair((7, 16), (7, 16)) == CAUSAL
    assert GlobalMask(causal=True).pair((5, 12), (4, 11)) == PARTIAL  # not on the diagonal
