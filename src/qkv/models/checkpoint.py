"""The safetensors weights of a checkpoint directory: the one reader every loader uses.

Native families ([`qkv.models.loading`][qkv.models.loading]), the transformers path (`qkv.hf.load`,
and the encoder-decoders it builds) and the translation model (`qkv.translate.checkpoint`) all find
and check their weights here, before anything is built:

* **which files** (`weight_files`): `model.safetensors`, or the shards a
  `model.safetensors.index.json` names (a JSON object whose `weight_map` is a non-empty
  tensor → file map), or the file a qkv manifest names; with a manifest (config.json's
  `"files"`) only listed files count. Every name is a plain file name inside the directory (no
  `/`, `..` or absolute path), every file a regular file (a FIFO or a directory is refused
  at once, never read), and a symbolic link must stay inside the directory (or point into the
  Hugging Face cache's own `blobs/` beside `snapshots/`). Pickles are never read: a directory
  that has only `pytorch_model.bin` is refused, naming it.
* **the headers** (`WeightFiles`): names, shapes and dtypes, no tensor data. A loader
  checks the config against them — the layer count first (a `num_hidden_layers` of 10⁹ must
  fail at once, not after listing 10⁹ layers), then every name (none missing, none unexpected),
  shape and dtype (floating point only: int8 weights are refused, never cast).
* **the tensors**: memory-mapped on access (`LazyTensors`); a tensor kept as stored is a
  view of the file's one mapping, a converted one is read through a mapping of its own that is
  released as soon as the converted copy exists.

Every failure is one `QkvError` line naming the file, tensor or value.

Examples:
    >>> import tempfile, torch
    >>> from safetensors.torch import save_file
    >>> with tempfile.TemporaryDirectory() as d:
    ...     save_file({"layers.0.w": torch.zeros(2, 3), "layers.1.w": torch.zeros(2, 3)},
    ...               f"{d}/model.safetensors")
    ...     w = WeightFiles.open(d)
    ...     w.shapes["layers.1.w"], w.layer_count()
    ((2, 3), 2)
"""

from __future__ import annotations

import os
import re
import stat
import weakref
from collections.abc import Iterator, Mapping

import torch
from safetensors import SafetensorError, safe_open

from qkv.errors import QkvError
from qkv.files import check_name, read_json

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
# weights in formats qkv never reads: unpickling runs code (the .bin/.pt files), the others are
# other frameworks'
PICKLES = ("pytorch_model.bin", "pytorch_model.bin.index.json", "model.pt", "model.bin")
# safetensors' floating dtype names → torch's: the only weights qkv reads
DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
# a config.json "dtype" / "torch_dtype" → torch's
DTYPE_NAMES = {str(d).removeprefix("torch."): d for d in DTYPES.values()}
LAYER = re.compile(r"(?:^|\.)(\d+)\.")  # the first number in a tensor's name: its layer


def weight_files(path: str | os.PathLike, listed: Mapping[str, str] | None = None, *,
                 names: list[str] | None = None) -> list[str]:
    """The safetensors files to read in the checkpoint directory `path`, each checked.

    Args:
        listed: a manifest's files (name → sha256); a file it does not list is treated as absent.
        names: the files to read when the caller knows them (a translation checkpoint's
            `model-000400.safetensors`); else `model.safetensors` or the index's shards.

    Raises:
        QkvError: no weights (naming a pickle when that is all there is), an index that is not
            a non-empty `weight_map`, a shard named outside the directory, a file that is
            missing, not a regular file, or a link leading out of the directory.
    """
    path = os.fspath(path)
    if names is not None:
        return [inside(path, name, f"{path}/config.json", listed) for name in names]

    def present(name: str) -> bool:
        return os.path.lexists(os.path.join(path, name)) and (listed is None or name in listed)

    if present(SINGLE):
        return [inside(path, SINGLE, path, listed)]
    if present(INDEX):
        index = inside(path, INDEX, path, listed)
        return [inside(path, f, index, listed) for f in shard_names(index)]
    pickles = [f for f in PICKLES if os.path.lexists(os.path.join(path, f))]
    if pickles:
        raise QkvError(f"{os.path.join(path, SINGLE)} is missing: {path} has only "
                       f"{pickles[0]}, pickled PyTorch weights, which qkv never loads (unpickling "
                       f"runs code); convert them to safetensors")
    raise QkvError(f"{os.path.join(path, SINGLE)} is missing (a checkpoint directory needs "
                   f"{SINGLE} or {INDEX} with its shards)")


def shard_names(index: str) -> list[str]:
    """The shard files `index` (a `model.safetensors.index.json`) names, sorted, each a plain
    file name; QkvError unless it is an object with a non-empty `weight_map` of file names."""
    raw = read_json(index)
    weight_map = raw.get("weight_map") if isinstance(raw, dict) else None
    if (not isinstance(weight_map, dict) or not weight_map
            or not all(isinstance(f, str) for f in weight_map.values())):
        got = type(raw).__name__ if not isinstance(raw, dict) else f"weight_map {weight_map!r:.60}"
        raise QkvError(f"{index} must be a JSON object whose weight_map maps each tensor name to "
                       f"its shard file, got {got}")
    for f in weight_map.values():
        check_name(f, f"{index} (a shard)")
    return sorted(set(weight_map.values()))


def inside(path: str, name: str, where: str, listed: Mapping[str, str] | None = None) -> str:
    """`path/name` when `name` is a plain file name of a regular file in `path` (a link
    only when it stays inside); else one QkvError naming `where` and the file."""
    check_name(name, where)
    if listed is not None and name not in listed:
        raise QkvError(f"{where} names {name!r}, which config.json does not list with a sha256 "
                       f"(an unlisted file is never read)")
    file = os.path.join(path, name)
    if not os.path.lexists(file):
        raise QkvError(f"{file} is missing" + (f" (named in {where})" if where != path else ""))
    if os.path.islink(file) and not _link_allowed(path, file):
        raise QkvError(f"{file} is a symbolic link to {os.path.realpath(file)}, outside {path}; "
                       f"a checkpoint's weights are read only from its own directory")
    try:
        mode = os.stat(file).st_mode
    except OSError as e:
        raise QkvError(f"{file} cannot be read ({e.strerror or e})") from None
    if not stat.S_ISREG(mode):
        raise QkvError(f"{file} is not a regular file (a directory, FIFO or device is never read)")
    return file


def _link_allowed(path: str, file: str) -> bool:
    """A link resolving inside `path`, or the Hugging Face cache's snapshot → blob link
    (`…/snapshots/<rev>/f` → `…/blobs/<hash>`)."""
    home = os.path.realpath(path)
    target = os.path.realpath(file)
    if os.path.commonpath([home, target]) == home:
        return True
    snapshots = os.path.dirname(home)
    return (os.path.basename(snapshots) == "snapshots"
            and os.path.dirname(target) == os.path.join(os.path.dirname(snapshots), "blobs"))


class WeightFiles:
    """The tensors of a checkpoint's safetensors files, known from their headers and read only
    when asked for. Names are unprefixed (`bert.embeddings…` → `embeddings…`).

    Fields: `path`; `files`; `where`: name → (file, stored name); `shapes`: name →
    shape; `dtypes`: name → safetensors dtype name (`"F32"`, `"BF16"`, `"I8"` …);
    `expected`: the names `check` accepted, with their shapes.
    """

    def __init__(self, path: str, files: list[str]):
        self.path, self.files = path, files
        self.where: dict[str, tuple[str, str]] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.dtypes: dict[str, str] = {}
        self.expected: dict[str, tuple[int, ...]] = {}
        self._handles: dict[str, object] = {}  # file → the shared safe_open handle

    @classmethod
    def open(cls, path: str | os.PathLike, prefix: str = "", listed: Mapping[str, str] | None = None,
             *, names: list[str] | None = None) -> "WeightFiles":
        """Read every file's header (names, shapes, dtypes; no tensor data). `listed`, `names`:
        as `weight_files`; `prefix` is stripped from the stored names that carry it."""
        path = os.fspath(path)
        weights = cls(path, weight_files(path, listed, names=names))
        for file in weights.files:
            f = weights._open(file)
            for stored in f.keys():
                name = stored[len(prefix):] if prefix and stored.startswith(prefix) else stored
                if name in weights.where:
                    raise QkvError(f"{file}: tensor {stored!r} is also in {weights.where[name][0]}")
                info = f.get_slice(stored)
                weights.where[name] = (file, stored)
                weights.shapes[name] = tuple(info.get_shape())
                weights.dtypes[name] = info.get_dtype()
            weights._handles[file] = f
        return weights

    def _open(self, file: str):
        try:
            return safe_open(file, framework="pt")
        except (SafetensorError, OSError) as e:
            raise QkvError(f"{file} is truncated or not a safetensors file "
                           f"({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None

    def _file_of(self, name: str) -> str:
        return self.files[0] if len(self.files) == 1 else f"{self.path}/model-*.safetensors"

    def layer_count(self, pattern: re.Pattern = LAYER) -> int:
        """How many layers the names hold: 1 + the largest layer index `pattern` finds."""
        found = {int(m.group(1)) for name in self.where if (m := pattern.search(name))}
        return max(found) + 1 if found else 0

    def check_layers(self, n: object, key: str, config_file: str, *,
                     pattern: re.Pattern = LAYER, at_most: bool = False) -> None:
        """The config's layer count `n` (`config.json`'s `key`) equals the headers' (is at
        most it with `at_most`: a model with several stacks): the first check, before any
        list of expected tensors exists."""
        if not isinstance(n, int) or isinstance(n, bool):
            return
        stored = self.layer_count(pattern)
        if n > stored if at_most else n != stored:
            where = self.files[0] if len(self.files) == 1 else self.path
            raise QkvError(f"{config_file}: {key} is {n} but {where} holds {stored} layers"
                           + (f" (0–{stored - 1})" if stored else ""))

    def check(self, expected: Mapping[str, tuple[int, ...]], ignored: re.Pattern | None = None,
              *, what: str = "config.json") -> None:
        """Names (none missing, none unexpected but `ignored`), shapes and floating dtypes
        against `expected` (name → shape), the model that `what` describes."""
        for name, (file, stored) in self.where.items():
            if name not in expected and not (ignored and ignored.match(name)):
                raise QkvError(f"{file}: unexpected tensor {stored!r} ({what} does not "
                               f"describe it; wrong config.json or an unsupported variant?)")
        for name, shape in expected.items():
            if name not in self.where:
                raise QkvError(f"{self._file_of(name)}: missing tensor {name!r} ({what} "
                               f"describes it)")
            file, stored = self.where[name]
            if self.shapes[name] != tuple(shape):
                raise QkvError(f"{file}: tensor {stored!r} has shape {self.shapes[name]} but "
                               f"{what} implies {tuple(shape)}")
            self.check_dtype(name)
        self.expected = dict(expected)

    def check_dtype(self, name: str) -> None:
        """A floating-point tensor (int8 or other quantised weights are refused, never cast)."""
        if self.dtypes[name] not in DTYPES:
            file, stored = self.where[name]
            raise QkvError(f"{file}: tensor {stored!r} has dtype {self.dtypes[name]}; qkv reads "
                           f"floating-point weights ({', '.join(DTYPES)})")

    def stored_dtype(self) -> torch.dtype:
        """The dtype the checkpoint stores its weights in (the widest, if they differ)."""
        found = {DTYPES[self.dtypes[n]] for n in self.expected}
        return max(found, key=lambda d: torch.finfo(d).bits) if found else torch.float32

    def read(self, name: str, *, shared: bool) -> torch.Tensor:
        """One tensor, memory-mapped. `shared`: a view of the file's one long-lived mapping
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

    def tensors(self, dtype: torch.dtype, device: torch.device,
                as_stored: set[str] = frozenset()) -> "LazyTensors":
        """The expected tensors as a mapping read on access; `as_stored`: names the caller keeps
        as they are (views of the file when dtype and device allow)."""
        return LazyTensors(self, as_stored, dtype, device)


class LazyTensors(Mapping):
    """name → tensor in `dtype` on `device`, read from the checkpoint on each access (so a
    converted tensor's source is freed as soon as the caller drops it)."""

    def __init__(self, weights: WeightFiles, as_stored: set[str], dtype: torch.dtype,
                 device: torch.device):
        self.weights, self.dtype, self.device = weights, dtype, device
        self.as_stored = {n for n in as_stored
                          if DTYPES[weights.dtypes[n]] == dtype and device.type == "cpu"}
        # a tensor read twice while the first is alive (GPT-2's wte, also its tied head) is
        # one tensor, not two copies
        self._alive: weakref.WeakValueDictionary[str, torch.Tensor] = weakref.WeakValueDictionary()

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self.weights.expected:
            raise KeyError(name)
        x = self._alive.get(name)
        if x is None:
            x = self.weights.read(name, shared=name in self.as_stored)
            x = x.to(device=self.device, dtype=self.dtype)
            self._alive[name] = x
        return x

    def __iter__(self) -> Iterator[str]:
        return iter(self.weights.expected)

    def __len__(self) -> int:
        return len(self.weights.expected)
