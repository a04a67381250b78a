"""Translation checkpoints: safetensors tensors + a JSON config, written atomically.

A checkpoint directory holds::

    config.json                      the commit point: sizes, training config, step, metrics,
                                     the command that made it, and which files hold the tensors
    model-<step>.safetensors         the weights
    optimizer-<step>.safetensors     AdamW's moments (training runs only; --slim drops them)
    tokenizer_en.json, tokenizer_fr.json

Every file is written to a temporary name and moved into place with ``os.replace``
(:mod:`qkv.files`); tensor files carry their step in their name and ``config.json`` is replaced
last. So at every instant ``config.json`` names a complete, consistent set of files: a run killed
mid-save leaves the previous checkpoint intact. Files no longer named by ``config.json`` are
deleted afterwards.

Nothing is ever unpickled: tensors are read with ``safetensors`` and checked against the sha256
recorded in ``config.json``; any mismatch is a :class:`~qkv.errors.QkvError`.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from qkv.errors import QkvError
from qkv.files import atomic_write, atomic_write_text
from qkv.models.translation import TranslationConfig, TranslationModel, upgrade_state_dict
from qkv.translate.vocab import Vocab

MODEL_TYPE = "qkv-translation"
FORMAT_VERSION = 1
# The name that means "the small model shipped inside qkv" wherever a model directory is asked for.
DEFAULT_MODEL_NAME = "translate"


def default_model_dir() -> Path:
    """Where the shipped checkpoint lives: ``qkv/data/translate``."""
    return Path(__file__).resolve().parent.parent / "data" / "translate"


def resolve_model_dir(model: str | os.PathLike | None) -> Path:
    """``None`` or ``"translate"`` → the shipped checkpoint; anything else is a directory path.

    A real directory called ``translate`` in the working directory wins over the name.
    """
    if model is None or (str(model) == DEFAULT_MODEL_NAME and not Path(str(model)).is_dir()):
        return default_model_dir()
    return Path(model)


def is_translation_model(model: str | os.PathLike | None) -> bool:
    """True when ``model`` names a directory whose config.json says ``"model_type": "qkv-translation"``.

    The explain command uses this to route ``--model`` to :mod:`qkv.cli.explain` (which calls :func:`qkv.explain.cross_attention`).
    """
    path = resolve_model_dir(model) / "config.json"
    try:
        return json.loads(path.read_text()).get("model_type") == MODEL_TYPE
    except (OSError, ValueError, AttributeError):
        return False


def _save_tensors(path: Path, tensors: dict[str, torch.Tensor]) -> str:
    """Write ``tensors`` atomically; return the file's sha256."""
    tensors = {k: v.detach().contiguous() for k, v in tensors.items()}
    atomic_write(path, lambda tmp: save_file(tensors, tmp))
    return _sha256(path)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _load_tensors(directory: Path, entry: dict, what: str) -> dict[str, torch.Tensor]:
    """Read a tensor file named in config.json, checking it exists and matches its sha256."""
    path = directory / str(entry.get("file", ""))
    if not path.is_file():
        raise QkvError(f"{directory}: {what} file {entry.get('file')!r} named in config.json is missing")
    if entry.get("sha256") and _sha256(path) != entry["sha256"]:
        raise QkvError(f"{path}: corrupt checkpoint ({what} file does not match its sha256 in config.json)")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:
        raise QkvError(f"{path}: corrupt checkpoint ({str(e).splitlines()[0][:120]})") from None


# -- model weights -------------------------------------------------------------------------------
def model_tensors(model: TranslationModel) -> dict[str, torch.Tensor]:
    """The state dict to save; a tied generator is the French embedding, so it is stored once."""
    sd = model.state_dict()
    if model.config.tie_embeddings:
        sd.pop("generator.weight")
    return sd


def load_model_tensors(model: TranslationModel, tensors: dict[str, torch.Tensor], source: str) -> None:
    """Copy ``tensors`` into ``model``; QkvError naming missing, unexpected or mis-shaped tensors."""
    tensors = upgrade_state_dict(tensors)  # format-1 checkpoints: layers before the stack
    expected = model_tensors(model)
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise QkvError(f"{source}: weights do not match the config (missing {missing[:3]}, "
                       f"unexpected {unexpected[:3]})")
    for name, t in tensors.items():
        if t.shape != expected[name].shape:
            raise QkvError(f"{source}: tensor {name} has shape {tuple(t.shape)}, the config "
                           f"needs {tuple(expected[name].shape)}")
    model.load_state_dict(tensors, strict=False)


# -- optimizer state -----------------------------------------------------------------------------
def optimizer_tensors(opt: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], list[dict]]:
    """AdamW's state as flat tensors ``state.<param>.<name>`` plus its JSON-able param groups."""
    sd = opt.state_dict()
    tensors = {}
    for idx, state in sd["state"].items():
        for name, value in state.items():
            tensors[f"state.{idx}.{name}"] = torch.as_tensor(value)
    groups = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()}
              for g in sd["param_groups"]]
    return tensors, groups


def load_optimizer_tensors(opt: torch.optim.Optimizer, tensors: dict[str, torch.Tensor],
                           groups: list[dict], source: str) -> None:
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        _, idx, name = key.split(".", 2)
        state.setdefault(int(idx), {})[name] = value
    groups = [{k: (tuple(v) if k == "betas" else v) for k, v in g.items()} for g in groups]
    try:
        opt.load_state_dict({"state": state, "param_groups": groups})
    except (ValueError, KeyError, RuntimeError) as e:
        raise QkvError(f"{source}: optimizer state does not match the model ({e})") from None


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
    """config.json of a translation checkpoint; QkvError when it is not one."""
    directory = Path(directory)
    if not directory.is_dir():
        raise QkvError(f"model directory {str(directory)!r} does not exist")
    path = directory / "config.json"
    if not path.is_file():
        raise QkvError(f"{directory} is not a qkv model directory (no config.json)")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise QkvError(f"{path}: corrupt checkpoint (config.json is not valid JSON: {e})") from None
    if not isinstance(meta, dict) or meta.get("model_type") != MODEL_TYPE:
        kind = meta.get("model_type") if isinstance(meta, dict) else None
        raise QkvError(f"{directory} is not a translation model (config.json has model_type "
                       f"{kind!r}, expected {MODEL_TYPE!r})")
    if meta.get("format_version") != FORMAT_VERSION:
        raise QkvError(f"{path}: unsupported format_version {meta.get('format_version')!r} "
                       f"(this qkv reads {FORMAT_VERSION})")
    for key in ("model", "weights"):
        if not isinstance(meta.get(key), dict):
            raise QkvError(f"{path}: corrupt checkpoint (no {key!r} section)")
    return meta


def load_checkpoint(model: str | os.PathLike | None = None, *, with_optimizer: bool = False) -> Checkpoint:
    """Load a translation checkpoint (``None``/"translate" = the shipped one).

    Every problem — a missing directory, a directory of another model type, a corrupt or
    mismatched file — is a one-line :class:`~qkv.errors.QkvError`.
    """
    directory = resolve_model_dir(model)
    meta = read_meta(directory)
    config = TranslationConfig.from_dict(meta["model"])
    vocab = Vocab.load(directory)
    if (vocab.src_size, vocab.tgt_size) != (config.src_vocab_size, config.tgt_vocab_size):
        raise QkvError(f"{directory}: tokenizers have {vocab.src_size}/{vocab.tgt_size} words but "
                       f"the config says {config.src_vocab_size}/{config.tgt_vocab_size}")
    net = TranslationModel(config)
    load_model_tensors(net, _load_tensors(directory, meta["weights"], "weights"), str(directory))
    net.eval()
    opt = None
    if with_optimizer:
        if not isinstance(meta.get("optimizer"), dict):
            raise QkvError(f"{directory}: the checkpoint has no optimizer state to resume from "
                           f"(it was saved with --slim)")
        opt = _load_tensors(directory, meta["optimizer"], "optimizer")
    return Checkpoint(net, vocab, meta, directory, opt)


def save_checkpoint(directory: str | Path, model: TranslationModel, vocab: Vocab, meta: dict,
                    *, step: int, optimizer: torch.optim.Optimizer | None = None) -> Path:
    """Write a checkpoint of ``model`` at ``step`` (and the optimizer, for ``--resume``).

    ``meta`` is merged into config.json (the training config, metrics, the command…). The
    tensors go first, config.json last; older tensor files are removed once it names the new ones.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tok_files = {lang: name for lang, name in Vocab.FILES.items()}
    if not all((directory / n).is_file() for n in tok_files.values()):
        vocab.save(directory)
    weights = f"model-{step:06d}.safetensors"
    record = dict(meta)
    record.update(model_type=MODEL_TYPE, format_version=FORMAT_VERSION, step=step,
                  model=model.config.to_dict(), tokenizers=tok_files,
                  weights={"file": weights, "sha256": _save_tensors(directory / weights, model_tensors(model))},
                  optimizer=None)
    if optimizer is not None:
        tensors, groups = optimizer_tensors(optimizer)
        name = f"optimizer-{step:06d}.safetensors"
        record["optimizer"] = {"file": name, "sha256": _save_tensors(directory / name, tensors),
                               "param_groups": groups}
    atomic_write_text(directory / "config.json", json.dumps(record, indent=2, ensure_ascii=False) + "\n")
    keep = {weights, record["optimizer"]["file"] if record["optimizer"] else None}
    for old in (*directory.glob("model-*.safetensors"), *directory.glob("optimizer-*.safetensors")):
        if old.name not in keep:
            old.unlink(missing_ok=True)
    return directory
