"""Translation checkpoints: safetensors tensors + a JSON config, through `qkv.training.checkpoint`.

A checkpoint directory holds:

```text
config.json                      the commit point: sizes, training config, step, metrics,
                                 the command that made it, which files hold what, and
                                 "files": {name: sha256} for every other file below
model-<step>.safetensors         the weights
optimizer-<step>.safetensors     AdamW's moments (training runs only; --slim drops them)
tokenizer_en.json, tokenizer_fr.json
```

Writing and reading go through `qkv.training.checkpoint`: atomic files, config.json last,
and a file is read only when config.json lists it with a matching sha256 — tokenizers included,
so tokenizers left by another run are never picked up. Nothing is ever unpickled.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from qkv.errors import QkvError
from qkv.files import FILES_KEY, read_json, read_verified
from qkv.models.checkpoint import WeightFiles
from qkv.models.loading import parameters_on_meta
from qkv.models.registry import TRANSLATION_MODEL_TYPE
from qkv.translate.model import TranslationConfig, TranslationModel, upgrade_state_dict
from qkv.training.checkpoint import (
    get_field, listed_path, load_optimizer_tensors, load_tensors, optimizer_tensors, read_listed,
    read_manifest, save_tensors_writer, write_checkpoint,
)
from qkv.translate.vocab import Vocab

__all__ = ["Checkpoint", "load_checkpoint", "load_model", "save_checkpoint", "read_meta", "load_optimizer_tensors",
           "optimizer_tensors", "model_tensors", "load_model_tensors"]

MODEL_TYPE = TRANSLATION_MODEL_TYPE
# 2: every file listed with its sha256 under "files" (1 hashed the tensors only; it is refused).
FORMAT_VERSION = 2
# The files a translation checkpoint writes: those not listed by a new config.json are deleted.
KINDS = ("model-*.safetensors", "optimizer-*.safetensors", "tokenizer_*.json")
# The name that means "the small model shipped inside qkv" wherever a model directory is asked for.
DEFAULT_MODEL_NAME = "translate"


def default_model_dir() -> Path:
    """Where the shipped checkpoint lives: `qkv/data/translate`."""
    return Path(__file__).resolve().parent.parent / "data" / "translate"


def resolve_model_dir(model: str | os.PathLike | None) -> Path:
    """`None` or `"translate"` → the shipped checkpoint; anything else is a directory path.

    A real directory called `translate` in the working directory wins over the name.
    """
    if model is None or (str(model) == DEFAULT_MODEL_NAME and not Path(str(model)).is_dir()):
        return default_model_dir()
    return Path(model)


def model_name(directory: Path) -> str:
    """How messages and results name a translation model: `"translate (shipped)"` or its path."""
    shipped = Path(directory).resolve() == default_model_dir().resolve()
    return "translate (shipped)" if shipped else str(directory)


def is_translation_model(model: str | os.PathLike | None) -> bool:
    """True when `model` names a directory whose config.json says `"model_type": "qkv-translation"`.

    ([`qkv.load`][qkv.load] routes such a directory here by the same model_type:
    [`qkv.models.registry.route`][qkv.models.registry.route].)
    """
    path = resolve_model_dir(model) / "config.json"
    if not path.is_file():
        return False
    config = read_json(path)  # a bad file is named here, not taken for "some other model"
    return isinstance(config, dict) and config.get("model_type") == MODEL_TYPE


# -- model weights -------------------------------------------------------------------------------
def model_tensors(model: TranslationModel) -> dict[str, torch.Tensor]:
    """The state dict to save; a tied generator is the French embedding, so it is stored once."""
    sd = model.state_dict()
    if model.config.tie_embeddings:
        sd.pop("generator.weight")
    return sd


def _check_sizes(config: TranslationConfig, shapes: dict[str, tuple[int, ...]], where: str) -> None:
    """Sizes in config.json that no tensor of the checkpoint could hold are refused before the
    model is built (`"d_model": 1000000000` would otherwise ask for terabytes first), from the
    weights' header (`shapes`: name → shape)."""
    largest = max((max(s, default=1) for s in shapes.values()), default=1)
    for name in ("src_vocab_size", "tgt_vocab_size", "d_model", "ff_dim"):
        if getattr(config, name) > largest:
            raise QkvError(f"{where}: {name}={getattr(config, name)} but no tensor of the weights "
                           f"has a dimension that large (largest {largest})")
    for name in ("encoder_layers", "decoder_layers"):
        if getattr(config, name) > len(shapes):
            raise QkvError(f"{where}: {name}={getattr(config, name)} but the weights hold only "
                           f"{len(shapes)} tensors")
    if config.max_len > 1 << 16:
        raise QkvError(f"{where}: max_len={config.max_len} is more positions than qkv's "
                       f"translation models take (65536)")


def load_model_tensors(model: TranslationModel, tensors: dict[str, torch.Tensor], source: str,
                       *, check_only: bool = False) -> None:
    """Copy `tensors` into `model`; QkvError naming missing, unexpected or mis-shaped tensors.

    `check_only`: compare names and shapes only (`model` may be on the meta device; the
    values of `tensors` may be shapes)."""
    tensors = upgrade_state_dict(tensors)  # format-1 checkpoints: layers before the stack
    expected = model_tensors(model)
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise QkvError(f"{source}: weights do not match the config (missing {missing[:3]}, "
                       f"unexpected {unexpected[:3]})")
    for name in expected:  # the model's order: the first mismatch in the forward's order
        shape = tuple(tensors[name] if check_only else tensors[name].shape)
        if shape != tuple(expected[name].shape):
            raise QkvError(f"{source}: tensor {name} has shape {shape}, the config "
                           f"needs {tuple(expected[name].shape)}")
    if not check_only:
        model.load_state_dict(tensors, strict=False)


def read_weights(directory: Path, meta: dict) -> WeightFiles:
    """The checkpoint's weights file (`meta["weights"]["file"]`): listed in config.json, its
    bytes matching the sha256 there, read by the one safetensors reader
    (`qkv.models.checkpoint`: a regular file inside the directory, headers only)."""
    name = meta["weights"]["file"]
    path = listed_path(directory, meta, name, "weights")
    read_verified(path, meta[FILES_KEY][name], "weights file")
    weights = WeightFiles.open(directory, names=[name])
    for stored in weights.where:
        weights.check_dtype(stored)
    return weights


# -- checkpoints ---------------------------------------------------------------------------------
@dataclass
class Checkpoint:
    """A loaded checkpoint: the model (in eval mode), its vocabularies, and config.json."""

    model: TranslationModel
    vocab: Vocab
    meta: dict
    directory: Path
    optimizer_tensors: dict[str, torch.Tensor] | None = field(default=None, repr=False)

    @property
    def step(self) -> int:
        return int(self.meta.get("step", 0))


def read_meta(directory: str | Path) -> dict:
    """config.json of a translation checkpoint, its fields type-checked; QkvError when it is not one."""
    directory = Path(directory)
    meta = read_manifest(directory)
    path = directory / "config.json"
    if meta.get("model_type") != MODEL_TYPE:
        raise QkvError(f"{directory} is not a translation model (config.json has model_type "
                       f"{meta.get('model_type')!r}, expected {MODEL_TYPE!r})")
    if meta.get("format_version") != FORMAT_VERSION:
        raise QkvError(f"{path}: unsupported format_version {meta.get('format_version')!r} "
                       f"(this qkv reads {FORMAT_VERSION}; format 1 did not hash the tokenizers: "
                       f"retrain, or re-save with a qkv of that time)")
    where = str(path)
    get_field(meta, "step", int, where, minimum=0)
    for key in ("model", "weights"):
        get_field(meta, key, dict, where)
    get_field(meta["weights"], "file", str, f"{where} (weights)")
    if meta.get("optimizer") is not None:
        get_field(meta, "optimizer", dict, where)
        get_field(meta["optimizer"], "file", str, f"{where} (optimizer)")
        get_field(meta["optimizer"], "param_groups", list, f"{where} (optimizer)")
    for key, kind in (("train", dict), ("history", list), ("tokenizers", dict)):
        if meta.get(key) is not None:
            get_field(meta, key, kind, where)
    if meta.get("threads") is not None:
        get_field(meta, "threads", int, where, minimum=1)
    return meta


def load_checkpoint(model: str | os.PathLike | None = None, *, with_optimizer: bool = False) -> Checkpoint:
    """Load a translation checkpoint (`None`/"translate" = the shipped one).

    Every problem — a missing directory, a directory of another model type, a corrupt or
    mismatched file, a file config.json does not list with its sha256 — is a one-line
    `QkvError`.
    """
    directory = resolve_model_dir(model)
    meta = read_meta(directory)
    config = TranslationConfig.from_dict(meta["model"])
    texts = {name: read_listed(directory, meta, name, "tokenizer") for name in Vocab.FILES.values()}
    vocab = Vocab.from_texts(texts, directory)
    if (vocab.src_size, vocab.tgt_size) != (config.src_vocab_size, config.tgt_vocab_size):
        raise QkvError(f"{directory}: tokenizers have {vocab.src_size}/{vocab.tgt_size} words but "
                       f"the config says {config.src_vocab_size}/{config.tgt_vocab_size}")
    weights = read_weights(directory, meta)
    _check_sizes(config, weights.shapes, f"{directory}/config.json")
    with parameters_on_meta():  # the shapes the config implies, no parameter allocated
        shaped = TranslationModel(config)
    load_model_tensors(shaped, weights.shapes, str(directory), check_only=True)
    net = TranslationModel(config, vocab=vocab, name=model_name(directory), directory=directory)
    load_model_tensors(net, {n: weights.read(n, shared=False) for n in weights.where}, str(directory))
    net.eval()
    opt = None
    if with_optimizer:
        if not isinstance(meta.get("optimizer"), dict):
            raise QkvError(f"{directory}: the checkpoint has no optimizer state to resume from "
                           f"(it was saved with --slim)")
        opt = load_tensors(directory, meta, meta["optimizer"]["file"], "optimizer")
    return Checkpoint(net, vocab, meta, directory, opt)


def load_model(path: str | os.PathLike, *, name: str | None = None, dtype: torch.dtype | None = None,
               device: torch.device | None = None, files: dict | None = None) -> TranslationModel:
    """The registry's `translation` loader ([`qkv.load`][qkv.load]): the checkpoint's model, in eval
    mode, on `device` in `dtype` (None: as stored). `name` and `files` are
    `load_checkpoint`'s own (config.json names the model's files)."""
    return load_checkpoint(path).model.to(device=device, dtype=dtype)


def save_checkpoint(directory: str | Path, model: TranslationModel, vocab: Vocab, meta: dict,
                    *, step: int, optimizer: torch.optim.Optimizer | None = None) -> Path:
    """Write a checkpoint of `model` at `step` (and the optimizer, for `--resume`).

    `meta` is merged into config.json (the training config, metrics, the command…). The
    tokenizers and tensors go first, config.json (listing each with its sha256) last; older
    tensor files are removed once it names the new ones.
    """
    directory = Path(directory)
    weights = f"model-{step:06d}.safetensors"
    files = {name: text.encode("utf-8") for name, text in vocab.texts().items()}
    files[weights] = save_tensors_writer(model_tensors(model))
    record = dict(meta)
    record.update(model_type=MODEL_TYPE, format_version=FORMAT_VERSION, step=step,
                  model=model.config.to_dict(), tokenizers=dict(Vocab.FILES),
                  weights={"file": weights}, optimizer=None)
    if optimizer is not None:
        tensors, groups = optimizer_tensors(optimizer)
        name = f"optimizer-{step:06d}.safetensors"
        files[name] = save_tensors_writer(tensors)
        record["optimizer"] = {"file": name, "param_groups": groups}
    write_checkpoint(directory, files, record, kinds=KINDS)
    return directory
