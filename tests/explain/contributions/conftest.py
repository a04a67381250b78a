"""Small random models for the contribution methods' tests, beside the session's MiniLM pair
(``model``/``hf`` in tests/conftest.py).

* ``gpt2_pair``: a random 2-layer GPT-2 built by ``transformers`` (eager attention) and the same
  weights in qkv's :class:`~qkv.models.GPT2Model` — pre-norm LayerNorm, causal.
* ``llama``: a random 2-layer :class:`~qkv.models.llama.LlamaModel` with grouped-query attention
  (4 query heads, 2 key/value heads), RMSNorm, SwiGLU, rotary, no biases.
* ``rms_post``: a post-norm stack of ``TransformerLayer.build(norm="rms", gated=True)`` layers,
  the one layout the shipped models lack (post-norm RMSNorm), behind the same forward signature.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from qkv.attention.attention_mask import AttentionMask
from qkv.models.outputs import EncoderOutput
from qkv.modules import TransformerLayer, TransformerStack

VOCAB = 100


@pytest.fixture(scope="module")
def gpt2_pair():
    """(qkv GPT2Model, transformers GPT2LMHeadModel) with the same random weights."""
    transformers = pytest.importorskip("transformers")
    from qkv.models.gpt2 import GPT2Config, GPT2Model, gpt2_convert

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_head=4, n_embd=32, vocab_size=VOCAB, n_positions=32,
                                  initializer_range=0.2, bos_token_id=None, eos_token_id=None)
    hf = transformers.GPT2LMHeadModel._from_config(cfg, attn_implementation="eager").eval()
    config = GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=4)
    model = GPT2Model(config).eval()
    tensors = {k.removeprefix("transformer."): v for k, v in hf.state_dict().items()}
    model.load_state_dict(gpt2_convert(tensors, config))
    return model, hf


@pytest.fixture(scope="module")
def llama():
    from qkv.models.llama import LlamaConfig, LlamaModel

    torch.manual_seed(1)
    model = LlamaModel(LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=64)).eval()
    with torch.no_grad():  # random norms' γ, so the RMSNorm scale is not the identity
        for p in model.parameters():
            if p.ndim == 1:
                p.uniform_(0.5, 1.5)
    return model


class PostNormRMS(nn.Module):
    """An encoder of post-norm RMSNorm + SwiGLU layers with the models' forward signature."""

    def __init__(self, layers: int = 2, dim: int = 32, heads: int = 4):
        super().__init__()
        self.name = "post-norm-rms"
        self.embed = nn.Embedding(VOCAB, dim)
        self.stack = TransformerStack(TransformerLayer.build(dim, heads, 64, norm="rms", gated=True,
                                                             activation="silu", norm_first=False)
                                      for _ in range(layers))

    @property
    def layers(self):
        return self.stack.layers

    def forward(self, ids, attention_mask=None, *, trace_rows=None, output_hidden_states=False,
                interventions=None):
        out = self.stack(self.embed(ids), mask=AttentionMask(), trace_rows=trace_rows,
                         output_hidden_states=output_hidden_states, interventions=interventions)
        return EncoderOutput(out.last_hidden_state, out.hidden_states, out.traces)


@pytest.fixture(scope="module")
def rms_post():
    torch.manual_seed(2)
    model = PostNormRMS().eval()
    with torch.no_grad():
        for layer in model.layers:
            for norm in (layer.norm1, layer.norm3):
                norm.weight.uniform_(0.5, 1.5)
    return model


@pytest.fixture(scope="module")
def ids():
    """(1, 11) token ids for the random models: an awkward length."""
    return torch.randint(0, VOCAB, (1, 11), generator=torch.Generator().manual_seed(3))
