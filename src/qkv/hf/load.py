"""A transformers checkpoint directory, built with ``attn_implementation="qkv"`` — or one error
naming the architecture and why it cannot run on qkv (nothing downloaded, no remote code ever).

    >>> import qkv.hf                                            # doctest: +SKIP
    >>> model = qkv.hf.load("path/to/olmo2")                     # doctest: +SKIP
    >>> model.config._attn_implementation                        # doctest: +SKIP
    'qkv'
"""

from __future__ import annotations

import json
import os

from qkv.errors import QkvError


def load(path: str | os.PathLike, *, dtype=None):
    """The transformers model of ``path`` (its ``architectures[0]`` class, eval mode) on qkv.

    Raises :class:`~qkv.errors.QkvError` (a ``ValueError``) when transformers cannot build the
    model_type (remote code is never run), when the class's attention does not go through
    transformers' ``AttentionInterface``, or when the directory has no config.json.
    """
    import transformers

    from qkv.hf.attention import NAME

    config_file = os.path.join(os.fspath(path), "config.json")
    try:
        with open(config_file, encoding="utf-8") as f:
            raw = json.load(f)
    except (OSError, ValueError) as e:
        raise QkvError(f"{config_file}: cannot read a transformers config ({e})") from None
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
    # transformers' own test (a private heuristic on the modelling source, read defensively):
    # an ``*Attention(nn.Module)`` that calls ALL_ATTENTION_FUNCTIONS.get_interface
    can_set = getattr(cls, "_can_set_attn_implementation", None)
    if can_set is not None and not can_set():
        raise QkvError(f"{name}: its attention does not go through transformers' AttentionInterface, "
                       f"so it cannot run on qkv; load it with attn_implementation='eager'")
    kw = {} if dtype is None else dict(dtype=dtype)
    return cls.from_pretrained(path, attn_implementation=NAME, trust_remote_code=False,
                               local_files_only=True, **kw).eval()
