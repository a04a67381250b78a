"""The one model protocol (qkv.models.protocol): every loader's output meets it.

One conformance test, parametrised over every way ``qkv.load`` makes a model — each native
family (tiny checkpoints transformers writes here), the shipped ``minilm``, ``lm`` and
``translate``, a transformers architecture without a native family (the adapter) and a
transformers encoder-decoder (seq2seq) — so explanations can read the attributes the protocol
names without guessing.
"""

from __future__ import annotations

import os

import pytest
import torch

import qkv
import qkv.explain
from qkv.models import FAMILIES
from qkv.models.protocol import (
    DECODER, ENCODER, AttentionLayerLike, Capabilities, CrossAttentionModel, CrossLayerLike, CrossPass, MixerKind,
    ModelParts, OutputGated, ResidualForm, SelfAttentionModel, TokenizerLike,
)

transformers = pytest.importorskip("transformers")

TEXT = "the cat sat on the mat"
GRAMMAR = "the red apple is next to the black cats"  # one the shipped translation model knows
WORDS = "the cat sat on mat a dog . red apple".split()

# model_type → (config class, model class, sizes): one tiny checkpoint per native family
SIZES = dict(vocab_size=40, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=24, max_position_embeddings=32)
NATIVE = {
    "bert": ("BertConfig", "BertModel", SIZES),
    "roberta": ("RobertaConfig", "RobertaModel", SIZES | dict(pad_token_id=1)),
    "distilbert": ("DistilBertConfig", "DistilBertModel",
                   dict(vocab_size=40, dim=16, n_layers=2, n_heads=4, hidden_dim=24,
                        max_position_embeddings=32)),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(vocab_size=40, n_embd=16, n_layer=2, n_head=4,
                                                   n_positions=32)),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", SIZES | dict(rotary_pct=0.5)),
    "llama": ("LlamaConfig", "LlamaForCausalLM", SIZES | dict(num_key_value_heads=2)),
    "mistral": ("MistralConfig", "MistralForCausalLM", SIZES | dict(num_key_value_heads=2)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", SIZES | dict(num_key_value_heads=2)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", SIZES | dict(num_key_value_heads=2, head_dim=8)),
}


def save_tokenizer(path, *, wrap: bool) -> None:
    """A word-level tokenizer of ≤ 40 ids; [CLS] … [SEP] around the text when ``wrap``."""
    from tokenizers import Tokenizer as Raw, models, pre_tokenizers, processors

    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS])}
    tok = Raw(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    if wrap:
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tok.add_special_tokens(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    tok.save(os.path.join(path, "tokenizer.json"))


def test_every_native_family_is_covered():
    assert set(NATIVE) == set(FAMILIES)


@pytest.fixture(scope="module")
def directory(tmp_path_factory):
    """kind → a checkpoint directory (or a shipped name), written once per module."""
    made = {}

    def get(kind: str) -> str:
        if kind in made:
            return made[kind]
        if kind in ("minilm", "lm", "translate"):
            return kind
        path = tmp_path_factory.mktemp(kind)
        if kind == "seq2seq":
            from seq2seq_dirs import save

            made[kind] = save(path, "bart")[0]
            return made[kind]
        if kind == "transformers":
            config_class, model_class, sizes = "Olmo2Config", "Olmo2ForCausalLM", SIZES | dict(pad_token_id=0)
        else:
            config_class, model_class, sizes = NATIVE[kind]
        torch.manual_seed(0)
        config = getattr(transformers, config_class)(**sizes)
        getattr(transformers, model_class)(config).save_pretrained(path)
        save_tokenizer(path, wrap=kind in ("bert", "roberta", "distilbert"))
        made[kind] = str(path)
        return made[kind]
    return get


KINDS = sorted(NATIVE) + ["minilm", "lm", "transformers", "translate", "seq2seq"]


def test_capabilities_say_which_they_lack_by_name():
    assert ENCODER.lacks(("self_attention", "next_token", "causal")) == ("next_token", "causal")
    assert DECODER.lacks(()) == () and DECODER.lacks(("next_token",)) == ()
    with pytest.raises(ValueError, match="'nope' is no capability; the capabilities are self_attention"):
        DECODER.lacks(("causal", "nope"))


@pytest.mark.parametrize("kind", KINDS)
def test_every_loaders_model_meets_the_protocol(directory, kind):
    model = qkv.load(directory(kind))
    caps = model.capabilities
    assert isinstance(caps, Capabilities)
    assert isinstance(model.name, str) and model.name
    assert model.config is not None
    assert isinstance(model, SelfAttentionModel) == caps.self_attention
    assert isinstance(model, CrossAttentionModel) == caps.cross_attention
    if caps.self_attention:
        check_self_attention(model)
        check_parts(model, torch.tensor([model.tokenizer.encode(TEXT).ids]))
    if caps.cross_attention:
        check_cross_attention(model, GRAMMAR if kind == "translate" else TEXT)


def check_self_attention(model) -> None:
    tok = model.tokenizer
    assert isinstance(tok, TokenizerLike)
    assert tok.max_length is None or isinstance(tok.max_length, int)
    enc = tok.encode(TEXT)
    assert [tok.id_to_token(i) for i in enc.ids] == enc.tokens
    assert tok.token_to_id(enc.tokens[-1]) == enc.ids[-1]
    assert set(tok.ordinary_ids()).isdisjoint(tok.special_ids)
    assert len(tok.ordinary_ids()) + len(tok.special_ids) == tok.vocab_size
    assert all(i in tok.special_ids for i, s in zip(enc.ids, enc.special) if s)
    layers = model.layers
    assert len(layers) >= 1
    for layer in layers:
        assert isinstance(layer.self_attn, AttentionLayerLike)
    ids = torch.tensor([enc.ids])
    with torch.no_grad():
        out = model(ids, torch.ones_like(ids), trace_rows=slice(None), output_hidden_states=True)
    t, h = ids.shape[1], layers[0].self_attn.num_heads
    assert len(out.traces) == len(layers) and len(out.hidden_states) == len(layers) + 1
    weights = out.traces[0].self_attn.attention.weights  # (b, h, t, t)
    assert weights.shape == (1, h, t, t)
    torch.testing.assert_close(weights.sum(-1).double(), torch.ones(1, h, t, dtype=torch.double))


def check_cross_attention(model, text: str) -> None:
    layers, heads = model.cross_shape
    assert isinstance(layers, int) and isinstance(heads, int) and layers >= 1 and heads >= 1
    cp = model.cross_pass(text)
    assert isinstance(cp, CrossPass)
    assert cp.cross.shape == (layers, heads, len(cp.target), len(cp.source))
    assert len(cp.special) == len(cp.target)
    translated = model.translate([text])
    assert isinstance(translated, list) and len(translated) == 1 and isinstance(translated[0], str)
    gold = model.gold_alignment(text)
    assert gold is None or isinstance(gold, (str, tuple))
    # every cross layer's declared parts redo its heads: x·W_Q + b → q, memory·W_K, W_V → k, v,
    # the softmax and Σ w·v, equal to what the forward computed (float64 against float32)
    assert len(model.cross_layers) == layers
    for L, layer in enumerate(model.cross_layers):
        assert isinstance(layer, CrossLayerLike) and layer.cross_attn.num_heads == heads
        if model.capabilities.head_weights:
            steps = qkv.explain.cross_attention_head(model, text, layer=L, head=heads - 1).steps
            assert steps.projection == ""
            for stage, diff in steps.diffs.items():
                assert diff <= 64 * torch.finfo(torch.float32).eps * max(
                    1.0, float(steps.model_output.abs().max())), (L, stage, diff)


# -- every declared part, checked against a forward ---------------------------------------------
def _close(got: torch.Tensor, want: torch.Tensor, *scale: torch.Tensor) -> bool:
    """float64 ``got`` is ``want`` to a float32 forward's rounding: a few ulp of the magnitudes
    summed (|x| + |branch| …: each sum and each E-term product rounds once more)."""
    size = sum(float(t.double().abs().max()) for t in (want, *scale))
    return float((got.double() - want.double()).abs().max()) <= 64 * torch.finfo(torch.float32).eps * max(size, 1.0)


def _first(output):
    out = output[0] if isinstance(output, tuple) else output
    return getattr(out, "output", out)  # qkv's AttentionOutput → its output


def check_parts(model, ids: torch.Tensor) -> None:
    """``model.parts`` named and numerically right: the tables rebuild layer 0's input; per
    layer its norms, mixer and feed-forward add up as its residual form says; the read-out
    rebuilds the logits; every layer has a mixer kind, a softmax kind its attention."""
    parts = model.parts
    assert isinstance(parts, ModelParts) and len(parts.layers) == len(model.layers)
    seen: dict = {}

    def keep(module, args, kwargs, output):
        given = args[0] if args else kwargs.get("hidden_states", next(iter(kwargs.values()), None))
        seen.setdefault(id(module), (given, _first(output)))

    modules = {id(m): m for lp in parts.layers
               for m in (*(x.module for x in lp.mixers), *(x.output for x in lp.mixers),
                         lp.feed_forward) if m is not None}
    hooks = [m.register_forward_hook(keep, with_kwargs=True) for m in modules.values()]
    try:
        with torch.no_grad():
            out = model(ids, torch.ones_like(ids), output_hidden_states=True)
    finally:
        for h in hooks:
            h.remove()
    hidden = out.hidden_states  # hidden[L] enters layer L; the last: before any final norm
    with torch.no_grad():
        check_embeddings(parts.embeddings, ids[0], hidden[0][0])
        for i, lp in enumerate(parts.layers):
            assert all(isinstance(m.kind, MixerKind) for m in lp.mixers)
            assert all((m.attention is not None) == m.kind.softmax for m in lp.mixers), i
            check_layer(lp, hidden[i], hidden[i + 1], seen, hidden[0])
        check_gates(model, ids)
        if model.capabilities.next_token:
            u = parts.unembedding
            assert u is not None
            h = hidden[-1] if u.norm is None else u.norm(hidden[-1])
            got = torch.nn.functional.linear(h.double(), u.weight.double(),
                                             None if u.bias is None else u.bias.double()) * u.scale
            if u.softcap is not None:
                got = u.softcap * torch.tanh(got / u.softcap)
            assert _close(got, out.logits)


def gated(model) -> dict[int, tuple]:
    """{layer: (its softmax Mixer, the OutputGate its attention declares)} for every layer whose
    attention declares one."""
    out = {}
    for i, lp in enumerate(model.parts.layers):
        for m in lp.mixers:
            if isinstance(m.attention, OutputGated) and m.attention.output_gate is not None:
                out[i] = (m, m.attention.output_gate)
    return out


def check_gates(model, ids: torch.Tensor) -> None:
    """Every declared output gate is what the forward applied: its W_O is a module of the
    layer's attention, and it read z ⊙ sigmoid(gate) — z the heads' outputs the attention
    traced, the gate made by the declared projection from the layer's normed input."""
    gates = gated(model)
    if not gates:
        return
    fed: dict[int, torch.Tensor] = {}
    hooks = [gate.o_proj.register_forward_pre_hook(lambda _m, args, i=i: fed.setdefault(i, args[0]))
             for i, (_, gate) in gates.items()]
    try:
        out = model(ids, torch.ones_like(ids), trace_rows=slice(None))
    finally:
        for h in hooks:
            h.remove()
    for i, (m, gate) in gates.items():
        assert any(c is gate.o_proj for c in m.module.modules()), i  # the layer's own W_O
        tr = out.traces[i].self_attn
        h, d = gate.heads, gate.head_dim
        z = tr.heads[0].view(-1, h, d).double()  # (t, h, d) before the gate
        g = gate.gates(tr.key_input[0].double())  # (t, h, d)
        assert _close(z * g, fed[i][0].view(-1, h, d), z), i


def check_embeddings(e, ids: torch.Tensor, first: torch.Tensor) -> None:
    """Σ rows (token module on the ids, position rows from the offset, segment 0), normed and
    scaled, is what entered layer 0."""
    if e is None:
        return
    rows = sum(e.rows(ids).values())
    made = (rows if e.norm is None else e.norm(rows)) * e.scale
    assert _close(made, first)


def check_layer(lp, x: torch.Tensor, out: torch.Tensor, seen: dict, first: torch.Tensor) -> None:
    """The layer's residual equation (:class:`ResidualForm`) with its declared modules' own
    inputs and outputs in this forward (`first`: what entered layer 0)."""
    if lp.reads_embeddings:  # Zamba2: the softmax mixer reads n₁([x; e])
        mixer = next(m for m in lp.mixers if m.kind.softmax)
        assert _close(lp.norms.mixer(torch.cat([x, first], -1)), seen[id(mixer.module)][0])
    if lp.residual is ResidualForm.OTHER:
        assert lp.residual_note
        return
    (mixer,) = lp.mixers
    m_in = seen[id(mixer.module)][0]
    m_out = seen[id(mixer.output or mixer.module)][1]
    n1, n3, ff = lp.norms.mixer, lp.norms.feed_forward, lp.feed_forward
    f_in, f_out = seen[id(ff)] if ff is not None else (None, None)
    if lp.residual is ResidualForm.PRE_NORM:
        y = x + m_out
        assert _close(n1(x), m_in)
        if ff is not None:  # OPT's feed-forward is no one module: then the branch is not named
            assert _close(n3(y), f_in) and _close(y + f_out, out, y, f_out)
    elif lp.residual is ResidualForm.POST_NORM:
        y = n1(x + m_out)
        assert _close(m_in, x)
        if ff is not None:
            assert _close(y, f_in, x, m_out) and _close(n3(y + f_out), out, y, f_out)
    elif lp.residual is ResidualForm.BRANCH_NORM:  # y = x + p₁(m(n₁(x))), out = y + p₃(f(n₃(y)))
        p1, p3 = lp.norms.post_mixer, lp.norms.post_feed_forward
        y = x + p1(m_out)
        assert _close(m_in, x if n1 is None else n1(x))
        if ff is not None:
            f_branch = f_out if p3 is None else p3(f_out)
            assert _close(y if n3 is None else n3(y), f_in) and _close(y + f_branch, out, y, f_branch)
    elif lp.residual is ResidualForm.SCALED:  # y = α₁·r₁ + β₁·m(n₁(x)), out = α₃·r₃ + β₃·f(n₃(y))
        s = lp.scales
        assert _close(m_in, x if n1 is None else n1(x))
        y = s.mixer_residual * (n1(x) if s.normed else x) + s.mixer * m_out
        if ff is not None:
            r3 = n3(y) if s.normed else y
            assert _close(n3(y), f_in)
            assert _close(s.feed_forward_residual * r3 + s.feed_forward * f_out, out, r3, f_out)
    else:  # parallel
        assert _close(n1(x), m_in) and _close(n3(x), f_in)
        assert _close(x + m_out + f_out, out, x, m_out, f_out)


# a dozen transformers architectures (tests/hf/archs.py) and the hybrids (tests/hf/hybrids.py)
ARCHS = ["gemma", "gemma2", "gemma3", "phi3", "olmo", "olmo2", "granite", "starcoder2", "cohere",
         "phi", "smollm3", "gptj", "opt", "electra", "xlm_roberta"]


@pytest.mark.parametrize("name", ARCHS)
def test_transformers_architectures_declare_their_parts(tmp_path, name):
    from archs import DECODERS, ENCODERS, build

    table = DECODERS if name in DECODERS else ENCODERS
    model = build(table, name)
    if getattr(model.config, "_experts_implementation", None) not in (None, "eager"):
        model.set_experts_implementation("eager")
    model.save_pretrained(tmp_path)
    save_tokenizer(tmp_path, wrap=False)
    ours = qkv.load(tmp_path)
    check_parts(ours, torch.tensor([ours.tokenizer.encode(TEXT).ids]))


def _hybrids() -> list[str]:
    from hybrids import HYBRIDS

    return sorted(HYBRIDS)


@pytest.mark.parametrize("name", _hybrids())
def test_hybrid_architectures_declare_their_parts(tmp_path, name):
    """Issue 39's hybrids: every layer a layer, each declared part checked as above (the
    hybrids' pre-norm layers, Gated DeltaNet's, Mamba-2's and the rest alike)."""
    from hybrids import save_hybrid

    save_hybrid(name, tmp_path)
    model = qkv.load(tmp_path)
    check_parts(model, torch.tensor([model.tokenizer.encode(TEXT).ids]))
    # Qwen3-Next / 3.5 gate their attention's heads; check_parts checked each gate numerically
    assert bool(gated(model)) == name.startswith(("qwen3_5", "qwen3_next")), name
