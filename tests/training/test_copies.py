"""Copied spans: every copied token continues an earlier occurrence, within the reach."""

from __future__ import annotations

import random

import pytest

from qkv.training.copies import copy_sequence


@pytest.mark.parametrize("reach", [None, 8, 40])
def test_copies_continue_an_earlier_span_within_reach(reach):
    rng = random.Random(reach)
    for _ in range(30):
        ids, copied = copy_sequence(rng, 300, lambda ids: rng.randrange(1000), copy_prob=0.5,
                                    min_span=3, max_span=8, reach=reach)
        assert len(ids) == len(copied) == 300
        for i, c in enumerate(copied):
            if c:  # the token before and this one occurred together earlier, at most reach back
                lo = 1 if reach is None else max(1, i - reach)
                assert any(ids[j - 1] == ids[i - 1] and ids[j] == ids[i] for j in range(lo, i)), i
        assert 0.2 < sum(copied) / len(copied) < 0.9


def test_no_copies_without_copy_prob():
    rng = random.Random(0)
    ids, copied = copy_sequence(rng, 50, lambda ids: len(ids), copy_prob=0.0, min_span=2, max_span=4)
    assert ids == list(range(50)) and not any(copied)
