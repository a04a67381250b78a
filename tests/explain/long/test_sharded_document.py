"""qkv.explain.long.sharded_document: a Document built sequence-parallel (ring attention, the global
lse merged across ranks) answers on every rank as one process's Document does — its rows'
weights, the overview of one of its tokens (weight, norm) and, collectively, received sums, tile
sums, sinks and rollout — on gloo with P = 2 and 3, a tiny Llama (GQA, RoPE at global positions),
causal under the zigzag and contiguous layouts, and Mistral's sliding window.

Tolerances (tests/tolerance.py, ``agree_bound``): the reference is one process's Document of the
float64 model; the sharded one runs the same float64 weights, so the two differ by rounding only
(the ring's lse merge and its chunked sums, the ranks' partial sums added by the all-reduce,
against one blockwise pass). That rounding is measured one precision down — one process's
Document of the float32 model — scaled by eps64/eps32, × 4.
"""

from __future__ import annotations

import pytest
import torch

import spawned
from hf_decoders import make_checkpoint
from tolerance import agree_bound, max_err, twin, ulp

SENTENCE = "The quick brown fox jumps over the lazy dog. Attention is all you need, said the paper. "
TEXT = SENTENCE * 4  # ~200 tokens: shards of 33–100 rows, runs that start inside 16-token tiles
SIZES = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=512)
BLOCK = 16


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    llama = make_checkpoint(tmp_path_factory.mktemp("llama"), "LlamaConfig", "LlamaForCausalLM", **SIZES)[0]
    mistral = make_checkpoint(tmp_path_factory.mktemp("mistral"), "MistralConfig", "MistralForCausalLM",
                              sliding_window=24, **SIZES)[0]
    return {"llama": llama, "mistral": mistral}


def _answers(doc, rows, own: int, shared: int) -> dict:
    """Every question: this rank's ``rows`` (global indices) and its token ``own`` (weight, norm);
    the collectives, with ``shared`` the same token on every rank (rollout's row vectors)."""
    got = {}
    for layer in range(len(doc.layers)):
        got[f"rows of layer {layer}"] = doc.row_weights(layer, rows)
        for head in range(doc.layers[layer].query.shape[0]):
            got[f"received {layer}.{head}"] = doc.received(layer, head)
            got[f"block map {layer}.{head}"] = doc.block_map(layer, head, block=BLOCK)
    for method in ("weight", "norm"):
        got[f"scores {method}"] = doc.scores([own], method).scores
    got["scores rollout"] = doc.scores([shared], "rollout").scores
    got["sinks"] = doc.sinks()
    return got


def _worker(rank, world, paths, runs):
    import qkv
    from qkv.distributed import SequenceParallel
    from qkv.errors import QkvError
    from qkv.explain.long.document import document
    from qkv.explain.long.sharded_document import sharded_document

    report = []
    for name, layout in runs:
        model = qkv.load(paths[name])
        ref, low = document(twin(model, torch.float64), TEXT), document(twin(model, torch.float32), TEXT)
        sp = SequenceParallel(layout=layout).apply(twin(model, torch.float64))
        doc = sharded_document(sp, TEXT)
        mine = doc.rows  # (t_r,) global
        rows = mine[torch.tensor([0, len(mine) // 2, len(mine) - 1])]
        own = int(mine[len(mine) // 2])
        got, want, plain = (_answers(d, rows, own, shared=7) for d in (doc, ref, low))
        for what in want:
            # answers returned in float32 (rollout, sinks) add a rounding each: 2 ulp of float32
            last = 2 * ulp(want[what], got[what].dtype) if got[what].dtype != torch.float64 else 0.0
            report.append((name, layout, what, max_err(got[what], want[what]),
                           agree_bound(want[what], plain[what], dtype=torch.float64) + last))
        # the overview of a token this rank holds, as one process gives it
        ov, ref_ov = doc.explain(token=own), ref.explain(token=own)
        ranked = [(r.layer, r.head) for r in ov.rows] == [(r.layer, r.head) for r in ref_ov.rows]
        report.append((name, layout, "overview ranking", 0.0 if ranked and ov.focus == ref_ov.focus else 1.0, 0.0))
        # another rank's row: one clear error naming the rank that holds it
        other = next(t for t in range(len(doc)) if t not in set(mine.tolist()))
        try:
            doc.weights(0, 0, [other])
            report.append((name, layout, "another rank's row refused", 1.0, 0.0))
        except QkvError as e:
            fine = f"held by rank {doc.shard.owner(other)}" in str(e)
            report.append((name, layout, "another rank's row refused", 0.0 if fine else 1.0, 0.0))
    return report


@pytest.mark.parametrize("world, runs", [
    (2, [("llama", "zigzag"), ("mistral", "zigzag")]),
    (3, [("llama", "zigzag"), ("llama", "contiguous")]),
])
def test_every_rank_answers_as_one_process(checkpoints, world, runs):
    reports = spawned.run(world, _worker, checkpoints, runs, deadline=60.0)
    bad = [(rank, *row) for rank, rows in enumerate(reports) for row in rows if not row[3] <= row[4]]
    assert not bad, "\n".join(f"rank {r}: {m} {lay} {what}: {err:.3g} > {tol:.3g}"
                              for r, m, lay, what, err, tol in bad)
    assert all(len(rows) == len(reports[0]) for rows in reports)


def test_without_a_strategy_is_one_clear_error(checkpoints):
    """No process group needed: a model that does not run sequence-parallel is refused first."""
    import qkv
    from qkv.errors import QkvError
    from qkv.explain.long.sharded_document import sharded_document

    with pytest.raises(QkvError, match="SequenceParallel"):
        sharded_document(qkv.load(checkpoints["llama"]), TEXT)
