"""generate() through attn_implementation="qkv" equals eager token for token (KV cache:
decoding steps reach qkv as bottom-right-aligned structure), and every attention layer routes
through qkv."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")  # the qkv[hf] extra
import torch  # noqa: E402

import qkv.hf.attention  # noqa: E402
from archs import DECODERS, SEQ2SEQ, build, twins  # noqa: E402


PROMPT = torch.tensor([[5, 17, 3, 44, 9, 81, 23], [0, 0, 19, 60, 4, 33, 90]])
PADDING = torch.tensor([[1] * 7, [0, 0] + [1] * 5])  # left padding: key padding in qkv


@pytest.mark.parametrize("name", ["llama", "gemma2", "gpt_oss", "gpt2"])
def test_generate_equals_eager(name):
    _, eager, ours = twins(build(DECODERS, name))
    kw = dict(input_ids=PROMPT, attention_mask=PADDING, max_new_tokens=12, do_sample=False,
              pad_token_id=0)
    with torch.no_grad():
        want, got = eager.generate(**kw), ours.generate(**kw)
    assert torch.equal(got, want)


def test_seq2seq_generate_equals_eager():
    _, eager, ours = twins(build(SEQ2SEQ, "bart"))
    kw = dict(input_ids=PROMPT[:1], max_new_tokens=10, do_sample=False, num_beams=1)
    with torch.no_grad():
        assert torch.equal(ours.generate(**kw), eager.generate(**kw))


@pytest.mark.parametrize("table,name,calls", [(DECODERS, "llama", 2), (SEQ2SEQ, "t5", 6)])
def test_every_layer_goes_through_qkv(monkeypatch, table, name, calls):
    """Two layers each: t5 has 2 encoder self, 2 decoder self, 2 cross attentions."""
    seen = []
    real = qkv.hf.attention.scaled_dot_product_attention
    monkeypatch.setattr(qkv.hf.attention, "scaled_dot_product_attention",
                        lambda *a, **k: seen.append(k["mask"]) or real(*a, **k))
    _, _, ours = twins(build(table, name))
    extra = dict(decoder_input_ids=PROMPT[:, :3]) if table is SEQ2SEQ else {}
    with torch.no_grad():
        ours(input_ids=PROMPT, **extra)
    assert len(seen) == calls
    assert all(m.dense is None for m in seen)  # structure, never a drawn (t × s) mask
