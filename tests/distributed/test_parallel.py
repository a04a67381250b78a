"""A whole model sequence-parallel: a tiny GPT-2, a tiny Llama (GQA, RoPE at global positions) and
a tiny Mistral (its sliding window through the blockwise chunks) give the same logits on 1 and on
P processes, and one training step the same gradients; what sequence parallelism cannot do is
refused before anything is sent.

Models run in float64; the bound is ``agree_bound`` (tests/tolerance.py): the float32 model's
distance from the float64 one, scaled by eps64/eps32, × 4. The single-process float64 run is
the reference; every rank compares its shard of the logits, and the all-reduced (summed)
parameter gradients of Σ over ranks of its shard's loss against the full loss's gradients.

GPT-2's learned position table and Llama's RoPE must see global positions: each rank passes
``shard_positions`` as the model's ``position_ids``.
"""

from __future__ import annotations

import pytest
import torch

import spawned
from tolerance import agree_bound, max_err


def _models():
    from qkv.models.gpt2 import GPT2Config, GPT2Model
    from qkv.models.llama import LlamaConfig, LlamaModel

    torch.manual_seed(0)
    gpt2 = GPT2Model(GPT2Config(vocab_size=61, n_positions=64, n_embd=24, n_layer=2, n_head=6))
    torch.manual_seed(0)
    llama = LlamaModel(LlamaConfig(vocab_size=61, hidden_size=24, intermediate_size=40,
                                   num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2,
                                   max_position_embeddings=64))
    torch.manual_seed(0)
    mistral = LlamaModel(LlamaConfig(vocab_size=61, hidden_size=24, intermediate_size=40,
                                     num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2,
                                     max_position_embeddings=64, sliding_window=6))
    return {"gpt2": gpt2, "llama": llama, "mistral": mistral}


def _step(model, ids, positions, targets):
    """One forward at global ``positions`` (b, t) and the backward of its summed loss: the
    logits (b, t, V) and every parameter's gradient."""
    model.zero_grad()
    logits = model(ids, position_ids=positions).logits
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum")
    loss.backward()
    return logits.detach(), {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}


def _worker(rank, world, runs):
    import copy

    import torch.distributed as dist

    from qkv.distributed import SequenceParallel, shard, shard_positions

    report = []
    models = _models()
    n = 29  # not a multiple of 2P
    ids = torch.randint(0, 61, (2, n + 1), generator=torch.Generator().manual_seed(1))
    dist.broadcast(ids, src=0)
    inputs, targets = ids[:, :-1], ids[:, 1:]
    full_pos = torch.arange(n).expand(2, n)
    for name, method, layout in runs:
        model = models[name]
        ref = _step(copy.deepcopy(model).double(), inputs, full_pos, targets)
        low = _step(copy.deepcopy(model).float(), inputs, full_pos, targets)
        sp = SequenceParallel(layout=layout, method=method).apply(copy.deepcopy(model).double())
        pos = shard_positions(n, layout=layout).expand(2, -1)  # (b, t_r)
        local = [shard(x, layout=layout, dim=1) for x in (inputs, targets)]
        logits, grads = _step(sp, local[0], pos, local[1])
        for g in grads.values():
            dist.all_reduce(g)  # Σ over ranks of each shard's loss = the full loss
        r_logits, l_logits = (shard(x, layout=layout, dim=1) for x in (ref[0], low[0]))
        report.append((name, method, layout, "logits", max_err(logits, r_logits),
                       agree_bound(r_logits, l_logits, dtype=torch.float64)))
        worst = max(grads, key=lambda k: max_err(grads[k], ref[1][k]) /
                    agree_bound(ref[1][k], low[1][k], dtype=torch.float64))
        report.append((name, method, layout, f"grad {worst}", max_err(grads[worst], ref[1][worst]),
                       agree_bound(ref[1][worst], low[1][worst], dtype=torch.float64)))
    return report


@pytest.mark.parametrize("world, runs", [
    (2, [("gpt2", "ring", "zigzag"), ("gpt2", "ulysses", "contiguous"), ("llama", "ring", "zigzag"),
         ("mistral", "ring", "zigzag")]),
    (3, [("gpt2", "ring", "contiguous"), ("llama", "ring", "zigzag"), ("llama", "ulysses", "zigzag")]),
])
def test_model_same_logits_and_gradients_on_p_processes(world, runs):
    reports = spawned.run(world, _worker, runs)
    bad = [(rank, *row) for rank, rows in enumerate(reports) for row in rows if not row[4] <= row[5]]
    assert not bad, "\n".join(f"rank {r}: {m} {meth} {lay} {what}: {err:.3g} > {tol:.3g}"
                              for r, m, meth, lay, what, err, tol in bad)


def _packed_worker(rank, world):
    """Packed sequences (``mask.varlen``, what BERT's encoder passes) through ``attend``: the
    ranks plan them as the built-in ``document`` mask_mod, classified from chunk bounds."""
    import torch.distributed as dist

    import qkv
    from qkv.attention.attention_mask import AttentionMask, VarLen
    from qkv.distributed import SequenceParallel, shard

    vl = VarLen.from_lengths([9, 4, 12])  # N = 25: documents straddle the shards
    inputs = [torch.randn(1, 4, vl.total, 8, generator=torch.Generator().manual_seed(i),
                          dtype=torch.float64) for i in range(3)]
    for x in inputs:
        dist.broadcast(x, src=0)
    report = []
    for method, layout, causal in (("ring", "zigzag", True), ("ring", "contiguous", False),
                                   ("ulysses", "zigzag", True)):
        mask = AttentionMask(varlen=vl, causal=causal)
        ref = qkv.scaled_dot_product_attention(*inputs, mask=mask, backend="reference")
        low = qkv.scaled_dot_product_attention(*(x.float() for x in inputs), mask=mask, backend="reference")
        got = SequenceParallel(layout=layout, method=method).attend(
            *(shard(x, layout=layout) for x in inputs), mask)
        r, lo = (shard(x, layout=layout) for x in (ref, low))
        report.append((method, layout, causal, max_err(got, r), agree_bound(r, lo, dtype=torch.float64)))
    return report


def test_packed_sequences_on_p_processes_equal_one_process():
    bad = [(rank, *row) for rank, rows in enumerate(spawned.run(2, _packed_worker)) for row in rows
           if not row[3] <= row[4]]
    assert not bad, bad


def test_what_a_shard_cannot_do_is_refused_before_any_communication():
    """No process group is needed: these are refused before the ranks are contacted."""
    from qkv.attention.attention_mask import AttentionMask
    from qkv.distributed import SequenceParallel
    from qkv.modules import MultiHeadAttention

    sp = SequenceParallel()
    q = torch.randn(1, 2, 4, 8)  # (b, h, t_r, d)
    for mask, extra in ((AttentionMask(key_padding=torch.ones(1, 4, dtype=torch.bool)), {}),
                        (AttentionMask(dense=torch.ones(4, 4, dtype=torch.bool)), {}),
                        (AttentionMask(causal=True), {"bias": torch.zeros(2, 4, 4)}),
                        (AttentionMask(causal=True), {"dropout_p": 0.1})):
        with pytest.raises(ValueError, match="not supported"):
            sp.attend(q, q, q, mask, **extra)
    mha = sp.apply(MultiHeadAttention(16, 2))
    with pytest.raises(ValueError, match="need_weights"):
        mha(torch.randn(1, 4, 16), need_weights=True)
    with pytest.raises(ValueError, match="layout"):
        SequenceParallel(layout="striped")
    with pytest.raises(ValueError, match="method"):
        SequenceParallel(method="tree")
