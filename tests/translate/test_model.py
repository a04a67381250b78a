"""The encoder-decoder: equal to torch.nn.Transformer with the same weights, causal, padding-proof,
its cached decoding equal to the full forward, its generator tied to the French embedding (or
not), and format-1 checkpoints renamed.

Tolerances (``tests/tolerance.py``): fp64 comparisons with :func:`assert_agree` (4× the float32
run's error, rescaled to float64); fp32 ones with :func:`assert_within` against the same model
in float64, the plain path being the model's full forward in float32.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from qkv.errors import QkvError
from qkv.translate.model import TranslationConfig, TranslationModel, upgrade_state_dict
from tolerance import assert_agree, assert_within, softmax_sum_tolerance, twin

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


def _torch_logits(model, peer, src, tgt):
    """nn.Transformer between qkv's embeddings and generator, in the model's dtype."""
    dtype = model.generator.weight.dtype
    pad = src == PAD  # torch: True = masked out
    emb = lambda e, ids: model.positions(e(ids) * math.sqrt(model.config.d_model))  # noqa: E731
    h = peer(emb(model.src_embed, src), emb(model.tgt_embed, tgt),
             tgt_mask=nn.Transformer.generate_square_subsequent_mask(tgt.shape[1], dtype=dtype),
             src_key_padding_mask=pad, memory_key_padding_mask=pad, tgt_is_causal=True)
    return model.generator(h)


# torch warns that its nested-tensor fast path is off for an odd head count: the peer's own note
@pytest.mark.filterwarnings("ignore:enable_nested_tensor is True")
def test_equals_torch_transformer_with_the_same_weights():
    model = tiny().double()
    ref = to_torch(model).double()
    src, tgt = batch()
    with torch.no_grad():
        ours = model(src, tgt)  # (b, t, V)
        theirs = _torch_logits(model, ref, src, tgt)
        low = _torch_logits(twin(model, torch.float32), twin(ref, torch.float32), src, tgt)
    assert ours.shape == (3, 5, 29)
    assert_agree(ours, theirs, low)


def test_generator_is_tied_to_the_french_embedding():
    """Tied (paper §3.4): one matrix serves both uses — one Parameter, counted once, whose
    gradient is the sum of both uses' gradients, and what the generator reads."""
    model = tiny().double()
    assert model.generator.weight is model.tgt_embed.weight
    E, V = model.config.d_model, model.config.tgt_vocab_size
    untied = tiny(tie_embeddings=False).double()
    assert model.num_parameters() == untied.num_parameters() - V * E
    # the gradients of both uses reach the one matrix: the same weights untied give the two
    # gradients apart, and the tied gradient is their sum
    untied.load_state_dict(model.state_dict())
    assert torch.equal(untied.generator.weight, untied.tgt_embed.weight)
    src, tgt = batch()

    def grads(m):
        m.zero_grad()
        m(src, tgt).square().mean().backward()
        return m.tgt_embed.weight.grad, m.generator.weight.grad

    (tied_grad, same), (emb_grad, gen_grad) = grads(model), grads(untied)
    assert same is tied_grad and emb_grad.abs().sum() > 0 and gen_grad.abs().sum() > 0
    low_emb, low_gen = grads(twin(untied, torch.float32))
    assert_agree(tied_grad, emb_grad + gen_grad, low_emb + low_gen)
    # and the generator reads the embedding table: zero a French token's row, its logit is 0
    with torch.no_grad():
        model.tgt_embed.weight[7] = 0.0
        assert (model(src, tgt)[..., 7] == 0).all()


def test_untied_generator_is_a_matrix_of_its_own():
    model = tiny(tie_embeddings=False)
    assert model.generator.weight is not model.tgt_embed.weight
    assert model.generator.weight.data_ptr() != model.tgt_embed.weight.data_ptr()
    names = {n for n, _ in model.named_parameters()}
    assert {"generator.weight", "tgt_embed.weight"} <= names
    src, tgt = batch()
    embedding = model.tgt_embed.weight.detach().clone()
    model(src, tgt).square().mean().backward()
    with torch.no_grad():  # a step on the generator alone leaves the embedding as it was
        model.generator.weight -= model.generator.weight.grad
    assert torch.equal(model.tgt_embed.weight, embedding)
    with torch.no_grad():
        model.tgt_embed.weight[7] = 0.0
        assert (model(src, tgt)[..., 7] != 0).all()  # the generator has a row of its own


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
        low = twin(model, torch.float32)(src, tgt)
        assert_agree(model(padded, tgt), model(src, tgt), low)


@pytest.mark.parametrize("norm_first", [False, True])
def test_cached_step_by_step_equals_full_decode(norm_first):
    model = tiny(norm_first=norm_first)
    src, tgt = batch(b=3, s=9, t=7)
    with torch.no_grad():
        full = model(src, tgt)  # (b, t, V): the plain path
        truth = twin(model, torch.float64)(src, tgt)
        state = model.start(src, max_new=tgt.shape[1])
        steps = torch.cat([model.step(tgt[:, j : j + 1], state) for j in range(tgt.shape[1])], dim=1)
        # Feeding several tokens at once continues the same cache, too.
        state2 = model.start(src, max_new=tgt.shape[1])
        chunks = torch.cat([model.step(tgt[:, :3], state2), model.step(tgt[:, 3:], state2)], dim=1)
    assert_within(steps, truth, full, what="one token a step")
    assert_within(chunks, truth, full, what="chunks")
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
    assert torch.equal(cache.k[:, :, :s], expected_k)  # exact: the same projection of the memory


def test_trace_weights_are_the_forward_weights():
    model = tiny()
    src, tgt = batch()
    with torch.no_grad():
        logits, trace = model.trace(src, tgt)
        plain = model(src, tgt)
        truth = twin(model, torch.float64)(src, tgt)
    assert_within(logits, truth, plain, what="traced logits")
    w = trace.decoder[1].cross_attn.attention.weights  # (b, h, t, s)
    assert w.shape == (3, 3, 5, 7)
    assert (w.sum(-1) - 1).abs().max() <= softmax_sum_tolerance(7, w.dtype)
    assert len(trace.encoder) == 2 and len(trace.decoder) == 2 and trace.encoder[0].cross_attn is None
    assert (w[1, :, :, -2:] == 0).all()  # padded English tokens get no weight


def test_config_validation():
    with pytest.raises(ValueError, match="divisible"):
        TranslationConfig(10, 10, d_model=30, num_heads=4)
    with pytest.raises(QkvError, match="unknown translation model config keys: colour"):
        TranslationConfig.from_dict({"src_vocab_size": 3, "tgt_vocab_size": 3, "colour": 1})
    with pytest.raises(QkvError, match="longer than"):
        tiny()(torch.ones(1, 40, dtype=torch.long), torch.ones(1, 3, dtype=torch.long))


def test_encode_and_decode_return_tensors():
    model = tiny()
    src, tgt = batch()
    with torch.no_grad():
        memory = model.encode(src)
        logits = model.decode(tgt, memory, src != PAD)
        # exact: forward is encode then decode, the same calls
        assert torch.equal(logits, model(src, tgt))
    assert isinstance(memory, torch.Tensor) and memory.shape == (3, 7, 24)
    assert isinstance(logits, torch.Tensor) and logits.shape == (3, 5, 29)


def test_upgrade_state_dict_renames_format_1_keys():
    model = tiny(norm_first=True)  # pre-norm: the stacks end with a norm of their own
    state = model.state_dict()
    old = {}
    for name, x in state.items():  # today's names → format 1's
        name = name.replace("encoder.layers.", "encoder.").replace("decoder.layers.", "decoder.")
        old[name.replace("encoder.norm.", "encoder_norm.").replace("decoder.norm.", "decoder_norm.")] = x
    assert "encoder.0.self_attn.q_proj.weight" in old and "decoder_norm.weight" in old
    upgraded = upgrade_state_dict(old)
    assert upgraded.keys() == state.keys()
    assert all(upgraded[n] is state[n] for n in state)
    assert upgrade_state_dict(state).keys() == state.keys()  # today's names are left alone
    fresh = tiny(norm_first=True)
    fresh.load_state_dict(upgraded)  # strict: every name found
