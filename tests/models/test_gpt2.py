"""qkv's GPT-2 against Hugging Face transformers, same weights.

A small random GPT-2 (2 layers, 4 heads, E = 64, V = 1000) is built by ``transformers``, saved
with ``save_pretrained`` (safetensors: Conv1D weights stored (in, out), fused ``c_attn``, a
``transformer.`` prefix) next to a byte-level BPE tokenizer trained here, and loaded with
``qkv.models.load``. Logits, hidden states and attention probabilities equal transformers';
greedy generation equals ``generate(do_sample=False)`` token for token, with and without the KV
cache; padding and batching change nothing.

Tolerances are derived (``tests/tolerance.py``): against transformers, the truth is
transformers in float64 and qkv in float32 may be at most twice as far from it as transformers
in float32 is; qkv's other paths (cached, padded, traced) are held to the same rule, with qkv's
own plain forward in float32 as the plain path and the same model in float64 as the truth.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

from qkv.errors import QkvError
from qkv.models import DecoderOutput, GPT2Config, GPT2Model, load
from hf_decoders import CORPUS, PROMPTS
from tolerance import assert_within, twin

transformers = pytest.importorskip("transformers")



@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """(directory, HF model): a random GPT-2 and a trained byte-level BPE tokenizer."""
    from tokenizers import ByteLevelBPETokenizer

    path = tmp_path_factory.mktemp("tiny-gpt2")
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(CORPUS, vocab_size=400, min_frequency=1, special_tokens=["<|endoftext|>"])
    tok.save_model(str(path))  # vocab.json + merges.txt
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_head=4, n_embd=64, vocab_size=1000,
                                     n_positions=64, initializer_range=0.1,
                                     bos_token_id=None, eos_token_id=None)
    hf = transformers.GPT2LMHeadModel(config).eval()
    hf.save_pretrained(str(path))
    return str(path), hf


@pytest.fixture(scope="module")
def model(checkpoint) -> GPT2Model:
    return load(checkpoint[0])


@pytest.fixture(scope="module")
def hf(checkpoint):
    """The same weights re-read by transformers, with the eager attention (it returns weights)."""
    return transformers.GPT2LMHeadModel.from_pretrained(checkpoint[0], attn_implementation="eager").eval()


@pytest.fixture(scope="module")
def model64(model) -> GPT2Model:
    """The same weights in float64: the truth for qkv's own paths."""
    return twin(model, torch.float64)


@pytest.fixture(scope="module")
def batch(model):
    return model.tokenizer.encode_batch(PROMPTS)  # right-padded


@pytest.fixture(scope="module")
def hf_ref(hf, batch):
    """(float32 output, float64 output) of transformers on the batch: the plain path and the truth."""
    hf64 = twin(hf, torch.float64)
    with torch.no_grad():
        kw = dict(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                  output_hidden_states=True, output_attentions=True)
        return hf(**kw), hf64(**kw)


def test_loaded_model_is_the_saved_one(model, checkpoint):
    hf = checkpoint[1]
    assert isinstance(model, GPT2Model) and model.config.n_layer == 2
    assert model.lm_head.weight is model.wte.weight  # tied
    # Conv1D (in, out) transposed, c_attn split in three
    w = hf.transformer.h[1].attn.c_attn.weight  # (E, 3E)
    assert torch.equal(model.layers[1].self_attn.k_proj.weight, w[:, 64:128].T)


@pytest.mark.parametrize("traced", [False, True], ids=["fused", "traced"])
def test_logits_hidden_states_attention_equal_transformers(model, batch, hf_ref, traced):
    with torch.no_grad():
        ours = model(batch.input_ids, batch.attention_mask, output_hidden_states=True,
                     trace_rows=slice(None) if traced else None)
    plain, ref = hf_ref
    assert isinstance(ours, DecoderOutput)
    real = batch.attention_mask.bool()  # (b, t)
    assert_within(ours.logits[real], ref.logits[real], plain.logits[real], what="logits")
    # HF's tuple ends with the final-LayerNorm output; ours with the last layer's output
    L = model.config.n_layer
    for i in range(L):
        assert_within(ours.hidden_states[i][real], ref.hidden_states[i][real],
                      plain.hidden_states[i][real], what=f"hidden_states[{i}]")
    assert_within(model.decoder.norm(ours.hidden_states[L])[real], ref.hidden_states[L][real],
                  plain.hidden_states[L][real], what="final norm")
    if not traced:
        assert ours.traces is None
        return
    pair = real[:, None, :, None] & real[:, None, None, :]  # (b, 1, t, t)
    for i, (trace, p, r) in enumerate(zip(ours.traces, plain.attentions, ref.attentions)):
        w = trace.self_attn.attention.weights  # (b, h, t, t)
        assert_within(w, r, p, where=pair, what=f"layer {i} attention probabilities")
        assert torch.all(w.triu(diagonal=1) == 0)  # causal: nothing from the future


def test_trace_holds_the_normalised_query_input(model, batch, hf_ref):
    with torch.no_grad():
        out = model(batch.input_ids, batch.attention_mask, output_hidden_states=True,
                    trace_rows=torch.tensor([1, 3]))
    real = batch.attention_mask.bool()
    plain, ref = hf_ref  # tracing changes nothing: as close to the truth as the fused forward
    assert_within(out.logits[real], ref.logits[real], plain.logits[real], what="traced logits")
    for L, trace in enumerate(out.traces):
        expected = model.layers[L].norm1(out.hidden_states[L])[:, [1, 3]]  # pre-norm
        assert torch.equal(trace.self_attn.query_input, expected)  # exact: the same norm call
        assert trace.self_attn.attention.weights.shape == (3, 4, 2, batch.input_ids.shape[1])


def test_greedy_generation_equals_transformers(model, hf):
    for prompt in PROMPTS:
        ids = torch.tensor([model.tokenizer.encode(prompt).ids])
        with torch.no_grad():
            ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12,
                              do_sample=False, pad_token_id=0)
        assert ref.shape == (1, ids.shape[1] + 12)
        for use_cache in (True, False):
            ours = model.generate(ids, max_new_tokens=12, use_cache=use_cache)
            assert ours.tolist() == ref.tolist(), f"use_cache={use_cache}, prompt {prompt!r}"


def test_cached_decoding_equals_the_full_forward(model, model64):
    """The plain path is the full forward in float32; the truth, the full forward in float64."""
    ids = torch.randint(0, 1000, (2, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(ids).logits  # (b, t, V)
        truth = model64(ids).logits
        caches = model.new_kv_caches(2, 11)
        steps = [model(ids[:, :5], kv_caches=caches).logits]
        for j in range(5, 11):
            steps.append(model(ids[:, j : j + 1], kv_caches=caches).logits)
    assert len(caches[0]) == 11
    assert_within(torch.cat(steps, dim=1), truth, full, what="cached logits")


def test_padding_and_batching_change_nothing(model, model64, batch):
    """Right and left padding give each real token the result it has alone: as close to the
    float64 truth as the sentence's own unpadded float32 forward."""
    encs = batch.encodings
    t = batch.input_ids.shape[1]
    left_ids = torch.zeros_like(batch.input_ids)
    left_mask = torch.zeros_like(batch.attention_mask)
    for i, e in enumerate(encs):
        left_ids[i, t - len(e):] = torch.tensor(e.ids)
        left_mask[i, t - len(e):] = 1
    with torch.no_grad():
        right = model(batch.input_ids, batch.attention_mask).logits
        left = model(left_ids, left_mask).logits
        for i, e in enumerate(encs):
            alone = model(torch.tensor([e.ids])).logits[0]  # (t_i, V)
            truth = model64(torch.tensor([e.ids])).logits[0]
            assert_within(right[i, : len(e)], truth, alone, what=f"right-padded {i}")
            assert_within(left[i, t - len(e):], truth, alone, what=f"left-padded {i}")
    # and batched (left-padded) greedy generation equals one prompt at a time
    gen = model.generate(left_ids, 6, attention_mask=left_mask)
    for i, e in enumerate(encs):
        alone = model.generate(torch.tensor([e.ids]), 6)[0]
        assert gen[i, t - len(e):].tolist() == alone.tolist()


def test_causality_by_gradient(model):
    """The logits at position i do not depend on the tokens after i."""
    ids = torch.tensor([[5, 17, 300, 42, 7]])
    emb = model.wte(ids).detach().requires_grad_(True)
    x = model.wpe(emb)
    for layer in model.layers:
        x = layer(x, is_causal=True).hidden
    model.lm_head(model.decoder.norm(x))[0, 2].sum().backward()
    grad = emb.grad[0].abs().sum(-1)  # (t,)
    assert torch.all(grad[3:] == 0) and torch.all(grad[:3] > 0)


def test_too_long_input_is_a_clear_error(model):
    with pytest.raises(QkvError, match="65 tokens.*at most 64"):
        model(torch.zeros(1, 65, dtype=torch.long))
    with pytest.raises(QkvError, match=r"prompt \(60 tokens\) \+ max_new_tokens \(10\) = 70.*at most 64"):
        model.generate(torch.zeros(1, 60, dtype=torch.long), 10)
    with pytest.raises(QkvError, match="text is 65 tokens; .* takes at most 64"):
        model.tokenizer.encode("a" + " a" * 64)


@pytest.mark.parametrize("change, message", [
    ({"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx=True is not supported"),
    ({"add_cross_attention": True}, "add_cross_attention"),
    ({"activation_function": "gelu_fast"}, "activation_function 'gelu_fast' is not supported"),
    ({"architectures": ["GPT2ForSequenceClassification"]}, "GPT2ForSequenceClassification"),
    ({"n_embd": 65, "n_head": 4}, r"n_embd \(65\) must be divisible by n_head \(4\)"),
])
def test_config_rejects_unsupported(change, message):
    with pytest.raises(QkvError, match=message):
        GPT2Config.from_dict({"model_type": "gpt2", **change})


def test_config_reads_hf_keys(checkpoint):
    import json

    with open(os.path.join(checkpoint[0], "config.json")) as f:
        c = GPT2Config.from_dict(json.load(f))
    assert (c.n_layer, c.n_head, c.n_embd, c.vocab_size, c.n_positions, c.inner_dim) == (2, 4, 64, 1000, 64, 256)
    assert c.activation_function == "gelu_tanh"
