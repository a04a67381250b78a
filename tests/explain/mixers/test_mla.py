"""MLA step by step: the steps rebuild the layer's own q and k, the terms sum to its scores, and
the softmax of those scores is its attention weights.

Tolerances: the steps before RoPE run the module's own submodules on the same input, so they are
bit-equal to what its forward handed attention (``torch.equal``). The scores are float64 sums of
the same products in another order: ``assert_agree`` with the float32 sums as the rounding one
precision down. transformers' eager softmax runs in float32 (``dtype=torch.float32``), so its
weights are compared by ``assert_within``: 2× the float32 softmax of qkv's scores, plus 2 ulp.
DeepSeek-V2 applies RoPE in float32 (``xq.float()``): the record takes the rotated parts from
the layer's call, so they are its float32-rounded numbers, not a float64 redo.
"""

from __future__ import annotations

import pytest
import torch
from mixer_layers import deepseek_mla, inputs, rotary_inputs
from tolerance import assert_agree, assert_within

from qkv.errors import QkvError
from qkv.explain.mixers import mla
from qkv.explain.mixers.capture import kernel_call


def _read(version: int, t: int, q_lora_rank=24):
    layer, rotary = deepseek_mla(version, q_lora_rank=q_lora_rank)
    x = inputs(t)
    pe = rotary_inputs(rotary, x)
    mask = torch.full((t, t), torch.finfo(x.dtype).min, dtype=x.dtype).triu(1)[None, None]
    call = kernel_call(layer, mla.KERNEL, x, position_embeddings=pe, attention_mask=mask)
    return call, mla.read(layer, x, pe)


@pytest.mark.parametrize("version,q_lora_rank", [(3, 24), (3, None), (2, 24)])
@pytest.mark.parametrize("t", [1, 7, 33])
def test_steps_rebuild_the_layers_query_and_key_and_its_scores(version, q_lora_rank, t):
    call, rec = _read(version, t, q_lora_rank)
    query, key = call.arguments["query"][0], call.arguments["key"][0]  # (h, t, dn + dr)
    dn = rec.q_nope.shape[-1]
    assert torch.equal(rec.q_nope, query[..., :dn]) and torch.equal(rec.k_nope, key[..., :dn])
    assert torch.equal(rec.value, call.arguments["value"][0])
    assert (rec.c_q is None) == (q_lora_rank is None)
    layer_scores = call.arguments["scaling"] * query @ key.transpose(-1, -2)  # (h, t, t) as eager forms them
    low = call.arguments["scaling"] * query.float() @ key.float().transpose(-1, -2)
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    for h in range(rec.heads):
        assert_agree(rec.scores(h), layer_scores[h], low[h], what=f"head {h} scores")
        ours = torch.softmax(rec.scores(h).masked_fill(~causal, float("-inf")), dim=-1)
        plain = torch.softmax(rec.scores(h).float().masked_fill(~causal, float("-inf")), dim=-1)
        assert_within(rec.weights[h].float(), ours, plain, what=f"head {h} weights")


@pytest.mark.parametrize("version", [3, 2])
def test_the_score_attribution_sums_to_the_layers_score(version):
    t = 9
    call, rec = _read(version, t)
    query, key = call.arguments["query"][0], call.arguments["key"][0]
    scaling = call.arguments["scaling"]
    f64 = torch.float64
    for h in range(rec.heads):
        for i in (0, 5, 8):  # a row's keys at once: the bound is a max over the row's roundings
            terms = [rec.score(h, i, j) for j in range(i + 1)]
            assert_agree(torch.tensor([s.score for s in terms], dtype=f64), scaling * key[h, : i + 1] @ query[h, i],
                         scaling * key[h, : i + 1].float() @ query[h, i].float(), what="content + position")
            assert_agree(torch.stack([s.latent.sum() for s in terms]), torch.tensor([s.content for s in terms], dtype=f64),
                         rec.scaling * rec.k_nope[h, : i + 1].float() @ rec.q_nope[h, i].float(),
                         what="the latent channels sum to the content part")
    assert terms[0].to_dict()["kind"] == "mla_score"


def test_latent_norms_and_a_hidden_key_is_refused():
    _, rec = _read(3, 7)
    norms = rec.latent_norms()
    assert set(norms) == {"c_q", "c_kv"} and norms["c_kv"].shape == (7,)
    # the RMSNorm rescales every token's latent to one RMS: c_kv = raw / rms(raw) · weight
    rms = rec.c_kv_raw.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()
    assert torch.allclose(rec.c_kv, rec.c_kv_raw / rms * rec.c_kv[0] / (rec.c_kv_raw[0] / rms[0]), atol=1e-9)
    with pytest.raises(QkvError, match="key 5 is not visible from query 2"):
        rec.score(0, 2, 5)
