"""A transformers checkpoint directory, built with ``attn_implementation="qkv"`` — or one error
naming the architecture and why it cannot run on qkv (nothing downloaded, no remote code ever).

    >>> import qkv.hf                                            # doctest: +SKIP
    >>> model = qkv.hf.load("path/to/olmo2")                     # doctest: +SKIP
    >>> model.config._attn_implementation                        # doctest: +SKIP
    'qkv'
"""

from __future__ import annotations

import os
import re

import torch

from qkv.errors import QkvError
from qkv.files import read_json


def load(path: str | os.PathLike, *, dtype=None):
    """The transformers model of ``path`` (its ``architectures[0]`` class, eval mode) on qkv.

    Raises :class:`~qkv.errors.QkvError` (a ``ValueError``) when transformers cannot build the
    model_type (remote code is never run), when the class's attention does not go through
    transformers' ``AttentionInterface``, or when the directory has no config.json.
    """
    import transformers

    from qkv.hf.attention import NAME

    config_file = os.path.join(os.fspath(path), "config.json")
    try:  # a regular file, nested at most MAX_JSON_DEPTH: never a hang or a RecursionError
        raw = read_json(config_file)
    except QkvError as e:
        raise QkvError(f"cannot read a transformers config: {e}") from None
    if not isinstance(raw, dict):
        raise QkvError(f"{config_file}: cannot read a transformers config (a JSON object is "
                       f"needed, got {type(raw).__name__})")
    model_type = raw.get("model_type")
    architectures = raw.get("architectures") or []
    name = architectures[0] if architectures else model_type
    if model_type not in transformers.CONFIG_MAPPING:
        remote = " (its config names remote code, which qkv never runs)" if "auto_map" in raw else ""
        raise QkvError(f"{config_file}: transformers {transformers.__version__} cannot build "
                       f"model_type {model_type!r}{remote}; qkv runs architectures that transformers "
                       f"itself implements")
    cls = getattr(transformers, name, None) if isinstance(name, str) else None
    if cls is None:
        raise QkvError(f"{config_file}: architecture {name!r} is not a transformers class; qkv runs "
                       f"architectures that transformers itself implements")
    wants = getattr(getattr(cls, "config_class", None), "model_type", model_type)
    if wants and wants != model_type:  # transformers would build it, warning in a log line only
        raise QkvError(f"{config_file}: architecture {name!r} is a {wants!r} model but config.json "
                       f"says model_type {model_type!r}; config.json and the weights disagree")
    # transformers' own test (a private heuristic on the modelling source, read defensively):
    # an ``*Attention(nn.Module)`` that calls ALL_ATTENTION_FUNCTIONS.get_interface
    can_set = getattr(cls, "_can_set_attn_implementation", None)
    if can_set is not None and not can_set():
        raise QkvError(f"{name}: its attention does not go through transformers' AttentionInterface, "
                       f"so it cannot run on qkv; load it with attn_implementation='eager'")
    config = cls.config_class.from_pretrained(path, local_files_only=True, trust_remote_code=False)
    check_weights(path, cls, config)
    kw = {} if dtype is None else dict(dtype=dtype)
    model, info = cls.from_pretrained(path, attn_implementation=NAME, trust_remote_code=False,
                                      local_files_only=True, output_loading_info=True, **kw)
    missing = sorted(info.get("missing_keys") or ())
    if missing:  # transformers would initialise them at random and say so in a log line only
        raise QkvError(f"{path}: the checkpoint has no tensor {missing[0]!r}"
                       f"{f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''} that "
                       f"{name} with this config.json needs; config.json and the weights disagree")
    return model.eval()


# a layer's index in a checkpoint name: model.layers.3.…, encoder.layer.3.…, transformer.h.3.…
_LAYER = re.compile(r"\.(?:layers|layer|h|block|blocks)\.(\d+)\.")


def weight_files(path: str) -> list[str]:
    """The safetensors files of a checkpoint directory (the index's shards, or the one file)."""
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        raw = read_json(index)
        shards = sorted(set((raw.get("weight_map") or {}).values())) if isinstance(raw, dict) else []
        return [os.path.join(path, f) for f in shards if isinstance(f, str)]
    one = os.path.join(path, "model.safetensors")
    return [one] if os.path.isfile(one) else []


def check_weights(path: str | os.PathLike, cls, config) -> None:
    """One QkvError naming the tensor and file when the safetensors *headers* (no data read)
    disagree with the model that ``config`` describes: another number of layers, or a tensor
    whose shape is not the model's (e.g. a changed hidden_size). Names the model does not have
    under the same name (renamed by transformers' loading, or dropped) are left to it.
    """
    from safetensors import SafetensorError, safe_open

    path = os.fspath(path)
    with torch.device("meta"):  # shapes only: nothing allocated, nothing initialised
        model = cls._from_config(config)
    prefix = (getattr(model, "base_model_prefix", "") or "") + "."
    strip = lambda n: n[len(prefix):] if prefix != "." and n.startswith(prefix) else n  # noqa: E731
    expected = {strip(n): tuple(p.shape) for n, p in model.state_dict().items()}
    layers = {int(m.group(1)) for n in expected if (m := _LAYER.search("." + n))}
    stored_layers: dict[int, tuple[str, str]] = {}
    for file in weight_files(path):
        try:
            with safe_open(file, framework="pt") as f:
                for key in f.keys():
                    name = strip(key)
                    m = _LAYER.search("." + name)
                    if m:
                        stored_layers.setdefault(int(m.group(1)), (key, file))
                    shape = tuple(f.get_slice(key).get_shape())
                    want = expected.get(name)
                    if want is not None and want != shape:
                        raise QkvError(f"{file}: tensor {key!r} has shape {shape} but "
                                       f"{cls.__name__} with this config.json needs {want}; "
                                       f"config.json and the weights disagree")
        except SafetensorError as e:
            raise QkvError(f"{file}: not a readable safetensors file ({e})") from None
    if layers and stored_layers and max(stored_layers) != max(layers):
        n, m = max(layers) + 1, max(stored_layers) + 1
        key, file = stored_layers[max(stored_layers)]
        raise QkvError(f"{file}: the weights hold {m} layers (the last: {key!r}) but config.json "
                       f"says {n}; config.json and the weights disagree")


def load_explainable(path: str | os.PathLike, *, name: str | None = None, dtype=None, device=None,
                     files=None):
    """``path`` as a qkv model (:class:`qkv.hf.adapter.HFModel`): :func:`load` on ``"qkv"``, with
    qkv's tokenizer over the directory's tokenizer files — what :func:`qkv.load` returns for a
    model_type without a native family."""
    from qkv.hf.adapter import wrap
    from qkv.models.tokenizer import Tokenizer

    path = os.fspath(path)
    name = name or os.path.basename(os.path.normpath(os.path.abspath(path)))
    hf = load(path, dtype=dtype)
    limit = getattr(hf.config, "max_position_embeddings", None)
    tokenizer = Tokenizer.from_dir(path, name=name, max_length=limit if isinstance(limit, int) else None,
                                   files=files)
    rows = getattr(hf.config, "vocab_size", None)
    if isinstance(rows, int) and tokenizer.vocab_size > rows:
        raise QkvError(f"the tokenizer in {path} has {tokenizer.vocab_size} tokens but the model's "
                       f"vocab_size is {rows} (config.json): a tokenizer from another model?")
    if device is not None:
        hf = hf.to(device)
    return wrap(hf, tokenizer, name=name)
