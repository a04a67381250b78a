"""qkv.load on any architecture transformers builds: the transformers model on "qkv" behind qkv's
model protocol (qkv.hf.adapter.HFModel), explained by the same functions as a native family.

Native families stay the reference: a tiny Llama loaded natively and through the adapter
(``via="hf"``) gives the same explanations. Tolerances are derived (tests/tolerance.py): the
truth is the native model in float64; the adapter in float32 may be at most twice as far from
it as the native model in float32 is (plus 2 ulp).
"""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("transformers")  # the qkv[hf] extra
import torch  # noqa: E402

import qkv  # noqa: E402
import qkv.explain as E  # noqa: E402
import qkv.hf  # noqa: E402
from archs import DECODERS, ENCODERS, build  # noqa: E402
from qkv.errors import QkvError  # noqa: E402
from qkv.explain.contributions import get_method  # noqa: E402
from qkv.explain.forward import trace  # noqa: E402
from qkv.explain.wording import ArgumentError  # noqa: E402
from qkv.hf.adapter import HFModel, wrap  # noqa: E402
from qkv.models.tokenizer import Tokenizer  # noqa: E402
from qkv.modules import Interventions  # noqa: E402
from tolerance import assert_within, max_err, softmax_sum_tolerance  # noqa: E402

TEXT = "the dog found some pizza next to the baby and ate it"
WORDS = sorted(set(TEXT.split()) | {"a", "cat", "sat", "on", "mat", "."})


def save_tokenizer(path, *, encoder: bool) -> None:
    """A word-level tokenizer of ≤ 99 ids (the archs' vocabulary); [CLS] … [SEP] for encoders."""
    from tokenizers import Tokenizer as Raw, models, pre_tokenizers, processors

    vocab = {w: i for i, w in enumerate(["[UNK]", "[CLS]", "[SEP]", "[PAD]", *WORDS])}
    tok = Raw(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    if encoder:
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 1), ("[SEP]", 2)])
    tok.save(os.path.join(path, "tokenizer.json"))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """name → a saved directory (built once per module)."""
    dirs = {}

    def get(name):
        if name not in dirs:
            table = DECODERS if name in DECODERS else ENCODERS
            path = tmp_path_factory.mktemp(name)
            build(table, name).save_pretrained(path)
            save_tokenizer(path, encoder=table is ENCODERS)
            dirs[name] = path
        return dirs[name]
    return get


def adapter(path, name):
    """qkv.load's adapter, or (MoE) the same built by hand with the experts' plain loop: the
    grouped-mm kernel wants 16-byte strides the tiny sizes do not have (MoE is not under test)."""
    if name in ("gpt_oss",):
        hf = qkv.hf.load(path)
        hf.set_experts_implementation("eager")
        return wrap(hf, Tokenizer.from_dir(path), name=name)
    return qkv.load(path)


# -- native families are the reference ---------------------------------------------------------
@pytest.fixture(scope="module")
def llama(saved):
    path = saved("llama")
    return (qkv.load(path, dtype=torch.float64), qkv.load(path), qkv.load(path, via="hf"))


def test_via_hf_is_the_adapter_and_native_is_not(llama):
    truth, native, ours = llama
    assert isinstance(ours, HFModel) and not isinstance(native, HFModel)
    assert ours.capabilities.causal and ours.capabilities.next_token and ours.capabilities.head_weights
    assert (len(ours.layers), ours.layers[0].self_attn.num_heads, ours.layers[0].self_attn.num_kv_heads) == \
        (len(native.layers), native.layers[0].self_attn.num_heads, native.layers[0].self_attn.num_kv_heads)


def test_llama_native_and_adapter_explain_alike(llama):
    truth, native, ours = llama
    maps = [E.attention_maps(m, TEXT).weights for m in llama]
    assert_within(maps[2], maps[0], maps[1], what="attention maps")
    # what the forward traced for token "it": q and k after RoPE, v, weights, head outputs
    traced = [trace(m, TEXT, torch.tensor([11])).traces[1].self_attn.attention for m in llama]
    for field in ("query", "key", "value", "scores", "weights", "output", "lse"):
        assert_within(getattr(traced[2], field), getattr(traced[0], field), getattr(traced[1], field),
                      what=field)
    # x·W_Q + b → RoPE → q on both: the same float64 arithmetic from the same kind of record
    steps = [E.explain_head(m, TEXT, token="it", layer=1, head=3) for m in llama]
    assert not any(st.projection for st in steps) and steps[2].qk_transform == steps[1].qk_transform
    for field in ("x", "query", "keys", "values", "weights", "output"):
        assert_within(getattr(steps[2], field), getattr(steps[0], field), getattr(steps[1], field),
                      what=f"steps' {field}")
    ids = torch.tensor([native.tokenizer.encode(TEXT).ids])
    rows = torch.tensor([ids.shape[1] - 1])
    for method in ("weight", "rollout", "grad", "value-zeroing", "norm", "alti"):
        got = [get_method(method).run(m, ids, rows).scores for m in llama]
        assert_within(got[2], got[0], got[1], what=method)


def test_llama_interventions_and_hidden_states_match_native(llama):
    truth, native, ours = llama
    ids = torch.tensor([native.tokenizer.encode(TEXT).ids])
    patch = torch.randn(1, ids.shape[1], native.config.hidden_size)
    keep = torch.ones(1, ids.shape[1])
    keep[0, 3] = 0  # token 3 hands over no value in layer 1
    edits = Interventions(heads={(0, 1): None, (1, 2): lambda o: 2 * o}, values={1: keep}, inputs={1: patch})
    with torch.no_grad():
        out = [m(ids, torch.ones_like(ids), output_hidden_states=True, interventions=edits,
                 trace_rows=slice(None)) for m in llama]
    assert_within(out[2].logits, out[0].logits, out[1].logits, what="edited logits")
    for i in range(len(native.layers) + 1):
        assert_within(out[2].hidden_states[i], out[0].hidden_states[i].float(), out[1].hidden_states[i],
                      what=f"hidden_states[{i}]")
    # what layer 1's attention read: norm1 of the patch, as the native layer records it
    assert_within(out[2].traces[1].self_attn.query_input, out[0].traces[1].self_attn.query_input.float(),
                  out[1].traces[1].self_attn.query_input, what="layer 1's attention input")


def test_traced_rows_are_the_forward(llama):
    """The explanation's rows are the forward's: logits with and without tracing agree within the
    derived bound (the traced rows run the reference path, the others the kernel)."""
    truth, native, ours = llama
    ids = torch.tensor([native.tokenizer.encode(TEXT).ids])
    with torch.no_grad():
        plain = ours(ids).logits
        traced = ours(ids, trace_rows=torch.tensor([4, 11])).logits
        ref, low = truth(ids).logits, native(ids).logits
    assert_within(traced, ref, low, what="traced logits")
    assert_within(plain, ref, low, what="untraced logits")


# -- architectures qkv has no family for -------------------------------------------------------
@pytest.mark.parametrize("name", ["gemma2", "gpt_oss", "olmo2", "electra"])
def test_explanations_run_on_other_architectures(saved, name):
    """softcap + alternating windows (gemma2), sinks + MoE (gpt-oss), QK-norm (olmo2), an encoder
    (electra): explain_head's float64 arithmetic from x on equals the forward's head output,
    every method that applies runs, ALTI runs on gpt-oss (pre-norm: x + attn, then the MoE) and
    electra (post-norm: LayerNorm(x + attn)) and says why not on the others (norms on the
    attention's branch)."""
    model = adapter(saved(name), name)
    caps = model.capabilities
    assert caps.causal == (name != "electra") and caps.encoder == (name == "electra")
    st = E.explain_head(model, TEXT, token="it", layer=1, head=1)
    s = len(st.tokens)
    # float64 recomputation vs the forward's float32 row: a softmax over s keys, d-term dot products
    assert st.max_abs_diff <= softmax_sum_tolerance(s, torch.float32) * max(1.0, float(st.values.abs().max())) * s
    total = float(st.weights.sum())
    if name == "gpt_oss":  # a sink takes a share of the softmax and hands on nothing
        assert st.sink is not None and total < 1
    else:
        assert abs(total - 1) < 1e-12
    assert (st.softcap is not None) == (name == "gemma2")
    target = {} if caps.next_token else {"target_text": "a cat sat on the mat"}
    for method in ("weight", "rollout", "value-zeroing", "norm", "grad"):
        ov = E.explain(model, TEXT, token="it", method=method, **(target if method == "grad" else {}))
        assert len(ov.rows) in (len(model.layers), len(model.layers) * model.layers[0].self_attn.num_heads)
    assert not st.projection  # x·W_Q + b → (norm) → RoPE → q
    if name in ("gpt_oss", "electra"):
        E.explain(model, TEXT, token="it", method="alti")
    else:
        with pytest.raises(ArgumentError, match="'alti' does not apply .* do not form x \\+ attn"):
            E.explain(model, TEXT, token="it", method="alti")
    maps = E.attention_maps(model, TEXT).weights
    assert maps.shape[:2] == (len(model.layers), model.layers[0].self_attn.num_heads)
    if caps.causal:  # nothing after a token
        assert float(maps.triu(1).abs().max()) == 0


@pytest.mark.parametrize("name", ["olmo2", "electra"])
def test_document_equals_the_traced_rows(saved, name):
    model = adapter(saved(name), name)
    doc = E.document(model, TEXT)
    traced = E.attention_maps(model, TEXT).weights  # (L, H, t, t), from the row traces
    for layer in range(len(model.layers)):
        got = doc.row_weights(layer, torch.arange(traced.shape[-1]))  # (h, t, t)
        err = max_err(got, traced[layer])
        assert err <= 8 * softmax_sum_tolerance(traced.shape[-1], torch.float32), (layer, err)


@pytest.mark.parametrize("name", ["gemma2", "gpt_oss"])
def test_document_refuses_softcap_and_sinks(saved, name):
    with pytest.raises(QkvError, match="soft-capped attention logits .* or sink logits"):
        E.document(adapter(saved(name), name), TEXT)


def test_probes_on_the_adapter(saved):
    decoder, encoder = qkv.load(saved("olmo2")), qkv.load(saved("electra"))
    assert len(E.probe(decoder, "induction").scores) == len(decoder.layers)
    assert E.probe(encoder, "coref").items


def test_cli_explain_and_heads_on_a_transformers_directory(saved, capsys):
    from qkv.cli import main

    path = str(saved("gemma2"))
    assert main(["explain", TEXT, "--model", path, "--token", "it", "--layer", "1", "--head", "0"]) == 0
    out = capsys.readouterr().out
    assert "x·W_Q, x·W_K and x·W_V are not shown" not in out and "soft-capped" in out
    assert main(["heads", TEXT, "--model", path, "--to", "pizza"]) == 0


# -- config and weights that disagree ------------------------------------------------------------
def _edit_config(path, tmp_path, **changes):
    import shutil

    new = tmp_path / "edited"
    shutil.copytree(path, new)
    config = json.loads((new / "config.json").read_text())
    (new / "config.json").write_text(json.dumps(config | changes))
    return new


def test_more_layers_in_config_than_in_the_weights(saved, tmp_path):
    path = _edit_config(saved("olmo2"), tmp_path, num_hidden_layers=3)
    with pytest.raises(QkvError, match=r"num_hidden_layers is 3 but .*model.safetensors holds 2 layers"):
        qkv.load(path)


def test_changed_hidden_size(saved, tmp_path):
    path = _edit_config(saved("olmo2"), tmp_path, hidden_size=40, head_dim=8)
    with pytest.raises(QkvError, match=r"model.safetensors: tensor '[^']+' has shape \(\d+(, \d+)*\) but "
                                       r"Olmo2ForCausalLM with this config.json needs"):
        qkv.hf.load(path)
