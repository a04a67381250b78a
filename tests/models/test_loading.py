"""``qkv.models.load``: known names, checkpoint layouts, and one clear error for each bad input.

Loaded weights are the checkpoint's tensors exactly (``torch.equal``); a bfloat16 load is held to
the rule of ``tests/tolerance.py`` against ``transformers`` (float64 truth, bfloat16 plain path).
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from qkv.errors import QkvError
from qkv.models import BertModel, GPT2Model, Tokenizer, load
from qkv.models.gpt2 import gpt2_shapes
from qkv.models.loading import minilm_dir
from qkv.models.gpt2 import GPT2Config
from tolerance import assert_within

IDS = torch.tensor([[101, 7592, 2088, 999, 102]])  # [CLS] hello world ! [SEP]


@pytest.fixture(scope="module")
def minilm() -> BertModel:
    return load("minilm")


@pytest.fixture(scope="module")
def minilm_tensors() -> dict[str, torch.Tensor]:
    return load_file(os.path.join(minilm_dir(), "model.safetensors"))


def checkpoint_copy(path, *, config: dict | None = None, weights: bool = True):
    """A copy of the MiniLM directory in ``path``: files hard-linked (a symbolic link out of a
    checkpoint is refused), config.json optionally edited."""
    for f in os.listdir(minilm_dir()):
        if f == "config.json" or (f == "model.safetensors" and not weights):
            continue
        src = os.path.join(minilm_dir(), f)
        (os.symlink if os.path.isdir(src) else os.link)(src, path / f)
    with open(os.path.join(minilm_dir(), "config.json")) as f:
        raw = json.load(f)
    (path / "config.json").write_text(json.dumps({**raw, **(config or {})}))
    return path


def test_load_minilm(minilm):
    assert isinstance(minilm, BertModel) and not minilm.training
    assert minilm.name == "all-MiniLM-L6-v2"
    assert isinstance(minilm.tokenizer, Tokenizer) and minilm.tokenizer.max_length == 512
    assert minilm.max_seq_length == 256  # sentence_bert_config.json
    assert minilm.config.num_hidden_layers == len(minilm.layers) == 6
    assert minilm.embeddings.word.weight.dtype == torch.float32
    assert not any(p.is_meta for p in minilm.parameters())


def test_weights_are_the_checkpoint_tensors(minilm, minilm_tensors):
    layer = minilm.layers[2]
    assert torch.equal(layer.self_attn.v_proj.weight, minilm_tensors["encoder.layer.2.attention.self.value.weight"])
    assert torch.equal(layer.feed_forward.fc2.bias, minilm_tensors["encoder.layer.2.output.dense.bias"])
    assert torch.equal(layer.norm3.weight, minilm_tensors["encoder.layer.2.output.LayerNorm.weight"])


@pytest.mark.parametrize("name", ["all-MiniLM-L6-v2", minilm_dir()])
def test_other_names_for_the_same_model(minilm, name):
    other = load(name)
    with torch.no_grad():
        assert torch.equal(other(IDS).last_hidden_state, minilm(IDS).last_hidden_state)


def test_unknown_name():
    with pytest.raises(QkvError, match=r"unknown model 'gpt-17': known names are (.*, )?minilm, all-MiniLM-L6-v2"):
        load("gpt-17")


def test_directory_that_does_not_exist(tmp_path):
    missing = tmp_path / "no" / "such"
    with pytest.raises(QkvError, match=f"model directory {missing} does not exist"):
        load(missing)


def test_file_instead_of_directory(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(QkvError, match="is a file; give the checkpoint directory"):
        load(tmp_path / "model.safetensors")


def test_missing_or_invalid_config(tmp_path):
    with pytest.raises(QkvError, match=f"{tmp_path / 'config.json'} is missing"):
        load(tmp_path)
    (tmp_path / "config.json").write_text("{oops")
    with pytest.raises(QkvError, match="config.json is not valid JSON"):
        load(tmp_path)


def test_missing_weights(tmp_path):
    checkpoint_copy(tmp_path, weights=False)
    with pytest.raises(QkvError, match=f"{tmp_path / 'model.safetensors'} is missing"):
        load(tmp_path)
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x04")  # a pickle: never opened
    with pytest.raises(QkvError, match="has only pytorch_model.bin, pickled PyTorch weights, which qkv never loads"):
        load(tmp_path)


def test_truncated_weights(tmp_path):
    checkpoint_copy(tmp_path, weights=False)
    with open(os.path.join(minilm_dir(), "model.safetensors"), "rb") as f:
        data = f.read()
    (tmp_path / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(QkvError, match=r"model.safetensors is truncated or not a safetensors file"):
        load(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(data[:100])  # not even a whole header
    with pytest.raises(QkvError, match=r"model.safetensors is truncated"):
        load(tmp_path)


def test_tensor_shape_disagrees_with_config(tmp_path):
    checkpoint_copy(tmp_path, config={"max_position_embeddings": 256})
    with pytest.raises(QkvError, match=r"tensor 'embeddings.position_embeddings.weight' has shape "
                                       r"\(512, 384\) but config.json implies \(256, 384\)"):
        load(tmp_path)


def test_stored_tensor_with_a_wrong_shape(tmp_path, minilm_tensors):
    checkpoint_copy(tmp_path, weights=False)
    bad = dict(minilm_tensors)
    bad["encoder.layer.3.intermediate.dense.weight"] = torch.zeros(1535, 384)
    save_file(bad, str(tmp_path / "model.safetensors"))
    with pytest.raises(QkvError, match=r"'encoder.layer.3.intermediate.dense.weight' has shape "
                                       r"\(1535, 384\) but config.json implies \(1536, 384\)"):
        load(tmp_path)


def test_layer_count_disagrees_with_the_header(tmp_path):
    """Checked first, from the header alone: the message names the key and both counts."""
    fewer, more = tmp_path / "fewer", tmp_path / "more"
    fewer.mkdir(), more.mkdir()
    checkpoint_copy(fewer, config={"num_hidden_layers": 5})
    with pytest.raises(QkvError, match=r"num_hidden_layers is 5 but .*model.safetensors holds 6 layers \(0–5\)"):
        load(fewer)
    checkpoint_copy(more, config={"num_hidden_layers": 7})
    with pytest.raises(QkvError, match=r"num_hidden_layers is 7 but .* holds 6 layers"):
        load(more)


def test_unexpected_and_missing_tensors(tmp_path, minilm_tensors):
    extra, fewer = tmp_path / "extra", tmp_path / "fewer"
    for path, tensors in ((extra, {**minilm_tensors, "encoder.layer.2.attention.self.rel": torch.zeros(3)}),
                          (fewer, {k: v for k, v in minilm_tensors.items() if "layer.4.output.dense.bias" not in k})):
        path.mkdir()
        checkpoint_copy(path, weights=False)
        save_file(tensors, str(path / "model.safetensors"))
    with pytest.raises(QkvError, match=r"unexpected tensor 'encoder.layer.2.attention.self.rel'"):
        load(extra)
    with pytest.raises(QkvError, match=r"missing tensor 'encoder.layer.4.output.dense.bias'"):
        load(fewer)


@pytest.mark.parametrize("config, message", [
    # a model_type without a family goes to transformers (qkv.hf), which refuses a BERT checkpoint
    ({"model_type": "t5"}, r"architecture 'BertModel' is a 'bert' model but config.json says model_type 't5'"),
    ({"architectures": ["BertForQuestionAnswering"]}, r"architecture 'BertForQuestionAnswering' is not supported"),
    ({"hidden_act": "gelu_10"}, r"hidden_act 'gelu_10' is not supported"),
])
def test_unsupported_architecture(tmp_path, config, message):
    checkpoint_copy(tmp_path, config=config)
    with pytest.raises(QkvError, match=message):
        load(tmp_path)


def test_prefixed_bert_checkpoint_with_heads(tmp_path, minilm, minilm_tensors):
    """Saved from BertForMaskedLM: keys carry "bert." and an MLM head comes along (ignored)."""
    checkpoint_copy(tmp_path, weights=False, config={"architectures": ["BertForMaskedLM"]})
    tensors = {"bert." + k: v for k, v in minilm_tensors.items()}
    tensors["cls.predictions.bias"] = torch.zeros(30522)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    model = load(tmp_path)
    with torch.no_grad():
        assert torch.equal(model(IDS).last_hidden_state, minilm(IDS).last_hidden_state)


def test_bf16():
    model = load("minilm", dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    transformers = pytest.importorskip("transformers")
    hf = transformers.BertModel.from_pretrained(minilm_dir(), attn_implementation="eager").eval()
    with torch.no_grad():
        got = model(IDS).last_hidden_state
        truth = hf.double()(IDS).last_hidden_state
        plain = hf.to(torch.bfloat16)(IDS).last_hidden_state
    assert got.dtype == torch.bfloat16
    assert_within(got, truth, plain, what="bf16 last_hidden_state")
    with pytest.raises(QkvError, match="dtype must be a floating-point torch.dtype, got torch.int64"):
        load("minilm", dtype=torch.int64)


# -- GPT-2 layouts ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gpt2_parts(tmp_path_factory):
    """(config dict, HF-named tensors, tokenizer dir) of a tiny random GPT-2."""
    from tokenizers import ByteLevelBPETokenizer

    tok_dir = tmp_path_factory.mktemp("gpt2-tok")
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(["hello world, attention please"] * 2, vocab_size=300, min_frequency=1)
    tok.save_model(str(tok_dir))
    config = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 32,
              "n_head": 4, "n_layer": 2, "n_positions": 16, "vocab_size": 300}
    g = torch.Generator().manual_seed(0)
    tensors = {k: torch.randn(s, generator=g) * 0.1 for k, s in gpt2_shapes(GPT2Config.from_dict(config)).items()}
    return config, tensors, str(tok_dir)


def write_gpt2(path, config, tensors, tok_dir):
    path.mkdir(exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(path / "model.safetensors"))
    for f in ("vocab.json", "merges.txt"):
        os.symlink(os.path.join(tok_dir, f), path / f)
    return path


def test_gpt2_with_or_without_prefix(tmp_path, gpt2_parts):
    config, tensors, tok_dir = gpt2_parts
    plain = load(write_gpt2(tmp_path / "a", config, tensors, tok_dir))
    prefixed = {"transformer." + k: v for k, v in tensors.items()}
    prefixed["lm_head.weight"] = tensors["wte.weight"].clone()  # a stored tied copy: allowed
    other = load(write_gpt2(tmp_path / "b", config, prefixed, tok_dir))
    assert isinstance(plain, GPT2Model) and plain.lm_head.weight is plain.wte.weight
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        assert torch.equal(plain(ids).logits, other(ids).logits)
    # the loaded projections are c_attn's transposed thirds
    assert torch.equal(plain.layers[0].self_attn.v_proj.weight, tensors["h.0.attn.c_attn.weight"][:, 64:].T)


def test_gpt2_untied_head_is_rejected(tmp_path, gpt2_parts):
    config, tensors, tok_dir = gpt2_parts
    write_gpt2(tmp_path, config, {**tensors, "lm_head.weight": torch.zeros(300, 32)}, tok_dir)
    with pytest.raises(QkvError, match="'lm_head.weight' differs from 'wte.weight'"):
        load(tmp_path)


def test_gpt2_fused_attention_shape_checked(tmp_path, gpt2_parts):
    config, tensors, tok_dir = gpt2_parts
    write_gpt2(tmp_path, config, {**tensors, "h.1.attn.c_attn.weight": torch.zeros(96, 32)}, tok_dir)
    with pytest.raises(QkvError, match=r"'h.1.attn.c_attn.weight' has shape \(96, 32\) but config.json implies \(32, 96\)"):
        load(tmp_path)


# -- config.json checked before anything is allocated (issue 9 item 6) ------------------------
@pytest.fixture(scope="module")
def neox_dir(tmp_path_factory):
    """A tiny random GPT-NeoX checkpoint (transformers' save_pretrained) with a tokenizer.json."""
    from hf_decoders import make_checkpoint

    path, _ = make_checkpoint(tmp_path_factory.mktemp("neox"), "GPTNeoXConfig", "GPTNeoXForCausalLM",
                              hidden_size=32, num_attention_heads=4, num_hidden_layers=2,
                              intermediate_size=40, max_position_embeddings=32, rotary_pct=0.5)
    return path


def edited_copy(src: str, dst, **changes):
    """``src``'s files hard-linked into ``dst`` (a symbolic link out of a checkpoint is refused),
    config.json with ``changes``."""
    dst.mkdir(exist_ok=True)
    for f in os.listdir(src):
        if f != "config.json":
            os.link(os.path.join(src, f), dst / f)
    with open(os.path.join(src, "config.json")) as f:
        raw = json.load(f)
    (dst / "config.json").write_text(json.dumps(raw | changes))
    return dst


@pytest.mark.parametrize("change, message", [
    ({"num_hidden_layers": 10**9}, r"num_hidden_layers is 1000000000 but .*model.safetensors holds 2 layers \(0–1\)"),
    ({"num_hidden_layers": 1e9}, r"num_hidden_layers must be an integer >= 1, got 1000000000.0"),
    ({"hidden_size": 4 * 10**8}, r"'gpt_neox.embed_in.weight' has shape \(300, 32\) but config.json implies \(300, 400000000\)"),
    ({"vocab_size": 10**12}, r"embed_in.weight' has shape \(300, 32\) but config.json implies \(1000000000000, 32\)"),
    ({"intermediate_size": 10**9}, r"dense_h_to_4h.weight' has shape \(40, 32\) but config.json implies \(1000000000, 32\)"),
    ({"vocab_size": 200}, r"has shape \(300, 32\) but config.json implies \(200, 32\)"),
])
def test_config_checked_against_the_header_first(neox_dir, tmp_path, change, message):
    """Huge or wrong sizes fail at once, from the header, before any tensor or module exists."""
    import time

    path = edited_copy(neox_dir, tmp_path / "ckpt", **change)
    start = time.perf_counter()
    with pytest.raises(QkvError, match=message):
        load(path)
    assert time.perf_counter() - start < 2.0


BAD_VALUES = ["x", [1], {"a": 1}, True, 2.5, -1, 10**30, None, float("nan")]


@pytest.mark.parametrize("model_type", ["bert", "gpt2", "gpt_neox", "roberta", "distilbert"])
def test_config_values_of_the_wrong_type_are_value_errors(model_type):
    """Every key of a valid config.json, set to each wrong value: a ValueError naming the key
    (QkvError), or a config that reads — never a TypeError, KeyError or AttributeError."""
    from qkv.models import FAMILIES
    from qkv.models.bert import BertConfig
    from qkv.models.distilbert import DistilBertConfig
    from qkv.models.gpt_neox import GPTNeoXConfig
    from qkv.models.roberta import RobertaConfig

    fields = {"bert": BertConfig(), "gpt2": GPT2Config(), "gpt_neox": GPTNeoXConfig(),
              "roberta": RobertaConfig(), "distilbert": DistilBertConfig()}[model_type]
    valid = {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(fields).items()}
    valid["hidden_act" if "hidden_act" in valid else "activation" if "activation" in valid
          else "activation_function"] = "gelu"
    family = FAMILIES[model_type]
    keys = [*valid, "architectures", "rope_parameters", "rope_scaling", "use_parallel_residual",
            "tie_word_embeddings", "attention_bias", "position_embedding_type", "sinusoidal_pos_embds"]
    for key in keys:
        for bad in BAD_VALUES:
            d = {"model_type": model_type, **valid, key: bad}
            try:
                family.config_from_dict(d, where="config.json")
            except QkvError as e:
                assert key in str(e) or "divisible" in str(e) or "rotary" in str(e), (key, bad, str(e))


def test_tokenizer_larger_than_the_vocabulary(neox_dir, tmp_path):
    """A tokenizer from another model (ids past the embedding table) is refused at load."""
    from hf_decoders import CORPUS
    from tokenizers import ByteLevelBPETokenizer

    path = edited_copy(neox_dir, tmp_path / "ckpt")
    os.remove(path / "tokenizer.json")
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(CORPUS * 5 + [" ".join(map(str, range(400)))], vocab_size=420, min_frequency=1)
    tok.save(str(path / "tokenizer.json"))
    with pytest.raises(QkvError, match=r"tokenizer in .* has 4\d\d tokens but the model's vocab_size is 300"):
        load(path)


def test_bad_name_dtype_and_device_are_named(neox_dir):
    with pytest.raises(QkvError, match="name_or_path must be a model name or a directory, got NoneType"):
        load(None)
    with pytest.raises(QkvError, match="name_or_path is empty"):
        load("")
    with pytest.raises(QkvError, match="dtype must be a floating-point torch.dtype, got 'bf16'"):
        load(neox_dir, dtype="bf16")
    with pytest.raises(QkvError, match="device 'gpu:0' is not available here"):
        load(neox_dir, device="gpu:0")
    model = load(neox_dir, device="cpu", dtype=torch.float64)
    assert {p.device.type for p in model.parameters()} == {"cpu"}
    assert {p.dtype for p in model.parameters()} == {torch.float64}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_load_onto_the_gpu(neox_dir):
    model = load(neox_dir, device="cuda")
    assert {p.device.type for p in model.parameters()} == {"cuda"}
    assert all(b.device.type == "cuda" for b in model.buffers())
    ids = torch.tensor([[1, 2, 3]], device="cuda")
    with torch.no_grad():
        on_gpu = model(ids).logits.cpu()
        on_cpu = load(neox_dir)(ids.cpu()).logits
        exact = load(neox_dir, dtype=torch.float64)(ids.cpu()).logits
    # CUDA's float32 matmuls (TF32 off) sum in another order than the CPU's: the GPU may be at
    # most twice as far from the float64 truth as the CPU's float32 forward is
    assert_within(on_gpu, exact, on_cpu, what="float32 logits on the GPU")


def mapped_file(tensor: torch.Tensor) -> str | None:
    """The file whose memory mapping holds ``tensor``'s data (Linux's /proc/self/maps), or None."""
    ptr = tensor.data_ptr()
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if lo <= ptr < hi:
                return parts[5] if len(parts) > 5 else None
    return None


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="reads Linux's /proc/self/maps")
def test_weights_kept_as_stored_are_views_of_the_file(neox_dir):
    """Memory-mapped: a tensor used as stored is not copied (its data lies in a mapping of the
    file); one that is converted (the split query_key_value, a cast) is a copy of its own."""
    file = os.path.realpath(os.path.join(neox_dir, "model.safetensors"))
    model = load(neox_dir)
    assert mapped_file(model.embed_tokens.weight) == file
    assert mapped_file(model.layers[0].feed_forward.fc1.weight) == file
    assert mapped_file(model.layers[0].self_attn.q_proj.weight) != file
    assert mapped_file(load(neox_dir, dtype=torch.float64).embed_tokens.weight) != file
    with torch.no_grad():  # the mapping is private: a change stays in this process's memory
        model.embed_tokens.weight[0, 0] += 1
    assert not torch.equal(load(neox_dir).embed_tokens.weight[0], model.embed_tokens.weight[0])


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads Linux's /proc/self/status")
def test_peak_memory_while_loading_is_about_the_checkpoint(tmp_path):
    """Peak RSS growth while loading ≤ 1.3 × the checkpoint (measured in a fresh process;
    benchmarks/load_memory.py has the full-size figures)."""
    import subprocess
    import sys

    from hf_decoders import make_checkpoint

    make_checkpoint(tmp_path, "GPTNeoXConfig", "GPTNeoXForCausalLM", hidden_size=512,
                    num_attention_heads=8, num_hidden_layers=4, intermediate_size=2048,
                    max_position_embeddings=64, rotary_pct=0.25, vocab_size=300)
    size = os.path.getsize(tmp_path / "model.safetensors")
    # VmHWM: this process's peak RSS (ru_maxrss would start from pytest's, inherited at exec).
    # Building modules on the meta device imports torch's meta-op machinery once per process
    # (a fixed ~75 MB, whatever the checkpoint): done before measuring.
    # `import qkv` imports its names on first use: the library's modules are imported before too
    code = ("import sys, torch, qkv, qkv.models, qkv.modules, qkv.attention\n"
            "def status(key):\n"
            "    line = next(l for l in open('/proc/self/status') if l.startswith(key + ':'))\n"
            "    return int(line.split()[1]) * 1024\n"
            "torch.empty(1, device='meta').normal_()\n"  # one-time import of meta ops (~75 MB)
            "before = status('VmRSS')\n"
            "m = qkv.load(sys.argv[1]); s = sum(float(p.sum()) for p in m.parameters())\n"
            "print(status('VmHWM') - before)")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True,
                         check=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
                         timeout=300).stdout.split()  # on a timeout, run() kills and reaps the child
    peak_growth = int(out[0])
    assert peak_growth <= 1.3 * size, f"peak RSS grew {peak_growth / size:.2f}× the checkpoint ({size} bytes)"


# -- issue 31: the one checkpoint reader on the native path ------------------------------------------
@pytest.mark.parametrize("model_type", [["bert"], {"a": 1}, 7, ""])
def test_a_model_type_that_is_not_a_string_is_one_error(tmp_path, model_type):
    checkpoint_copy(tmp_path, config={"model_type": model_type})
    for via in (None, "native"):
        with pytest.raises(QkvError, match=r"model_type must be a non-empty string"):
            load(tmp_path, via=via)


@pytest.mark.parametrize("shard, message", [
    ("../outside.safetensors", r"'\.\./outside\.safetensors' is not a plain file name"),
    ("/abs/outside.safetensors", r"'/abs/outside\.safetensors' is not a plain file name"),
    ("link.safetensors", r"link\.safetensors is a symbolic link to .*model\.safetensors, outside"),
])
def test_native_shards_stay_inside_the_directory(tmp_path, shard, message):
    path = tmp_path / "m"
    path.mkdir()
    checkpoint_copy(path, weights=False)
    names = list(load_file(os.path.join(minilm_dir(), "model.safetensors")))
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {n: shard for n in names}}))
    os.symlink(os.path.join(minilm_dir(), "model.safetensors"), tmp_path / "outside.safetensors")
    os.symlink(tmp_path / "outside.safetensors", path / "link.safetensors")
    with pytest.raises(QkvError, match=message):
        load(path)


def test_a_base_llama_without_its_head_is_refused_by_name(tmp_path):
    """A ``LlamaModel`` directory (no lm_head.weight) was refused as a missing tensor."""
    transformers = pytest.importorskip("transformers")
    from hf_decoders import save_tokenizer

    config = transformers.LlamaConfig(vocab_size=300, hidden_size=16, num_hidden_layers=2,
                                      num_attention_heads=4, intermediate_size=24)
    transformers.LlamaModel(config).save_pretrained(tmp_path)
    save_tokenizer(str(tmp_path))
    with pytest.raises(QkvError, match=r"architecture 'LlamaModel' is the base model without its "
                                       r"head \('lm_head.weight' is not in the weights\)"):
        load(tmp_path)


@pytest.mark.parametrize("change, message", [
    ({"dtype": "float99"}, r"dtype 'float99' is not a floating-point dtype qkv reads"),
    ({"torch_dtype": "int8"}, r"torch_dtype 'int8' is not a floating-point dtype qkv reads"),
    ({"attn_implementation": "flash_attention_2"}, r"attn_implementation 'flash_attention_2' is not supported"),
    ({"quantization_config": {"quant_method": "gptq"}}, r"a quantized checkpoint \(quantization_config 'gptq'\)"),
    ({"rope_theta": "x"}, r"rope_theta must be a positive finite number, got 'x'"),
    ({"rope_scaling": {"rope_theta": -1.0}}, r"rope_theta must be a positive finite number, got -1.0"),
    ({"num_attention_heads": "4"}, r"num_attention_heads must be an integer >= 1, got '4'"),
])
def test_config_json_is_checked_the_same_way_on_every_path(neox_dir, tmp_path, change, message):
    """The checks of issue 31 item 3 are models/config.py's check_common, asked by qkv.load of
    every config.json: a native family refuses what the transformers path refuses (these
    loaded natively, the quantized one and the unknown dtype silently)."""
    path = edited_copy(neox_dir, tmp_path / "ckpt", **change)
    with pytest.raises(QkvError, match=message):
        load(path)
