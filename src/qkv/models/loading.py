"""`load(name_or_path)`: a Hugging Face checkpoint directory → a ready qkv model.

[`load`][qkv.models.loading.load] resolves a name (`qkv.models.registry.SHIPPED`), reads
config.json, verifies a qkv manifest's files and hands the directory to the loader
[`qkv.models.registry.route`][qkv.models.registry.route] names:
[`load_native`][qkv.models.loading.load_native] here, or the transformers, seq2seq and translation
loaders (imported by module path when needed). The native loader:

A directory holds `config.json` (which family, which sizes), `model.safetensors` or a
sharded `model.safetensors.index.json` with its shards (the weights; never a pickle — qkv
does not unpickle files) and the tokenizer files. Loading:

1. read `config.json` → the family's config dataclass (unsupported variants and wrong types
   raise, naming the key);
2. read the safetensors *headers* (no data) through the one reader every loader uses
   (`qkv.models.checkpoint`: files inside the directory, never a pickle) and check the
   config against them — first the number of layers, then every name (none missing, none
   unexpected), shape and dtype — before anything is allocated;
3. translate Hugging Face's names and layouts to qkv's modules (GPT-2's `Conv1D` weights
   are stored transposed, GPT-NeoX's q/k/v fused per head …), one tensor at a time;
4. build the family's model around them, with the tokenizer (one record per family in
   [`qkv.models.registry`][qkv.models.registry]; nothing here is family-specific).

Memory: the files are memory-mapped (`safetensors.safe_open`). A tensor the family uses as
stored (same dtype, on the CPU) stays a view of the mapping — no copy, its pages shared with the
OS's file cache; a tensor that must be converted (transposed, split, cast, moved to a device)
is read through a mapping of its own that is released as soon as the converted copy exists. So
loading never holds a checkpoint twice (`benchmarks/RESULTS.md` records peak RSS / checkpoint
size). The mapping is private (copy-on-write): changing a loaded weight never writes the file.

Every failure is one `QkvError` line naming the file, tensor or limit.
"""

from __future__ import annotations

import contextlib
import os
from typing import Callable

import torch
from torch import nn

from qkv.errors import QkvError
from qkv.files import manifest_files, read_json, verify_listed_files
from qkv.models import config as cfg
from qkv.models.checkpoint import WeightFiles
from qkv.models.family import Family
from qkv.models.registry import FAMILIES, LOADERS, SHIPPED, VIA, minilm_dir, route
from qkv.models.tokenizer import Tokenizer

__all__ = ["KNOWN_MODELS", "load", "load_native", "lm_dir", "minilm_dir", "resolve"]


def lm_dir() -> str:
    """The small Llama trained by `qkv train lm` (induction heads), shipped in `qkv/data/lm`."""
    return SHIPPED["lm"].find()


# The shipped self-attention models by name → (display name, directory finder): what
# ``qkv explain`` and ``qkv heads`` run by name (the registry's SHIPPED has them all).
KNOWN_MODELS: dict[str, tuple[str, Callable[[], str]]] = {
    key: (s.display, s.find) for key, s in SHIPPED.items() if s.self_attention}


# -- the loader -------------------------------------------------------------------------------
def load(name_or_path: str | os.PathLike, *, dtype: torch.dtype | None = None,
         device: str | torch.device | None = None, via: str | None = None):
    """A ready model (e.g. `BertModel`, `GPTNeoXModel`) in eval mode, with its tokenizer.

    The model meets [`qkv.models.protocol`][qkv.models.protocol] (`SelfAttentionModel` or
    `CrossAttentionModel`); its `tokenizer`, `name` and `config` fields are set by its
    constructor, nothing is attached afterwards. Which loader reads a directory is
    [`qkv.models.registry.route`][qkv.models.registry.route] (one table: native family,
    transformers, seq2seq, translation).

    Args:
        name_or_path: a known name (`"minilm"` / `"all-MiniLM-L6-v2"`, `"lm"`,
            `"translate"`: the shipped translation model) or a directory in Hugging Face
            format: `config.json`, `model.safetensors` (or sharded
            `model.safetensors.index.json`) and tokenizer files; or a translation checkpoint
            directory (`qkv train translate --out`).
        dtype: the floating-point dtype of the weights (e.g. `torch.bfloat16`); None keeps
            the dtype the checkpoint stores (the widest, if its tensors differ).
        device: where the weights go (`"cpu"`, `"cuda:0"`, `"mps"` …); None is the CPU.
        via: None — a native family when qkv has one for the model_type, else the transformers
            model on qkv's attention behind the same protocol (`qkv.hf.adapter.HFModel`,
            needs `qkv[hf]`); `"hf"` — the transformers model even where a family exists
            (to compare the two); `"native"` — a native family or an error.

    Raises:
        QkvError: unknown name, missing directory or file, invalid config, unsupported
            architecture, corrupt weights, missing/unexpected tensor, shape or dtype mismatch,
            a tokenizer with ids the model's vocabulary does not have, an unavailable device.

    Examples:
        >>> model = load("minilm")                                 # doctest: +SKIP
        >>> model.tokenizer.encode("attention").tokens             # doctest: +SKIP
        ['[CLS]', 'attention', '[SEP]']
    """
    if dtype is not None and (not isinstance(dtype, torch.dtype) or not dtype.is_floating_point):
        raise QkvError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
    if via not in VIA:
        raise QkvError(f"via must be None, 'hf' or 'native', got {via!r}")
    device = _check_device(device)
    path, name = resolve(name_or_path)
    config_file = os.path.join(path, "config.json")
    raw = read_config(config_file)
    kind = route(raw, via, config_file)
    cfg.check_common(raw, config_file)
    listed = manifest_files(raw, config_file)  # a qkv checkpoint: exactly these files, verified
    if listed is not None:
        verify_listed_files(path, listed)
    loader = LOADERS[kind]
    files = dict(files=listed) if loader.files else {}
    return loader.function()(path, name=name, dtype=dtype, device=device, **files)


def load_native(path: str, *, name: str, dtype: torch.dtype | None, device: torch.device,
                files: dict[str, str] | None = None) -> nn.Module:
    """The registry's `native` loader: the family of config.json's model_type, its weights
    checked from the headers (layer count first, then names, shapes, dtypes) before anything
    is built."""
    config_file = os.path.join(path, "config.json")
    raw = read_config(config_file)
    family = FAMILIES[raw["model_type"]]
    config = family.config_from_dict(raw, where=config_file)
    weights = WeightFiles.open(path, family.prefix, files)
    weights.check_layers(getattr(config, family.layers_key, None), family.layers_key, config_file)
    _check_head(weights, family, config, raw, config_file)
    weights.check(family.shapes(config), family.ignored)
    dtype = dtype or weights.stored_dtype()
    tokenizer = Tokenizer.from_dir(path, name=name, max_length=family.max_length(config), files=files)
    _check_vocabulary(tokenizer, config, path)
    model = _build_without_parameters(family, config, tokenizer=tokenizer, name=name, directory=path)
    as_stored = _kept_as_stored(family, config, weights.expected, dtype)
    state = family.convert(weights.tensors(dtype, device, as_stored), config)
    model.load_state_dict(state, strict=True, assign=True)
    for param, source in family.tied:  # assign=True made each name its own Parameter: tie again
        owner, _, attr = param.rpartition(".")
        setattr(model.get_submodule(owner), attr, model.get_parameter(source))
    _check_tied(weights, family, dtype)
    return model.to(device).eval()  # the parameters are there already; this moves the buffers


def _check_head(weights: WeightFiles, family: Family, config, raw: dict, config_file: str) -> None:
    """A base-model checkpoint (`LlamaModel`: no `lm_head.weight`) of a family whose model
    ends in a language-model head is refused by name, not as a missing tensor."""
    missing = [n for n in family.shapes(config) if n not in weights.where]
    archs = raw.get("architectures") or []
    if missing and all(n.startswith("lm_head.") for n in missing) and archs and "For" not in archs[0]:
        raise QkvError(f"{config_file}: architecture {archs[0]!r} is the base model without "
                       f"its head ({missing[0]!r} is not in the weights); qkv's native "
                       f"{raw['model_type']} runs the model with its language-model head: load "
                       f"the ...ForCausalLM checkpoint, or this one with via='hf'")


def resolve(name_or_path: str | os.PathLike) -> tuple[str, str]:
    """A known name or a directory → (directory, display name)."""
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise QkvError(f"name_or_path must be a model name or a directory, got "
                       f"{type(name_or_path).__name__} {name_or_path!r}")
    key = os.fspath(name_or_path)
    if not key:
        raise QkvError("name_or_path is empty: give a model name or a checkpoint directory")
    if key in SHIPPED:
        return SHIPPED[key].find(), SHIPPED[key].display
    key = os.path.expanduser(key)
    if os.path.isdir(key):
        return key, os.path.basename(os.path.normpath(os.path.abspath(key)))
    if os.path.exists(key):
        raise QkvError(f"{key} is a file; give the checkpoint directory that holds it")
    if os.sep in key or (os.altsep and os.altsep in key) or key.startswith("."):  # a path
        raise QkvError(f"model directory {key} does not exist")
    raise QkvError(f"unknown model {key!r}: known names are {', '.join(SHIPPED)}; "
                   f"or give a directory with config.json and model.safetensors")


def _check_device(device) -> torch.device:
    if device is None:
        return torch.device("cpu")
    try:
        device = torch.device(device)
        torch.empty(0, device=device)
    except (RuntimeError, TypeError, ValueError, AssertionError) as e:
        raise QkvError(f"device {str(device)!r} is not available here ({str(e).splitlines()[0]})") from None
    return device


def _check_vocabulary(tokenizer: Tokenizer, config, path: str) -> None:
    """Every id the tokenizer can produce must be a row of the model's embedding table.

    (A model's table may be larger — Pythia pads 50277 tokens to 50304 rows — never smaller:
    a tokenizer from another model would index past the table or, worse, into wrong rows.)
    """
    rows = getattr(config, "vocab_size", None)
    if rows is not None and tokenizer.vocab_size > rows:
        raise QkvError(f"the tokenizer in {path} has {tokenizer.vocab_size} tokens but the "
                       f"model's vocab_size is {rows} (config.json): a tokenizer from another "
                       f"model?")


def _build_without_parameters(family: Family, config, **kwargs) -> nn.Module:
    """`family.build(config, **kwargs)` with every parameter on the meta device
    ([`parameters_on_meta`][qkv.models.loading.parameters_on_meta]): they are about to be replaced
    by the checkpoint's tensors."""
    with parameters_on_meta():
        return family.build(config, **kwargs)


@contextlib.contextmanager
def parameters_on_meta():
    """Every module built in the block gets its parameters on the meta device: neither
    allocated nor randomly initialised; buffers (rotary frequencies, …) are computed for real,
    which building the whole model under `torch.device("meta")` would not do (and torch's meta
    `arange` and `normal_` import `torch._dynamo`: seconds). (The hook is global while it is
    registered: load models from one thread at a time.)

    Examples:
        >>> with parameters_on_meta():
        ...     layer = nn.Linear(4, 2)
        >>> layer.weight.is_meta
        True
    """
    def on_meta(module, name, param):
        return None if param is None else nn.Parameter(param.to("meta"), param.requires_grad)

    handle = nn.modules.module.register_module_parameter_registration_hook(on_meta)
    try:
        with _SkipMetaInit():
            yield
    finally:
        handle.remove()


class _SkipMetaInit(torch.overrides.TorchFunctionMode):
    """In-place calls on a meta tensor (`nn.init.normal_(weight)` …) skipped: a meta tensor has
    no numbers to fill. Not only saved work: torch's meta `normal_` imports `torch._dynamo`
    on first use, which took seconds of every `qkv.load` (and of every command that loads)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        first = args[0] if args else kwargs.get("tensor")  # nn.init passes it by keyword
        if name.endswith("_") and not name.endswith("__") and isinstance(first, torch.Tensor) \
                and first.is_meta:
            return first
        return func(*args, **kwargs)


def read_config(file: str) -> dict:
    """config.json of a checkpoint directory as a dict; one QkvError naming the file else."""
    if not os.path.lexists(file):
        raise QkvError(f"{file} is missing (a checkpoint directory needs config.json)")
    data = read_json(file)
    if not isinstance(data, dict):
        raise QkvError(f"{file} must hold a JSON object, got {type(data).__name__}")
    return data


def _check_tied(weights: WeightFiles, family: Family, dtype: torch.dtype) -> None:
    """A stored copy of a tied tensor (GPT-2's lm_head.weight) must equal what it is tied to."""
    for param, source in family.tied:
        if param not in weights.where or source not in weights.where:
            continue
        head = weights.read(param, shared=False).to(dtype)
        src = weights.read(source, shared=False).to(dtype)
        if head.shape != src.shape or not torch.equal(head, src):
            file, stored = weights.where[param]
            raise QkvError(f"{file}: tensor {stored!r} differs from {source!r}, which qkv "
                           f"ties it to (untied heads are not supported)")


def _kept_as_stored(family: Family, config, expected: dict[str, tuple[int, ...]],
                    dtype: torch.dtype) -> set[str]:
    """Names of the tensors that `family.convert` puts in the model as they are (or as views).

    Found by running `convert` on meta tensors (no data): an output that is a source or a
    view of one (`.t()`, `chunk`) keeps that source; a fresh tensor (`contiguous` copy,
    concatenation) does not.
    """
    meta = {name: torch.empty(shape, dtype=dtype, device="meta") for name, shape in expected.items()}
    state = family.convert(meta, config)
    roots = {id(t._base if t._base is not None else t) for t in state.values()}
    return {name for name, t in meta.items() if id(t) in roots}
