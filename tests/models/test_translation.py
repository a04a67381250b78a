"""The encoder-decoder: equal to torch.nn.Transformer with the same weights, causal, padding-proof,
and its cached decoding equal to the full forward."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from qkv.errors import QkvError
from qkv.models.translation import TranslationConfig, TranslationModel

PAD, BOS, EOS = 0, 1, 2


def tiny(**overrides) -> TranslationModel:
    cfg = dict(src_vocab_size=23, tgt_vocab_size=29, d_model=24, num_heads=3, encoder_layers=2,
               decoder_layers=2, ff_dim=40, dropout=0.0, max_len=32)
    cfg.update(overrides)
    torch.manual_seed(0)
    return TranslationModel(TranslationConfig(**cfg)).eval()


def batch(b=3, s=7, t=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, 23, (b, s), generator=g)
    tgt = torch.randint(4, 29, (b, t), generator=g)
    tgt[:, 0] = BOS
    if b > 1:
        src[1, s - 2 :] = PAD  # a shorter English sentence in the batch
        src[1, s - 3] = EOS
    return src, tgt


def to_torch(model: TranslationModel) -> nn.Transformer:
    """An nn.Transformer holding ``model``'s layer weights (post-norm, no final stack norms)."""
    c = model.config
    t = nn.Transformer(d_model=c.d_model, nhead=c.num_heads, num_encoder_layers=c.encoder_layers,
                       num_decoder_layers=c.decoder_layers, dim_feedforward=c.ff_dim, dropout=0.0,
                       activation=c.activation, batch_first=True, norm_first=c.norm_first)
    # Post-norm layers already end in a LayerNorm; nn.Transformer adds one per stack.
    t.encoder.norm, t.decoder.norm = None, None

    def copy_mha(dst: nn.MultiheadAttention, src) -> None:
        dst.in_proj_weight.copy_(torch.cat([src.q_proj.weight, src.k_proj.weight, src.v_proj.weight]))
        dst.in_proj_bias.copy_(torch.cat([src.q_proj.bias, src.k_proj.bias, src.v_proj.bias]))
        dst.out_proj.weight.copy_(src.out_proj.weight)
        dst.out_proj.bias.copy_(src.out_proj.bias)

    def copy_ln(dst, src) -> None:
        dst.weight.copy_(src.weight)
        dst.bias.copy_(src.bias)

    def copy_ff(dst, src) -> None:
        for a, b in ((dst.linear1, src.feed_forward.fc1), (dst.linear2, src.feed_forward.fc2)):
            a.weight.copy_(b.weight)
            a.bias.copy_(b.bias)

    with torch.no_grad():
        for dst, src in zip(t.encoder.layers, model.encoder):
            copy_mha(dst.self_attn, src.self_attn)
            copy_ff(dst, src)
            copy_ln(dst.norm1, src.norm1)
            copy_ln(dst.norm2, src.norm3)  # torch's encoder norm2 follows the feed-forward
        for dst, src in zip(t.decoder.layers, model.decoder):
            copy_mha(dst.self_attn, src.self_attn)
            copy_mha(dst.multihead_attn, src.cross_attn)
            copy_ff(dst, src)
            for i in (1, 2, 3):
                copy_ln(getattr(dst, f"norm{i}"), getattr(src, f"norm{i}"))
    return t.eval()


def test_equals_torch_transformer_with_the_same_weights():
    model = tiny().double()
    ref = to_torch(model).double()
    src, tgt = batch()
    with torch.no_grad():
        ours = model(src, tgt)  # (b, t, V)
        pad = src == PAD  # torch: True = masked out
        emb = lambda e, ids: model.positions(e(ids) * math.sqrt(model.config.d_model))  # noqa: E731
        h = ref(emb(model.src_embed, src), emb(model.tgt_embed, tgt),
                tgt_mask=nn.Transformer.generate_square_subsequent_mask(tgt.shape[1], dtype=torch.float64),
                src_key_padding_mask=pad, memory_key_padding_mask=pad, tgt_is_causal=True)
        theirs = model.generator(h)
    assert ours.shape == (3, 5, 29)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-10)


def test_generator_is_tied_to_the_french_embedding():
    model = tiny()
    assert model.generator.weight is model.tgt_embed.weight
    assert tiny(tie_embeddings=False).generator.weight is not tiny(tie_embeddings=False).tgt_embed.weight


def test_decoder_is_causal_by_gradients():
    model = tiny().double()
    src, tgt = batch(b=1, t=6)
    memory = model.encode(src)
    x = model.tgt_embed(tgt).detach().requires_grad_(True)  # differentiate w.r.t. the inputs
    model.tgt_embed.forward = lambda ids: x  # the same tensor flows through embed()
    logits = model.decode(tgt, memory, src != PAD)
    for pos in range(tgt.shape[1]):
        (grad,) = torch.autograd.grad(logits[0, pos].sum(), x, retain_graph=True)
        seen = grad[0].abs().sum(-1) > 0  # (t,)
        assert seen[: pos + 1].all() and not seen[pos + 1 :].any(), pos


def test_padding_does_not_change_a_sentence():
    model = tiny().double()
    src, tgt = batch(b=1, s=6)
    src[0, -1] = EOS
    padded = torch.cat([src, torch.full((1, 4), PAD)], dim=1)  # (1, s + 4)
    with torch.no_grad():
        torch.testing.assert_close(model(padded, tgt), model(src, tgt), rtol=0, atol=1e-12)


@pytest.mark.parametrize("norm_first", [False, True])
def test_cached_step_by_step_equals_full_decode(norm_first):
    model = tiny(norm_first=norm_first)
    src, tgt = batch(b=3, s=9, t=7)
    with torch.no_grad():
        full = model(src, tgt)  # (b, t, V)
        state = model.start(src, max_new=tgt.shape[1])
        steps = torch.cat([model.step(tgt[:, j : j + 1], state) for j in range(tgt.shape[1])], dim=1)
        # Feeding several tokens at once continues the same cache, too.
        state2 = model.start(src, max_new=tgt.shape[1])
        chunks = torch.cat([model.step(tgt[:, :3], state2), model.step(tgt[:, 3:], state2)], dim=1)
    torch.testing.assert_close(steps, full, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(chunks, full, rtol=1e-5, atol=1e-5)
    assert state.length == tgt.shape[1]


def test_cross_attention_cache_holds_the_memory_projected_once():
    model = tiny()
    src, tgt = batch(b=2, s=6, t=4)
    with torch.no_grad():
        state = model.start(src, max_new=4)
        for j in range(4):
            model.step(tgt[:, j : j + 1], state)
        cross = model.decoder[0].cross_attn
        b, s, _ = state.memory.shape
        expected_k = cross.k_proj(state.memory).view(b, s, 3, 8).transpose(1, 2)  # (b, h, s, d)
    cache = state.cross_caches[0]
    assert len(cache) == s  # filled by the first step, never appended to again
    torch.testing.assert_close(cache.k[:, :, :s], expected_k)


def test_trace_weights_are_the_forward_weights():
    model = tiny()
    src, tgt = batch()
    with torch.no_grad():
        logits, trace = model.trace(src, tgt)
        plain = model(src, tgt)
    torch.testing.assert_close(logits, plain, rtol=1e-5, atol=1e-6)
    w = trace.decoder[1].cross_attn.attention.weights  # (b, h, t, s)
    assert w.shape == (3, 3, 5, 7)
    torch.testing.assert_close(w.sum(-1), torch.ones(3, 3, 5))
    assert (w[1, :, :, -2:] == 0).all()  # padded English tokens get no weight


def test_config_validation():
    with pytest.raises(ValueError, match="divisible"):
        TranslationConfig(10, 10, d_model=30, num_heads=4)
    with pytest.raises(QkvError, match="unknown translation model config keys: colour"):
        TranslationConfig.from_dict({"src_vocab_size": 3, "tgt_vocab_size": 3, "colour": 1})
    with pytest.raises(QkvError, match="longer than"):
        tiny()(torch.ones(1, 40, dtype=torch.long), torch.ones(1, 3, dtype=torch.long))
