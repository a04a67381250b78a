"""Checkpoint directories, written and read in one place.

A checkpoint is a directory with one *manifest* (`config.json`) and the files it lists:

```text
config.json                        the commit point: whatever the model family needs, plus
                                   "files": {name: sha256} for every other file of the
                                   checkpoint (weights, optimizer state, tokenizers, index)
model-000400.safetensors           …the files it lists, each a plain name in the directory
```

Writing (`write_checkpoint`): every file goes to a temporary name and is moved into place
with `os.replace` (`qkv.files`); tensor files carry their step in their name and the
manifest is replaced last, so at every instant the manifest names a complete, consistent set of
files — a run killed mid-save leaves the previous checkpoint intact. Files of the checkpoint's
kinds that the new manifest does not list are deleted afterwards, and so are temporary files a
killed writer left behind.

Reading (`read_listed`): a file is read only when the manifest lists it, its name is a plain
file name inside the directory, a sha256 is recorded for it and the bytes match it. Anything else
is one `QkvError` line — never skipped, never a traceback. The bytes checked are
the bytes returned (no second read that could see a different file).

Examples:
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     m = write_checkpoint(d, {"notes.txt": b"hello"}, {"step": 1})
    ...     read_listed(d, read_manifest(d), "notes.txt")
    b'hello'
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import math
import os
import re
from pathlib import Path
from typing import Callable

import torch

from qkv.errors import QkvError
from qkv.files import (
    FILES_KEY, atomic_write, atomic_write_bytes, atomic_write_text, check_name, check_writable,
    manifest_files, read_json, read_verified,
)

MANIFEST = "config.json"
# What qkv.files names its temporary files: ".<target>.<12 hex>.tmp".
_TEMPORARY = re.compile(r"^\..+\.[0-9a-f]{12}\.tmp$")

# A file's content: bytes, or a function that writes the file at the path it is given.
Content = bytes | Callable[[str], None]


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def remove_stale_temporaries(directory: str | os.PathLike) -> list[str]:
    """Delete the temporary files a killed writer left in `directory`; return their names."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    removed = []
    for path in directory.iterdir():
        if _TEMPORARY.match(path.name) and path.is_file():
            path.unlink(missing_ok=True)
            removed.append(path.name)
    return sorted(removed)


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- the output directory of a training run -------------------------------------------------------
def check_out_dir(out: object, *, flag: str = "--out") -> Path:
    """The run directory named by `out`: refused up front when empty or an existing file."""
    if out is None or not str(out).strip():
        raise QkvError(f"{flag} must name a directory, got an empty string")
    path = Path(str(out))
    if path.exists() and not path.is_dir():
        raise QkvError(f"{flag} {str(out)!r} is a file, not a directory")
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if parent.exists() and not parent.is_dir():
        raise QkvError(f"{flag} {str(out)!r}: {parent} is a file, not a directory")
    return path


def prepare_out_dir(out: object, *, resume: bool, force: bool, kinds: tuple[str, ...],
                    flag: str = "--out") -> Path:
    """Check the run directory before any training starts.

    * `resume`: the directory must hold a manifest.
    * a new run: the directory must be missing or empty, unless `force`; then the old manifest
      goes first (so nothing of the old run is ever read again) and the files of the
      checkpoint's `kinds` (glob patterns) after it. Other files are left alone.

    The directory is created and must take a new file (checked by creating one), so an
    unwritable `out` fails before training. Stale temporary files are removed in every case.
    """
    path = check_out_dir(out, flag=flag)
    try:  # create it and a file in it now, not after an hour of training (a read-only mount, /sys)
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise QkvError(f"{flag} {str(out)!r} cannot be created ({e.strerror or e})") from None
    check_writable(path / MANIFEST, flag)
    remove_stale_temporaries(path)
    if resume:
        if not (path / MANIFEST).is_file():
            raise QkvError(f"--resume: {path} holds no checkpoint to continue")
        return path
    if path.is_dir():
        present = sorted(p.name for p in path.iterdir())
        if present and not force:
            shown = ", ".join(present[:4]) + (", …" if len(present) > 4 else "")
            what = "already holds a checkpoint" if MANIFEST in present else "is not empty"
            raise QkvError(f"{path} {what}; pass --resume to continue it, --force to start a new "
                           f"run there, or choose another {flag} (it holds {shown})")
        if present:
            (path / MANIFEST).unlink(missing_ok=True)
            for p in path.iterdir():
                if p.is_file() and any(fnmatch.fnmatch(p.name, k) for k in kinds):
                    p.unlink(missing_ok=True)
    return path


# -- writing --------------------------------------------------------------------------------------
def write_checkpoint(directory: str | os.PathLike, files: dict[str, Content], manifest: dict, *,
                     kinds: tuple[str, ...] = ()) -> dict:
    """Write `files` and then the manifest listing each with its sha256; return the manifest.

    Args:
        files: {plain file name: bytes or a writer `f(path)`}.
        manifest: the rest of config.json; its `"files"` key is set here.
        kinds: glob patterns of the checkpoint's files (`"model-*.safetensors"`); those that
            the new manifest does not list are deleted once it is in place.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(directory)
    hashes = {}
    for name, content in files.items():
        check_name(name, str(directory))
        path = directory / name
        if isinstance(content, bytes):
            atomic_write_bytes(path, content)
        else:
            atomic_write(path, content)
        hashes[name] = sha256_file(path)
    record = {**manifest, FILES_KEY: hashes}
    # allow_nan=False: a NaN literal is not JSON, and strict readers (read_json) refuse it
    atomic_write_text(directory / MANIFEST,
                      json.dumps(record, indent=2, ensure_ascii=False, allow_nan=False) + "\n")
    for path in directory.iterdir():
        if (path.name not in hashes and path.name != MANIFEST and path.is_file()
                and any(fnmatch.fnmatch(path.name, k) for k in kinds)):
            path.unlink(missing_ok=True)
    return record


def save_tensors_writer(tensors: dict[str, torch.Tensor],
                        metadata: dict[str, str] | None = None) -> bytes:
    """The safetensors bytes of `tensors`, a file content for `write_checkpoint`.

    Bytes, not `save_file(tensors, tmp)`: safetensors' writer re-creates the file with mode
    0600, whereas `qkv.files` gives every new file the umask's permissions.
    """
    from safetensors.torch import save

    return save({k: v.detach().contiguous() for k, v in tensors.items()}, metadata=metadata)


# -- reading --------------------------------------------------------------------------------------
def read_manifest(directory: str | os.PathLike) -> dict:
    """config.json of a checkpoint directory, its `"files"` section checked; QkvError else."""
    directory = Path(directory)
    if not directory.is_dir():
        raise QkvError(f"model directory {str(directory)!r} does not exist")
    path = directory / MANIFEST
    if not os.path.lexists(path):
        raise QkvError(f"{directory} is not a qkv model directory (no config.json)")
    try:
        manifest = read_json(path)
    except QkvError as e:
        raise QkvError(f"corrupt checkpoint: {e}") from None
    if not isinstance(manifest, dict):
        raise QkvError(f"{path}: corrupt checkpoint (config.json must hold a JSON object, got "
                       f"{type(manifest).__name__})")
    if manifest_files(manifest, str(path)) is None:
        manifest[FILES_KEY] = {}
    return manifest


def read_listed(directory: str | os.PathLike, manifest: dict, name: object, what: str = "") -> bytes:
    """The bytes of `name`, when the manifest lists it and they match its sha256."""
    return read_verified(listed_path(directory, manifest, name, what), manifest[FILES_KEY][name],
                         f"{what} file" if what else "file")


def listed_path(directory: str | os.PathLike, manifest: dict, name: object, what: str = "") -> Path:
    """`directory/name` when the manifest lists `name` (a plain file name) with a sha256 and
    the file is there; QkvError naming it else (a stale or foreign file is never read)."""
    directory = Path(directory)
    what = what or "file"
    check_name(name, f"{directory}/{MANIFEST}")
    files = manifest.get(FILES_KEY) or {}
    if name not in files:
        raise QkvError(f"{directory}: {what} file {name!r} is not listed with a sha256 in "
                       f"config.json (a stale or foreign file is never read)")
    path = directory / name
    if not os.path.lexists(path):
        raise QkvError(f"{directory}: {what} file {name!r} named in config.json is missing")
    return path


def load_tensors(directory: str | os.PathLike, manifest: dict, name: object,
                 what: str = "weights") -> dict[str, torch.Tensor]:
    """Read a listed, verified safetensors file (never a pickle)."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    data = read_listed(directory, manifest, name, what)
    try:
        return load(data)
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise QkvError(f"{Path(directory) / str(name)}: corrupt checkpoint "
                       f"({str(e).splitlines()[0][:120]})") from None


# -- typed fields of a manifest -------------------------------------------------------------------
def get_field(manifest: dict, key: str, kind: type | tuple[type, ...], where: str, *,
              default: object = ..., minimum: float | None = None) -> object:
    """`manifest[key]` checked to be a `kind` (a bool is not an int; an int is a float)."""
    if key not in manifest:
        if default is ...:
            raise QkvError(f"{where}: corrupt checkpoint (no {key!r})")
        return default
    value = manifest[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if float in kinds and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    ok = isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)
    if ok and isinstance(value, float) and not math.isfinite(value):
        ok = False
    if not ok:
        names = " or ".join(k.__name__ for k in kinds)
        raise QkvError(f"{where}: corrupt checkpoint ({key!r} must be {names}, got {value!r})")
    if minimum is not None and value < minimum:
        raise QkvError(f"{where}: corrupt checkpoint ({key!r} must be >= {minimum}, got {value!r})")
    return value


# -- optimizer state ------------------------------------------------------------------------------
def optimizer_tensors(opt: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], list[dict]]:
    """An optimizer's state as flat tensors `state.<param>.<name>` plus its JSON-able groups."""
    sd = opt.state_dict()
    tensors = {}
    for idx, state in sd["state"].items():
        for name, value in state.items():
            tensors[f"state.{idx}.{name}"] = torch.as_tensor(value)
    groups = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()}
              for g in sd["param_groups"]]
    return tensors, groups


def load_optimizer_tensors(opt: torch.optim.Optimizer, tensors: dict[str, torch.Tensor],
                           groups: object, source: str) -> None:
    """Restore `optimizer_tensors`' output; QkvError when it does not fit `opt`."""
    if not isinstance(groups, list) or not all(isinstance(g, dict) for g in groups):
        raise QkvError(f"{source}: corrupt checkpoint (optimizer param_groups must be a list of "
                       f"objects)")
    state: dict[int, dict[str, torch.Tensor]] = {}
    try:
        for key, value in tensors.items():
            _, idx, name = key.split(".", 2)
            state.setdefault(int(idx), {})[name] = value
        groups = [{k: (tuple(v) if k == "betas" else v) for k, v in g.items()} for g in groups]
        opt.load_state_dict({"state": state, "param_groups": groups})
    except (ValueError, KeyError, RuntimeError, TypeError) as e:
        raise QkvError(f"{source}: optimizer state does not match the model ({e})") from None
