"""Reading Hugging Face `config.json` values with errors that name the key and the file."""

from __future__ import annotations

import math
from typing import Any, Iterable

from qkv.errors import QkvError

# HF activation names → qkv.modules.FeedForward's.
ACTIVATIONS = {
    "gelu": "gelu",  # exact erf GELU
    "gelu_new": "gelu_tanh",  # GPT-2's tanh approximation
    "gelu_pytorch_tanh": "gelu_tanh",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}


def get_int(d: dict, key: str, default: int | None = None, *, minimum: int = 1,
            where: str = "config.json") -> int:
    """`d[key]` as an int >= `minimum` (`default` when absent)."""
    value = d.get(key, default)
    if value is None:
        raise QkvError(f"{where} has no {key!r}")
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise QkvError(f"{where}: {key} must be an integer >= {minimum}, got {value!r}")
    return value


def get_float(d: dict, key: str, default: float, *, where: str = "config.json") -> float:
    value = d.get(key, default)
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0
            or not math.isfinite(value)):
        raise QkvError(f"{where}: {key} must be a positive finite number, got {value!r}")
    return float(value)


def get_bool(d: dict, key: str, default: bool, *, where: str = "config.json") -> bool:
    """`d[key]` as a bool (`default` when absent or null); anything but true/false raises."""
    value = d.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise QkvError(f"{where}: {key} must be true or false, got {value!r}")
    return value


def get_token_ids(d: dict, key: str, *, where: str = "config.json") -> tuple[int, ...]:
    """`d[key]` as a tuple of token ids: one id or a list of them (`eos_token_id`); () when
    absent or null."""
    value = d.get(key)
    values = [] if value is None else value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        raise QkvError(f"{where}: {key} must be a token id or a list of them, got {value!r}")
    return tuple(values)


def activation(d: dict, key: str, default: str, *, where: str = "config.json") -> str:
    """The qkv name of the activation `d[key]`; unsupported ones are a QkvError."""
    name = d.get(key, default)
    if not isinstance(name, str) or name not in ACTIVATIONS:
        raise QkvError(f"{where}: {key} {name!r} is not supported; qkv supports "
                       f"{', '.join(sorted(ACTIVATIONS))}")
    return ACTIVATIONS[name]


def check_architecture(d: dict, model_type: str, supported: Iterable[str], *,
                       where: str = "config.json") -> None:
    """Reject a config whose `model_type` or `architectures` qkv cannot run."""
    found = d.get("model_type", model_type)
    if found != model_type:
        raise QkvError(f"{where}: model_type {found!r} is not {model_type!r}")
    supported = tuple(supported)
    archs = d.get("architectures") or []
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        raise QkvError(f"{where}: architectures must be a list of class names, got {archs!r}")
    for arch in archs:
        if arch not in supported:
            raise QkvError(f"{where}: architecture {arch!r} is not supported; qkv runs "
                           f"{', '.join(supported)}")


def require(d: dict, key: str, allowed: Any, *, where: str = "config.json") -> None:
    """`d[key]`, when present, must equal `allowed` (a feature qkv does not implement)."""
    if key in d and d[key] is not None and d[key] != allowed:
        raise QkvError(f"{where}: {key}={d[key]!r} is not supported (qkv needs {allowed!r})")


def read_fields(cls: type, d: dict, names: Iterable[str], *, where: str = "config.json",
                activations: dict[str, str] | None = None,
                may_be_zero: Iterable[str] = ()) -> dict[str, Any]:
    """`{name: value}` for the dataclass `cls`'s fields `names`, read from `d` by each
    field's type (int, float, bool, `int | None`); a key missing from `d` takes the field's
    own default, so a family states its defaults once, on its config dataclass.

    `activations`: fields holding an activation name → the Hugging Face default name (the
    dataclass holds qkv's name, which may differ: `gelu_new` → `gelu_tanh`).
    `may_be_zero`: int fields for which 0 is valid (a token id); the others must be ≥ 1.

    Examples:
        >>> from qkv.models.gpt2 import GPT2Config
        >>> read_fields(GPT2Config, {"n_embd": 64}, ["n_embd", "n_layer", "n_inner"])
        {'n_embd': 64, 'n_layer': 12, 'n_inner': None}
    """
    import dataclasses
    import typing

    hints = typing.get_type_hints(cls)
    default = {f.name: f.default for f in dataclasses.fields(cls)}
    activations = activations or {}
    out: dict[str, Any] = {}
    for name in names:
        kind, fallback = hints[name], default[name]
        if name in activations:
            out[name] = activation(d, name, activations[name], where=where)
        elif kind is bool:
            out[name] = get_bool(d, name, fallback, where=where)
        elif kind is int:
            out[name] = get_int(d, name, fallback, minimum=0 if name in may_be_zero else 1,
                                where=where)
        elif kind is float:
            out[name] = get_float(d, name, fallback, where=where)
        elif kind == (int | None):
            out[name] = None if d.get(name) is None else get_int(d, name, where=where)
        else:
            raise TypeError(f"read_fields: {cls.__name__}.{name} has type {kind}")
    return out


# -- what any config.json is checked for, native or transformers ------------------------------------
# keys that hold a count or a size: a positive integer wherever they appear (a string, 0 or a
# negative number is refused here, not met as a ZeroDivisionError inside a model's code)
LAYER_KEYS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers", "encoder_layers",
              "decoder_layers", "num_decoder_layers")
SIZE_KEYS = LAYER_KEYS + (
    "vocab_size", "hidden_size", "n_embd", "d_model", "dim", "intermediate_size", "n_inner",
    "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim", "d_ff", "d_kv", "head_dim",
    "num_attention_heads", "n_head", "n_heads", "num_heads", "num_key_value_heads",
    "encoder_attention_heads", "decoder_attention_heads", "max_position_embeddings", "n_positions")
ACTIVATION_KEYS = ("hidden_act", "hidden_activation", "activation_function", "dense_act_fn")
# attention implementations a config.json may name: qkv's attention replaces them (the others
# need packages and kernels of their own)
ATTENTION_IMPLEMENTATIONS = (None, "eager", "sdpa", "qkv")


def check_common(raw: dict, where: str = "config.json") -> None:
    """One QkvError naming the key and value for what no checkpoint qkv reads may say: a size
    that is not a positive integer, a dtype that is not floating point, another attention
    implementation, a quantisation, a rope_theta that is not a positive finite number (at the
    top or in the rope dicts, as transformers 5 writes it). [`qkv.load`][qkv.load] asks it of every
    config.json it routes; a family's own reader checks the rest.

    Examples:
        >>> check_common({"hidden_size": 0})
        Traceback (most recent call last):
        ...
        qkv.errors.QkvError: config.json: hidden_size must be an integer >= 1, got 0
    """
    from qkv.models.checkpoint import DTYPE_NAMES

    for key in SIZE_KEYS:
        if raw.get(key) is not None:
            get_int(raw, key, where=where)
    for key in ("dtype", "torch_dtype"):
        value = raw.get(key)
        if value is not None and value not in DTYPE_NAMES:
            raise QkvError(f"{where}: {key} {value!r} is not a floating-point dtype qkv reads "
                           f"({', '.join(DTYPE_NAMES)})")
    if raw.get("attn_implementation") not in ATTENTION_IMPLEMENTATIONS:
        raise QkvError(f"{where}: attn_implementation {raw['attn_implementation']!r} is not "
                       f"supported: qkv runs the model on its own attention (remove the key)")
    if raw.get("quantization_config") is not None:
        method = raw["quantization_config"]
        method = method.get("quant_method") if isinstance(method, dict) else method
        raise QkvError(f"{where}: a quantized checkpoint (quantization_config {method!r}); qkv "
                       f"reads floating-point weights")
    for owner in _rope_sections(raw):
        if "rope_theta" in owner:
            get_float(owner, "rope_theta", 1.0, where=where)


def _rope_sections(raw: dict) -> list[dict]:
    """config.json and its rope dicts (`rope_parameters`, `rope_scaling`, one per layer kind
    in some models): wherever a `rope_theta` may be."""
    out, todo = [], [raw]
    while todo:
        d = todo.pop()
        out.append(d)
        todo += [v for k, v in d.items() if k in ("rope_parameters", "rope_scaling") and isinstance(v, dict)]
        if d is not raw:
            todo += [v for v in d.values() if isinstance(v, dict)]
    return out
