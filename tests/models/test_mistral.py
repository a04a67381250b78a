"""qkv's Mistral against transformers: Llama plus a sliding window (tiny random checkpoints).

The window (4) is shorter than the inputs (up to 13 tokens), so tokens far back are excluded and
the comparison fails if the window is off by one or ignored.
"""

from __future__ import annotations

import pytest
import torch

from hf_decoders import assert_equals_transformers, make_checkpoint
from qkv.errors import QkvError
from qkv.models import load
from qkv.models.llama import LlamaModel
from qkv.models.mistral import mistral_config
from tolerance import assert_within, twin

transformers = pytest.importorskip("transformers")

WINDOW = 4


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("mistral"), "MistralConfig", "MistralForCausalLM",
                           hidden_size=36, intermediate_size=50, num_hidden_layers=2,
                           num_attention_heads=6, num_key_value_heads=2, head_dim=8,
                           max_position_embeddings=64, sliding_window=WINDOW)


@pytest.fixture(scope="module")
def model(checkpoint):
    return load(checkpoint[0])


def test_loads_as_llama_with_a_window(model):
    assert isinstance(model, LlamaModel) and model.config.sliding_window == WINDOW


def test_equals_transformers(model, checkpoint):
    ids = torch.randint(0, 300, (2, 13), generator=torch.Generator().manual_seed(5))
    out = assert_equals_transformers(model, checkpoint[1], ids)
    w = out.traces[0].self_attn.attention.weights  # (b, h, t, t)
    assert torch.all(w.tril(diagonal=-WINDOW) == 0)  # nothing WINDOW or more tokens back
    assert torch.all(w.diagonal(offset=-(WINDOW - 1), dim1=-2, dim2=-1) > 0)


def test_right_padded_batch_equals_transformers(model, checkpoint):
    """Fewer pads than the window: with more, a pad query row sees only pads, and transformers'
    float64 eager path (the truth here) turns such a row into NaN (its float32 path does not)."""
    ids = torch.randint(0, 300, (2, 13), generator=torch.Generator().manual_seed(6))
    mask = torch.ones_like(ids)
    mask[1, 13 - (WINDOW - 1):] = 0
    assert_equals_transformers(model, checkpoint[1], ids, mask)


def test_cached_decoding_keeps_the_window(model):
    model64 = twin(model, torch.float64)
    ids = torch.randint(0, 300, (1, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full, truth = model(ids).logits, model64(ids).logits
        caches = model.new_kv_caches(1, 12)
        steps = [model(ids[:, :3], kv_caches=caches).logits]
        steps += [model(ids[:, j : j + 1], kv_caches=caches).logits for j in range(3, 12)]
    assert_within(torch.cat(steps, dim=1), truth, full, what="cached logits")


def test_bad_window_is_named():
    with pytest.raises(QkvError, match="sliding_window must be a positive integer or null, got 0"):
        mistral_config({"hidden_size": 32, "num_attention_heads": 4, "sliding_window": 0})
