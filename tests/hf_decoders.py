"""Tiny random Llama-family checkpoints built by ``transformers``, and the comparison of qkv's
forward with transformers' eager one (shared by tests/models/test_llama.py, test_mistral.py,
test_qwen.py and test_generate.py).

A checkpoint directory holds what ``save_pretrained`` writes (``config.json``,
``model.safetensors``) and a byte-level BPE ``tokenizer.json`` trained here on a few sentences.

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
    "Attention is all you need, said the paper.",
    "Queries, keys and values: the model attends to every earlier token.",
    "Ünïcödé text — with dashes and a café.",
] * 3
PROMPTS = ["The quick brown fox", "Attention is", "Queries, keys and values: the model"]
VOCAB = 300


def save_tokenizer(path: str) -> None:
    from tokenizers import ByteLevelBPETokenizer

    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(CORPUS, vocab_size=VOCAB, min_frequency=1, special_tokens=["<s>", "</s>"])
    tok.save(os.path.join(path, "tokenizer.json"))


def make_checkpoint(path, config_class: str, model_class: str, *, seed: int = 0, **kw):
    """Save a random ``transformers`` model built from ``config_class(**kw)`` into ``path``;
    return (directory, the model re-read with the eager attention)."""
    import transformers

    path = str(path)
    save_tokenizer(path)
    torch.manual_seed(seed)
    kw = dict(vocab_size=VOCAB, initializer_range=0.2, bos_token_id=None, eos_token_id=None,
              pad_token_id=None) | kw
    config = getattr(transformers, config_class)(**kw)
    cls = getattr(transformers, model_class)
    model = cls(config).eval()
    with torch.no_grad():  # random norms' gains and biases, so a swapped one cannot hide
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith(".bias"):
                p.copy_(1 + 0.3 * torch.randn_like(p) if "norm" in name else 0.3 * torch.randn_like(p))
    model.save_pretrained(path)
    return path, cls.from_pretrained(path, attn_implementation="eager").eval()


def hf_outputs(hf, ids, attention_mask=None, position_ids=None):
    """(float32 output, float64 output) of transformers: the plain path and the truth."""
    hf64 = twin(hf, torch.float64)
    kw = dict(input_ids=ids, attention_mask=attention_mask, position_ids=position_ids,
              output_hidden_states=True, output_attentions=True)
    with torch.no_grad():
        return hf(**kw), hf64(**kw)


def assert_equals_transformers(model, hf, ids, attention_mask=None):
    """qkv's logits, every hidden state and every attention probability (of real tokens) are
    as close to transformers' float64 as transformers' float32 is (×2 + 2 ulp)."""
    plain, ref = hf_outputs(hf, ids, attention_mask)
    with torch.no_grad():
        ours = model(ids, attention_mask, output_hidden_states=True, trace_rows=slice(None))
    real = torch.ones_like(ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    assert_within(ours.logits[real], ref.logits[real], plain.logits[real], what="logits")
    L = len(model.layers)
    assert len(ours.hidden_states) == len(ref.hidden_states) == L + 1
    for i in range(L):  # HF's last hidden state is after the final norm; ours before it
        assert_within(ours.hidden_states[i][real], ref.hidden_states[i][real],
                      plain.hidden_states[i][real], what=f"hidden_states[{i}]")
    assert_within(model.decoder.norm(ours.hidden_states[L])[real], ref.hidden_states[L][real],
                  plain.hidden_states[L][real], what="final norm")
    pair = real[:, None, :, None] & real[:, None, None, :]  # (b, 1, t, t)
    for i, (trace, p, r) in enumerate(zip(ours.traces, plain.attentions, ref.attentions)):
        w = trace.self_attn.attention.weights  # (b, h, t, t)
        assert w.shape == r.shape
        assert_within(w, r, p, where=pair, what=f"layer {i} attention probabilities")
        assert torch.all(w.triu(diagonal=1) == 0)  # causal: nothing from the future
    return ours


def assert_explain_rounding(path, text: str, **where) -> None:
    """``qkv explain``'s float64 recomputation of one head matches the float32 forward's stages
    (query, keys, values, scores, weights, output) within the forward's own rounding.

    Each ``diffs`` entry is the rounding that one stage of the forward made (its inputs are
    the forward's own). The same code run on the model loaded in float64 makes the same
    roundings 2⁻²⁹ times smaller, so tolerance.py's :func:`agree_bound` rule applies the other
    way round: the float32 difference may be 4 × the float64 one × eps32/eps64, + 2 ulp.
    """
    from qkv.explain import explain_head
    from qkv.models import load
    from tolerance import ulp, unit_roundoff_ratio

    st = explain_head(load(path), text, **where)
    fine = explain_head(load(path, dtype=torch.float64), text, **where)
    ratio = unit_roundoff_ratio(torch.float32, torch.float64)  # 2²⁹
    for stage, diff in st.diffs.items():
        tol = 4 * fine.diffs[stage] * ratio + 2 * ulp(getattr(st, stage), torch.float32)
        assert diff <= tol, f"{stage}: float32 forward vs float64 recomputation {diff:.3g} > {tol:.3g}"
