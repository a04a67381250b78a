"""Every architecture of archs.py through attn_implementation="qkv": logits and every layer's
attention weights equal eager's within derived tolerances (truth: eager in float64)."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")  # the qkv[hf] extra
import torch  # noqa: E402

from archs import DECODERS, ENCODERS, SEQ2SEQ, build, twins  # noqa: E402
from tolerance import assert_within  # noqa: E402


# transformers (5.x) consumes output_attentions before these architectures' attention call
# (GPT2Model.forward pops it; OPT's and StableLM's attention take it as a named argument), so
# qkv's attention is not asked for weights there — as transformers' own sdpa is not: their
# qkv twin returns none (qkv reads no private recorder state to guess)
FLAG_CONSUMED = {"gpt2", "opt", "stablelm"}

IDS = torch.tensor([[5, 17, 3, 44, 9, 81, 23, 6, 70, 12, 8, 31, 2],
                    [7, 7, 19, 60, 4, 33, 90, 15, 11, 52, 28, 3, 41]])  # 13 > every window


def run(model, **inputs):
    with torch.no_grad():
        return model(**inputs, output_attentions=True)


def check(truth, plain, got, fields):
    for field in fields:
        a, b, c = (getattr(o, field) for o in (truth, plain, got))
        if isinstance(a, torch.Tensor):
            assert_within(c, a, b, what=field)
            continue
        assert len(a) == len(c) and all(x is not None for x in c), f"{field}: a layer gave no weights"
        for layer, (x, y, z) in enumerate(zip(a, b, c)):
            assert_within(z, x, y, what=f"{field}[{layer}]")


@pytest.mark.parametrize("name", sorted(DECODERS))
def test_decoder_matches_eager(name):
    models = twins(build(DECODERS, name))
    outs = [run(m, input_ids=IDS) for m in models]
    if name in FLAG_CONSUMED:
        assert outs[2].attentions == () and len(outs[0].attentions) > 0
        check(*outs, ["logits"])
        return
    check(*outs, ["logits", "attentions"])


@pytest.mark.parametrize("name", sorted(ENCODERS))
def test_encoder_matches_eager(name):
    models = twins(build(ENCODERS, name))
    mask = torch.ones_like(IDS)
    mask[1, -4:] = 0  # padding reaches qkv as key padding
    outs = [run(m, input_ids=IDS, attention_mask=mask) for m in models]
    real = mask.bool()[:, :, None]
    for field in ("last_hidden_state",):
        a, b, c = (getattr(o, field) for o in outs)
        assert_within(c, a, b, where=real, what=field)
    for layer, (x, y, z) in enumerate(zip(*(o.attentions for o in outs))):
        assert_within(z, x, y, where=real[:, None].expand(-1, 4, -1, IDS.shape[1]), what=f"attentions[{layer}]")


@pytest.mark.parametrize("name", sorted(SEQ2SEQ))
def test_seq2seq_matches_eager(name):
    models = twins(build(SEQ2SEQ, name))
    dec = IDS[:, :9]
    outs = [run(m, input_ids=IDS, decoder_input_ids=dec) for m in models]
    check(*outs, ["logits", "encoder_attentions", "decoder_attentions", "cross_attentions"])


@pytest.mark.parametrize("name", ["llama", "gemma2", "gpt_oss", "mistral"])
def test_padded_decoder_matches_eager(name):
    """Padding reaches qkv as key padding. Right padding: a left-padded row has no key at all,
    and the float64 truth (eager in float64) turns its mask's float64 minimum into −inf in its
    float32 softmax, so that row is NaN and its next layer spreads it to every row (0 · NaN);
    generate() covers left padding (test_generate.py). Padded rows are left out."""
    models = twins(build(DECODERS, name))
    mask = torch.ones_like(IDS)
    mask[1, -4:] = 0
    outs = [run(m, input_ids=IDS, attention_mask=mask) for m in models]
    real = mask.bool()
    a, b, c = (o.logits for o in outs)
    assert_within(c, a, b, where=real[:, :, None].expand_as(a), what="logits")
    for layer, (x, y, z) in enumerate(zip(*(o.attentions for o in outs))):
        rows = real[:, None, :, None].expand_as(x)
        assert_within(z, x, y, where=rows, what=f"attentions[{layer}]")
