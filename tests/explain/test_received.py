"""``attention_received``: each key's Σ_i w_ij in one head, checked against the float64
recomputation of every query row (``explain_head``) — a separate path from the traced map."""

from __future__ import annotations

import pytest
import torch

from qkv.explain import explain_head
from qkv.explain.received import attention_received

TEXT = "The dog found some pizza next to the baby and ate it"


@pytest.mark.parametrize(("layer", "head"), [(0, 0), (3, 1), (5, 11)])
def test_column_sums_equal_the_rows_recomputed_in_float64(model, layer, head):
    r = attention_received(model, TEXT, layer=layer, head=head)
    t = len(r.map.units)
    steps = [explain_head(model, TEXT, token=str(i), layer=layer, head=head) for i in range(t)]
    expected = torch.stack([st.weights for st in steps]).sum(0)  # (t,) from t float64 rows
    # each recomputed row differs from the forward's by at most its reported weights difference,
    # so their sum by at most the sum of those differences (triangle inequality); the column sum
    # itself is t float32 additions of non-negative terms: at most (t − 1)·ε32 of the sum more
    # (Higham's γ bound), which is of the same order and may round either way
    bound = sum(st.diffs["weights"] for st in steps) + (t - 1) * torch.finfo(torch.float32).eps * expected
    assert ((r.received - expected).abs() <= bound).all()
    assert r.to_dict()["kind"] == "received" and r.to_dict()["rows"] == t


def test_words_sum_the_word_map_and_total_the_number_of_rows(model):
    r = attention_received(model, TEXT, layer=2, head=3, words=True)
    U, t = len(r.map.units), len(model.tokenizer.encode(TEXT).ids)
    # U rows, each an average of token rows whose t float32 weights sum to 1 within t·ε32
    assert abs(float(r.received.sum()) - U) <= U * t * torch.finfo(torch.float32).eps
    assert (r.received >= 0).all()
