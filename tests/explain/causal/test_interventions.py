"""``ablate`` and ``patch`` (qkv.explain.interventions): zero ablation equals transformers with
the head's slice of the output projection's input zeroed (MiniLM, a transformers-built Llama and
GPT-2); mean ablation and patching against their definitions; one clear error per bad input."""

from __future__ import annotations

import pytest
import torch

from qkv.explain.causal.interventions import ablate, patch
from qkv.explain.wording import ArgumentError
from tolerance import assert_within, twin

TEXT = "The dog found some pizza next to the baby and ate it"


@pytest.fixture(scope="module")
def lm():
    import qkv

    return qkv.load("lm")  # the shipped 2-layer, 2-head decoder


# -- bad input --------------------------------------------------------------------------------------
@pytest.mark.parametrize("heads, message", [
    ([(6, 0)], r"heads has \(6, 0\), which all-MiniLM-L6-v2 does not have: layers 0–5, heads 0–11"),
    ([(0, 12)], r"heads has \(0, 12\)"),
    ([(-1, 0)], r"heads has \(-1, 0\)"),
    ([(0,)], r"heads must be \(layer, head\) pairs"),
    ([(0, 1.5)], r"heads must be \(layer, head\) pairs"),
    (["0,1"], r"heads must be \(layer, head\) pairs"),
])
def test_unknown_heads_are_named(model, heads, message):
    with pytest.raises(ArgumentError, match=message) as e:
        ablate(model, TEXT, heads=heads)
    assert e.value.argument == "heads" and isinstance(e.value, ValueError)


def test_bad_mode_and_mean_over_one_token(lm):
    with pytest.raises(ArgumentError, match=r"unknown mode 'half'; known: zero, mean"):
        ablate(lm, "baka bala", heads=[(0, 0)], mode="half")
    with pytest.raises(ArgumentError, match=r"mode 'mean' .* a 1-token text has nothing to average"):
        ablate(lm, [5], heads=[(0, 0)], mode="mean")


def test_bad_ids(lm):
    with pytest.raises(ArgumentError, match=r"text_or_ids must be a text or one sequence"):
        ablate(lm, torch.zeros(2, 3, dtype=torch.long), heads=[])


def test_patch_needs_equal_lengths(lm):
    with pytest.raises(ArgumentError, match=r"corrupted has 3 tokens and clean 2; .* equally long"):
        patch(lm, [1, 2], [1, 2, 3], heads=[(0, 0)])


# -- zero ablation equals transformers with the head's slice of out_proj's input zeroed -------------
def transformers_ablated(hf, projections, heads, head_dim, call, replace=None):
    """``call(hf)`` with a pre-hook on each layer's output projection (``projections[layer]``)
    setting the input columns of ``heads`` to 0 — or to ``replace(layer, head, slice)``."""
    handles = []
    for layer in {l for l, _ in heads}:
        cols = [h for l, h in heads if l == layer]

        def hook(module, args, layer=layer, cols=cols):
            x = args[0].clone()
            for h in cols:
                part = x[..., h * head_dim:(h + 1) * head_dim]
                x[..., h * head_dim:(h + 1) * head_dim] = 0 if replace is None else replace(layer, h, part)
            return (x, *args[1:])

        handles.append(projections[layer].register_forward_pre_hook(hook))
    try:
        with torch.no_grad():
            return call(hf)
    finally:
        for h in handles:
            h.remove()


HEADS = [(0, 3), (2, 0), (2, 7), (5, 11)]


def test_zero_ablation_equals_transformers_minilm(model, hf):
    ids = torch.tensor([model.tokenizer.encode(TEXT).ids])
    got = ablate(model, TEXT, heads=HEADS).hidden
    call = lambda m: m(ids).last_hidden_state[0]  # noqa: E731

    def peer(dtype):
        m = twin(hf, dtype)
        return transformers_ablated(m, [l.attention.output.dense for l in m.encoder.layer], HEADS,
                                    32, call)

    assert_within(got, peer(torch.float64), peer(torch.float32), what="MiniLM, 4 heads zeroed")
    assert (got - ablate(model, TEXT, heads=[]).hidden).abs().max() > 1e-3  # it did something


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """{"llama"|"gpt2": (qkv model, transformers model)} built by transformers, saved, loaded."""
    import qkv
    from hf_decoders import make_checkpoint

    out = {}
    path, hf = make_checkpoint(tmp_path_factory.mktemp("llama"), "LlamaConfig", "LlamaForCausalLM",
                               hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    out["llama"] = (qkv.load(path), hf, lambda m: [l.self_attn.o_proj for l in m.model.layers], 8)
    path, hf = make_checkpoint(tmp_path_factory.mktemp("gpt2"), "GPT2Config", "GPT2LMHeadModel",
                               n_embd=32, n_layer=3, n_head=4, n_positions=32)
    out["gpt2"] = (qkv.load(path), hf, lambda m: [b.attn.c_proj for b in m.transformer.h], 8)
    return out


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("mode", ["zero", "mean"])
def test_ablation_equals_transformers_decoders(tiny, family, mode):
    model, hf, projections, d = tiny[family]
    ids = torch.tensor([model.tokenizer.encode("Attention is all you need, said the paper.").ids])
    heads = [(1, 2)] if mode == "mean" else [(0, 1), (1, 2), (1, 3), (2, 0)]
    got = ablate(model, ids, heads=heads, mode=mode).logits
    # mean: one layer's head, so its clean slice is the one this forward computes (no earlier edit)
    mean = (lambda layer, h, part: part.mean(dim=-2, keepdim=True).expand_as(part)) if mode == "mean" else None

    def peer(dtype):
        m = twin(hf, dtype)
        return transformers_ablated(m, projections(m), heads, d, lambda m: m(ids).logits[0], mean)

    assert_within(got, peer(torch.float64), peer(torch.float32), what=f"{family}, {mode} ablation")
    assert (got - ablate(model, ids, heads=[]).logits).abs().max() > 1e-4


def test_patching_equals_transformers_with_the_clean_slices(tiny):
    model, hf, projections, d = tiny["llama"]
    clean = torch.tensor([model.tokenizer.encode("The quick brown fox jumps").ids])
    corrupted = clean.clone()
    corrupted[0, 2:5] = torch.tensor([7, 8, 9])  # three tokens swapped: the same length
    heads = [(0, 1), (2, 3)]
    loss = lambda logits, ids: torch.nn.functional.cross_entropy(  # noqa: E731
        logits[0, :-1].double(), ids[0, 1:]).item()

    def peer(dtype):  # (clean, corrupted, patched) losses through transformers' own forward
        m, saved = twin(hf, dtype), {}

        def keep(layer, h, part):
            saved[layer, h] = part.clone()
            return part

        transformers_ablated(m, projections(m), heads, d, lambda m: m(clean), keep)
        patched = transformers_ablated(m, projections(m), heads, d, lambda m: m(corrupted).logits,
                                       lambda layer, h, part: saved[layer, h])
        with torch.no_grad():
            return torch.tensor([loss(m(clean).logits, clean), loss(m(corrupted).logits, clean),
                                 loss(patched, clean)], dtype=torch.float64)

    result = patch(twin(model, torch.float64), clean, corrupted, heads=heads, metric=loss)
    got = torch.tensor([result.clean, result.corrupted, result.patched], dtype=torch.float64)
    # transformers rounds to float32 inside its RMSNorm even in float64: bound by its float32 run
    assert_within(got, peer(torch.float64), peer(torch.float32), factor=4.0, what="patched losses")
    expected = (result.patched - result.corrupted) / (result.clean - result.corrupted)
    assert result.recovered == expected
    assert patch(model, clean, corrupted, heads=[]).recovered == 0.0  # nothing patched, nothing back
