"""generate() through attn_implementation="qkv" equals eager token for token (KV cache:
decoding steps reach qkv as bottom-right-aligned structure; a static cache: keys up to its full
length, the query offset a 0-d tensor, each step's mask built ahead and handed back in), and
every attention layer routes through qkv."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")  # the qkv[hf] extra
import torch  # noqa: E402

import qkv.hf.attention  # noqa: E402
from archs import DECODERS, SEQ2SEQ, build, twins  # noqa: E402
from tolerance import assert_within  # noqa: E402


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


@pytest.mark.parametrize("name", ["llama", "mistral", "gemma2", "qwen2", "gpt2", "gpt_oss", "phi",
                                  "starcoder2"])
def test_static_cache_generate_equals_eager(name):
    """mistral, starcoder2: a window shorter than the 19 tokens; gemma2: softcap and alternating
    layers (masks handed back as a dict); gpt_oss: sinks; gpt2: no layer types (one mask handed
    back)."""
    _, eager, ours = twins(build(DECODERS, name))
    kw = dict(input_ids=PROMPT, attention_mask=PADDING, max_new_tokens=12, do_sample=False,
              pad_token_id=0, cache_implementation="static")
    with torch.no_grad():
        want, got = eager.generate(**kw), ours.generate(**kw)
    assert torch.equal(got, want)


def _compile_for_test(model):
    """fullgraph=True traced by dynamo (what breaks on a data-dependent branch), run by the
    "eager" backend: no kernel compiled, seconds instead of minutes."""
    return torch.compile(model, fullgraph=True, backend="eager", dynamic=False)


def test_compiled_forward_equals_eager():
    """torch.compile(fullgraph=True) of a model on "qkv" (as on sdpa): no graph break, the same
    logits. Mistral: a window and padding; more architectures in benchmarks/hf_common_tests.py."""
    truth, eager, ours = twins(build(DECODERS, "mistral"))
    # right padding: every query row sees a key (eager's float64 run of a keyless row is NaN)
    padding = PADDING.flip(-1)
    kw = dict(input_ids=PROMPT, attention_mask=padding, use_cache=False)
    torch._dynamo.reset()
    with torch.no_grad():
        want, plain = truth(**kw).logits, eager(**kw).logits
        got = _compile_for_test(ours)(**kw).logits
    assert_within(got, want, plain, where=padding.bool()[:, :, None], what="compiled logits")


def test_compiled_static_cache_generate_equals_eager():
    """generate's own compiled decoding step (a static cache; on CUDA it compiles by itself)."""
    from transformers import CompileConfig

    _, eager, ours = twins(build(DECODERS, "llama"))
    config = CompileConfig(fullgraph=True, backend="eager", dynamic=False)
    config._compile_all_devices = True  # on CPU generate compiles only when told to
    kw = dict(input_ids=PROMPT, attention_mask=PADDING, max_new_tokens=6, do_sample=False,
              pad_token_id=0, cache_implementation="static")
    torch._dynamo.reset()
    with torch.no_grad():
        want, got = eager.generate(**kw), ours.generate(**kw, compile_config=config)
    assert torch.equal(got, want)


def test_prepared_mask_of_another_call_is_refused():
    from qkv.hf.masks import qkv_mask

    mask = qkv_mask(2, 3, 8, 5, 0)  # (b, 1, t, s) = (2, 1, 3, 8)
    assert qkv_mask(2, 3, 8, 5, 0, attention_mask=mask) is mask
    with pytest.raises(ValueError, match=r"shape \(2, 1, 3, 8\) reached a call of shape \(2, 1, 1, 8\)"):
        qkv_mask(2, 1, 8, 7, 0, attention_mask=mask)


@pytest.mark.parametrize("name,cache", [("bart", None), ("bart", "static"), ("t5", "static")])
def test_seq2seq_generate_equals_eager(name, cache):
    """Static: the decoder's self-attention cache is static, cross-attention's keys fixed."""
    _, eager, ours = twins(build(SEQ2SEQ, name))
    kw = dict(input_ids=PROMPT[:1], max_new_tokens=10, do_sample=False, num_beams=1,
              cache_implementation=cache)
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
