"""Tiny random encoder checkpoints (RoBERTa, DistilBERT) built by ``transformers``, and the
comparison of qkv's forward with transformers' eager one (shared by tests/models/test_roberta.py
and test_distilbert.py).

Tolerances are derived (``tolerance.py``): the truth is transformers in float64; qkv in
float32 may be at most twice as far from it as transformers in float32 is (plus 2 ulp).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from tolerance import assert_within, twin

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "The dog found some pizza next to the baby and ate it.",
    "Queries, keys and values: every token attends to every other token.",
    "Ünïcödé text — with dashes and a café.",
] * 3
TEXTS = ["The quick brown fox", "Attention is all you need, said the paper.",
         "Every token attends to every other token — a café, too."]


def randomise(model: torch.nn.Module, seed: int = 0) -> None:
    """Norm gains near 1 and biases away from 0, so a swapped norm or bias cannot hide."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm.weight" in name or "layer_norm.weight" in name:
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.3 * torch.randn(p.shape, generator=g))


def save_model(path: str, config_class: str, model_class: str, **kw):
    """A random ``transformers`` encoder saved into ``path``; returns it re-read with the
    eager attention (which returns the probabilities)."""
    import transformers

    torch.manual_seed(0)
    config = getattr(transformers, config_class)(initializer_range=0.2, **kw)
    cls = getattr(transformers, model_class)
    model = cls(config).eval()
    randomise(model)
    model.save_pretrained(path)
    return cls.from_pretrained(path, attn_implementation="eager").eval()


def assert_equals_transformers(model, hf, ids, attention_mask, *, traced: bool = True):
    """qkv's every hidden state and (traced) every attention probability of real tokens are as
    close to transformers' float64 as transformers' float32 is (×2 + 2 ulp)."""
    kw = dict(input_ids=ids, attention_mask=attention_mask, output_hidden_states=True,
              output_attentions=True)
    with torch.no_grad():
        plain, ref = hf(**kw), twin(hf, torch.float64)(**kw)
        ours = model(ids, attention_mask, output_hidden_states=True,
                     trace_rows=slice(None) if traced else None)
    real = attention_mask.bool()  # (b, t)
    assert_within(ours.last_hidden_state[real], ref.last_hidden_state[real],
                  plain.last_hidden_state[real], what="last_hidden_state")
    assert len(ours.hidden_states) == len(ref.hidden_states) == len(model.layers) + 1
    for i, (h, r, p) in enumerate(zip(ours.hidden_states, ref.hidden_states, plain.hidden_states)):
        assert_within(h[real], r[real], p[real], what=f"hidden_states[{i}]")
    if not traced:
        return ours
    pair = real[:, None, :, None] & real[:, None, None, :]  # (b, 1, t, t)
    for i, (trace, p, r) in enumerate(zip(ours.traces, plain.attentions, ref.attentions)):
        w = trace.self_attn.attention.weights  # (b, h, t, t)
        assert w.shape == r.shape
        assert_within(w, r, p, where=pair, what=f"layer {i} attention probabilities")
    return ours


def mean_pooled(hf, ids, attention_mask) -> torch.Tensor:
    """sentence-transformers' recipe on transformers' output: the mean over real tokens,
    L2-normalised. (n, E)"""
    with torch.no_grad():
        x = hf(input_ids=ids, attention_mask=attention_mask).last_hidden_state
    m = attention_mask[..., None].to(x.dtype)
    return torch.nn.functional.normalize((x * m).sum(1) / m.sum(1), dim=-1)


def assert_packed_embeddings_equal_transformers(model, hf, texts) -> None:
    """``model.embed(texts)`` runs packed (varlen, positions restarting per text): the same vectors
    as transformers' padded forward, mean-pooled (float64 truth, float32 transformers plain)."""
    batch = model.tokenizer.encode_batch(texts)
    got = model.embed(texts)
    plain = mean_pooled(hf, batch.input_ids, batch.attention_mask)
    truth = mean_pooled(hf.double(), batch.input_ids, batch.attention_mask)
    hf.float()
    assert_within(got, truth, plain, what="sentence embeddings")
