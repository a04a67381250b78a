"""``compare``: every method's row for one token, side by side."""

from __future__ import annotations

from qkv.explain.contributions import METHODS
from qkv.explain.contributions.compare import compare
from tolerance import softmax_sum_tolerance

TEXT = "The dog found some pizza next to the baby and ate it"


def test_compare_runs_every_method_that_applies(model):
    c = compare(model, TEXT, token="it", top=2, target_text="a dog ate the pizza")
    assert list(c.rows) == list(METHODS) and not c.skipped
    assert c.top["alti"][0][0] == c.units.labels.index("pizza")
    for name, row in c.rows.items():
        # shares: divided by their row's sum, so the rounding of a softmax row's sum bounds it
        assert abs(float(row.sum()) - 1) <= softmax_sum_tolerance(len(c.tokens), row.dtype), name
    assert c.parked["norm"] < c.parked["weight"]  # values count: less on [CLS]/[SEP]/punctuation
    skipped = compare(model, TEXT, token="it", top=1)
    assert list(skipped.skipped) == ["grad"]
