"""qkv.models.generate: the decoding loop every decoder shares.

Greedy generation equals ``transformers``' ``generate`` token for token (Llama, Qwen3, with and
without the KV cache); left-padded batches equal one prompt at a time; rows stop at EOS and are
padded as transformers pads them; the top-k / top-p filters keep exactly the tokens
transformers' warpers keep; seeded sampling repeats itself.
"""

from __future__ import annotations

import pytest
import torch

from hf_decoders import PROMPTS, make_checkpoint
from qkv.errors import QkvError
from qkv.models import GPT2Config, GPT2Model, load
from qkv.models.generate import filter_scores, generate, sample

transformers = pytest.importorskip("transformers")

SIZES = dict(hidden_size=36, intermediate_size=50, num_hidden_layers=2, num_attention_heads=6,
             num_key_value_heads=2, max_position_embeddings=64)


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def checkpoint(request, tmp_path_factory):
    """(qkv model, HF eager model): random weights with a large init, so greedy choices are
    not near-ties that float rounding could flip."""
    path = tmp_path_factory.mktemp(request.param)
    if request.param == "llama":
        path, hf = make_checkpoint(path, "LlamaConfig", "LlamaForCausalLM", head_dim=8, **SIZES)
    else:
        path, hf = make_checkpoint(path, "Qwen3Config", "Qwen3ForCausalLM", head_dim=10, **SIZES)
    return load(path), hf


def left_padded(model, prompts):
    encs = [model.tokenizer.encode(p).ids for p in prompts]
    t = max(map(len, encs))
    ids = torch.zeros(len(encs), t, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, e in enumerate(encs):
        ids[i, t - len(e):] = torch.tensor(e)
        mask[i, t - len(e):] = 1
    return encs, ids, mask


def test_greedy_equals_transformers_with_and_without_cache(checkpoint):
    model, hf = checkpoint
    for prompt in PROMPTS:
        ids = torch.tensor([model.tokenizer.encode(prompt).ids])
        with torch.no_grad():
            ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=10,
                              do_sample=False, pad_token_id=0)
        assert ref.shape == (1, ids.shape[1] + 10)
        for use_cache in (True, False):
            ours = model.generate(ids, 10, use_cache=use_cache)
            assert ours.tolist() == ref.tolist(), f"use_cache={use_cache}, prompt {prompt!r}"


def test_left_padded_batch_equals_one_by_one_and_transformers(checkpoint):
    model, hf = checkpoint
    encs, ids, mask = left_padded(model, PROMPTS)
    t = ids.shape[1]
    ours = generate(model, ids, 8, attention_mask=mask)
    with torch.no_grad():
        ref = hf.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
    assert ours.tolist() == ref.tolist()
    for i, e in enumerate(encs):
        alone = generate(model, torch.tensor([e]), 8)[0]
        assert ours[i, t - len(e):].tolist() == alone.tolist()


def test_stops_at_eos_and_pads_like_transformers(checkpoint):
    model, hf = checkpoint
    encs, ids, mask = left_padded(model, PROMPTS)
    free = generate(model, ids, 8, attention_mask=mask, eos_token_id=None)
    eos = int(free[0, ids.shape[1] + 2])  # row 0's third new token: it ends there
    ours = generate(model, ids, 8, attention_mask=mask, eos_token_id=eos, pad_token_id=7)
    with torch.no_grad():
        ref = hf.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False,
                          eos_token_id=eos, pad_token_id=7)
    assert ours.tolist() == ref.tolist()
    row = ours[0, ids.shape[1]:].tolist()
    end = row.index(eos)  # 2, or earlier if the token came sooner
    assert end <= 2 and all(x == 7 for x in row[end + 1:])
    # every row ended: the output stops early
    first = generate(model, ids[:1], 8, attention_mask=mask[:1], eos_token_id=eos)
    assert first.shape[1] == ids.shape[1] + end + 1


def test_eos_from_the_config(tmp_path_factory):
    path, _ = make_checkpoint(tmp_path_factory.mktemp("eos"), "LlamaConfig", "LlamaForCausalLM",
                              head_dim=8, **SIZES)
    model = load(path)
    ids = torch.tensor([[5, 6, 7]])
    free = generate(model, ids, 6, eos_token_id=None)
    import dataclasses

    model.config = dataclasses.replace(model.config, eos_token_id=(1000, int(free[0, 4])))
    assert generate(model, ids, 6).shape[1] == 5  # stops at the second new token


@pytest.mark.parametrize("top_k, top_p", [(5, None), (None, 0.3), (None, 0.9), (20, 0.6)])
def test_filters_keep_what_transformers_keeps(top_k, top_p):
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

    logits = torch.randn(4, 300, generator=torch.Generator().manual_seed(0)) * 3
    ref = logits / 0.7
    if top_k is not None:
        ref = TopKLogitsWarper(top_k)(None, ref)
    if top_p is not None:
        ref = TopPLogitsWarper(top_p)(None, ref)
    ours = filter_scores(logits, temperature=0.7, top_k=top_k, top_p=top_p)
    assert torch.equal(ours.isinf(), ref.isinf())
    kept = ~ours.isinf()
    assert torch.equal(ours[kept], ref[kept])  # the same division by the temperature


def test_sampling_is_seeded_and_filtered(checkpoint):
    model, _ = checkpoint
    ids = torch.tensor([model.tokenizer.encode(PROMPTS[0]).ids])
    a = generate(model, ids, 10, do_sample=True, seed=3, temperature=1.5)
    b = generate(model, ids, 10, do_sample=True, seed=3, temperature=1.5)
    c = generate(model, ids, 10, do_sample=True, seed=4, temperature=1.5)
    assert a.tolist() == b.tolist() and a.tolist() != c.tolist()
    state = torch.get_rng_state()
    generate(model, ids, 3, do_sample=True)  # unseeded: its own generator, not the global one
    assert torch.equal(torch.get_rng_state(), state)
    greedy = generate(model, ids, 10)
    assert generate(model, ids, 10, do_sample=True, top_k=1, seed=0).tolist() == greedy.tolist()
    assert generate(model, ids, 10, do_sample=True, top_p=1e-6, seed=0).tolist() == greedy.tolist()
    # top-k: every draw is among the k most likely
    logits = torch.randn(2, 50, generator=torch.Generator().manual_seed(1))
    g = torch.Generator().manual_seed(0)
    draws = torch.stack([sample(logits, top_k=3, generator=g) for _ in range(200)])  # (200, b)
    top3 = logits.topk(3).indices  # (b, 3)
    for row in range(2):
        assert set(draws[:, row].tolist()) <= set(top3[row].tolist())


def test_gpt2_generates_through_the_same_loop():
    model = GPT2Model(GPT2Config(vocab_size=50, n_positions=16, n_embd=16, n_layer=1, n_head=2)).eval()
    ids = torch.tensor([[1, 2, 3]])
    greedy = model.generate(ids, 5)
    assert greedy.tolist() == generate(model, ids, 5).tolist()
    assert model.generate(ids, 5, do_sample=True, top_k=1, seed=1).tolist() == greedy.tolist()


@pytest.mark.parametrize("kwargs, message", [
    (dict(do_sample=True, temperature=0.0), "temperature must be > 0"),
    (dict(do_sample=True, top_p=0.0), r"top_p must be in \(0, 1\]"),
    (dict(do_sample=True, top_k=0), "top_k must be a positive integer"),
    (dict(attention_mask=torch.ones(1, 2)), r"attention_mask must be \(batch, tokens\) = \(1, 3\)"),
    (dict(eos_token_id="x"), "eos_token_id must be a token id"),
])
def test_bad_arguments_are_named(kwargs, message):
    model = GPT2Model(GPT2Config(vocab_size=50, n_positions=16, n_embd=16, n_layer=1, n_head=2)).eval()
    with pytest.raises(ValueError, match=message):
        generate(model, torch.tensor([[1, 2, 3]]), 4, **kwargs)
    with pytest.raises(QkvError, match=r"prompt \(3 tokens\) \+ max_new_tokens \(14\) = 17 tokens; .* at most 16"):
        generate(model, torch.tensor([[1, 2, 3]]), 14)
