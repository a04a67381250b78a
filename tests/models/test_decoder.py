"""DecoderLM, the base GPT-2, GPT-NeoX and Llama share: one forward, one cache layout, one set of
input checks. The families' own tests compare each with transformers; these check what the base
promises every family: caches shaped like the layers' keys (h_kv under GQA), ``logits_to_keep``
equal to the last rows of the full logits, cached decoding equal to the full pass, the same
errors for bad ids, caches, lengths and masks, and a padded row equal to the row alone.
"""

from __future__ import annotations

import pytest
import torch

from qkv.errors import QkvError
from qkv.models import GPT2Config, GPT2Model, GPTNeoXConfig, GPTNeoXModel, LlamaConfig, LlamaModel
from qkv.models.decoder import DecoderLM
from tolerance import assert_within, twin

V = 53


def _models():
    torch.manual_seed(0)
    return {
        "gpt2": GPT2Model(GPT2Config(vocab_size=V, n_positions=24, n_embd=24, n_layer=2, n_head=3)),
        "gpt-neox": GPTNeoXModel(GPTNeoXConfig(vocab_size=V, hidden_size=24, intermediate_size=40,
                                               num_hidden_layers=2, num_attention_heads=3,
                                               max_position_embeddings=24)),
        "llama-gqa": LlamaModel(LlamaConfig(vocab_size=V, hidden_size=24, intermediate_size=40,
                                            num_hidden_layers=2, num_attention_heads=6,
                                            num_key_value_heads=2, max_position_embeddings=24)),
    }


MODELS = _models()


@pytest.mark.parametrize("name", MODELS)
def test_caches_follow_the_layers_keys(name):
    model = MODELS[name]
    assert isinstance(model, DecoderLM)
    caches = model.new_kv_caches(batch_size=2, max_len=11)
    assert len(caches) == len(model.layers)
    x = torch.randn(2, 5, model.output_weight.shape[1])  # (b, t, E)
    for layer, cache in zip(model.layers, caches):
        k = layer.self_attn.k_proj(x)  # (b, t, h_kv · d)
        b, h_kv, s, d = cache.k.shape
        assert (b, s, h_kv * d) == (2, 11, k.shape[-1])


@pytest.mark.parametrize("name", MODELS)
def test_logits_to_keep_and_the_cache_equal_the_full_pass(name):
    """float32 against float64 truth, within twice the float32 full pass's own error."""
    model = MODELS[name]
    ids = torch.randint(0, V, (2, 9))
    ref = twin(model, torch.float64)(ids).logits  # (b, t, V)
    plain = model(ids).logits
    assert_within(model(ids, logits_to_keep=3).logits, ref[:, -3:], plain[:, -3:], what="kept logits")
    caches = model.new_kv_caches(2, 9)
    first = model(ids[:, :5], kv_caches=caches).logits  # (b, 5, V)
    rest = model(ids[:, 5:], kv_caches=caches).logits  # (b, 4, V)
    assert_within(torch.cat([first, rest], dim=1), ref, plain, what="cached logits")


@pytest.mark.parametrize("name", MODELS)
def test_a_left_padded_row_equals_the_row_alone(name):
    model = MODELS[name]
    ids = torch.randint(0, V, (2, 7))
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[0, :3] = 0  # row 0: 3 padding tokens, then 4 real ones
    padded = model(ids, mask).logits[0, 3:]  # (4, V)
    ref = twin(model, torch.float64)(ids[:1, 3:]).logits[0]
    assert_within(padded, ref, model(ids[:1, 3:]).logits[0], what="padded row")


@pytest.mark.parametrize("name", MODELS)
def test_bad_input_is_named(name):
    model = MODELS[name]
    with pytest.raises(ValueError, match="input_ids must be an integer tensor"):
        model(torch.zeros(1, 3))
    with pytest.raises(QkvError, match=rf"token ids must be in \[0, {V}\)"):
        model(torch.tensor([[1, V]]))
    with pytest.raises(QkvError, match="takes at most 24"):
        model(torch.zeros(1, 25, dtype=torch.long))
    with pytest.raises(ValueError, match="kv_caches must hold one KVCache per layer"):
        model(torch.tensor([[1]]), kv_caches=model.new_kv_caches(1, 4)[:1])
    with pytest.raises(ValueError, match=r"attention_mask must be \(batch, past \+ new tokens\)"):
        model(torch.tensor([[1, 2]]), torch.ones(1, 3))


@pytest.mark.parametrize("name", MODELS)
def test_position_ids_are_the_positions_the_model_sees(name):
    """Explicit positions 0…t−1 are the default exactly; a padded row's counted positions given
    explicitly change nothing; shifted positions move GPT-2's learned table (absolute) but not a
    rotary model's scores (RoPE is relative: q·k depends on the distance alone)."""
    model = MODELS[name].eval()
    ids = torch.randint(0, V, (2, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        plain = model(ids).logits
        assert torch.equal(model(ids, position_ids=torch.arange(9)).logits, plain)
        mask = torch.ones(2, 9, dtype=torch.long)
        mask[0, :3] = 0  # left padding: row 0's real tokens sit at positions 0…5
        padded = model(ids, mask).logits
        counted = (mask.cumsum(-1) - 1).clamp(min=0)
        assert torch.equal(model(ids, mask, position_ids=counted).logits, padded)
        shifted = model(ids, position_ids=torch.arange(9) + 11).logits
    if name == "gpt2":
        assert (shifted - plain).abs().max() > 1e-3  # other rows of the position table
    else:
        truth = twin(model, torch.float64)
        with torch.no_grad():
            ref = truth(ids).logits
        # shifted in fp32 is as close to the unshifted fp64 truth as the plain fp32 forward is
        assert_within(shifted.double(), ref, plain.double(), factor=4.0)


@pytest.mark.parametrize("bad", [torch.arange(8), torch.arange(9.0), torch.arange(9) + 20,
                                 torch.arange(9) - 1, [0, 1]])
def test_bad_position_ids_are_value_errors(bad):
    model = MODELS["llama-gqa"]
    with pytest.raises(ValueError, match="position_ids"):
        model(torch.zeros(1, 9, dtype=torch.long), position_ids=bad)
