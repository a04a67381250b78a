"""`sparse.indexed` on a loaded model (qkv's attention): the selection is transformers' own top-k
— the keys the eager model attends, with the same weights — and the recomputed float64 index
scores order it: every kept key scores at least every left-out one, to the indexer's float32
rounding.

Tolerances: the indexer's float32 score is a D-channel dot product (D = 8 here) through relu,
weighted over g = 2 heads: within (D + g + 2)·eps32 of exact relative to the row's largest
term sum, bounded here by 64·eps32 × the row's largest |score|; the weights are two float32
softmaxes over ≤ 10 keys (eager's and qkv's kernel), each within (s + 4)·eps32 of exact, so
64·eps32 apart at most."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")  # the qkv[hf] extra
import torch  # noqa: E402

import qkv  # noqa: E402
from hybrids import save_hybrid  # noqa: E402
from qkv.explain.mixers.sparse import indexed, indexed_layers  # noqa: E402

TEXT = "the cat sat on the mat . a red dog"


@pytest.mark.parametrize("name", ["deepseek_v32", "glm_moe_dsa"])
def test_the_selection_is_transformers_top_k_and_the_scores_order_it(name, tmp_path):
    eager = save_hybrid(name, tmp_path)
    model = qkv.load(tmp_path)
    assert indexed_layers(model) == [0, 1, 2, 3]
    ids = torch.tensor([model.tokenizer.encode(TEXT).ids])
    with torch.no_grad():
        attentions = eager(ids, output_attentions=True).attentions  # L × (1, h, t, t)
    eps = torch.finfo(torch.float32).eps
    for layer in (1, 3):
        for token in range(ids.shape[1]):
            r = indexed(model, TEXT, layer=layer, head=0, token=token)
            want = attentions[layer][0, :, token, : token + 1]  # (h, token+1) the eager model's
            kept = want.abs().sum(0) > 0
            assert set(r.row.selected) == set(kept.nonzero().flatten().tolist())
            assert len(r.row.selected) == min(r.topk, token + 1)
            torch.testing.assert_close(r.row.weights.float(), want, rtol=0, atol=64 * eps)
            if r.row.cutoff is not None:
                left = [j for j, m in enumerate(r.missed()) if m is not None]
                slack = 64 * eps * float(r.row.scores.abs().max())
                assert max(float(r.row.scores[j]) for j in left) <= r.row.cutoff + slack
                assert all(m >= -slack for m in (r.missed()[j] for j in left))
