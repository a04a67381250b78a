"""Atomic file writes: a reader sees the old file or the new one, never half of either.

The new content is written to a temporary file in the target's directory, flushed to disk, and
moved onto the target with `os.replace` (one atomic rename within a filesystem). If anything
fails — the write itself, a full disk, a Ctrl-C — the temporary file is removed and the target is
left as it was.

The temporary file is created with mode `0o666` and the kernel applies the process umask, so
the result has the same permissions as any new file. (`tempfile.mkstemp` would make it `0600`,
and fixing that afterwards needs the umask, which Python can only read by setting it.) A file
that is overwritten keeps its own permission bits, as it would with `>` in a shell.

Only regular files get the temporary file and the rename. A target that is a symbolic link is
written through it, as `> link` in a shell would: the link stays, the file it points to is
replaced atomically (a dangling link's target is created). A target that is a device or a FIFO
(`/dev/null`, `/dev/stdout`) is opened and written in place — renaming onto it would swap the
device for a plain file. A directory is refused. A failed write raises `OSError` naming the
target, never the hidden temporary file.

Reading from outside goes through `read_regular` and `read_json`: regular files only
(a FIFO named `config.json` is refused at once, not read forever), JSON nested at most
`MAX_JSON_DEPTH` levels (deeper input would exhaust Python's recursion), each failure one
`QkvError` naming the file.

Examples:
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     atomic_write_text(Path(d) / "note.txt", "hello")
    ...     (Path(d) / "note.txt").read_text(), os.listdir(d)
    ('hello', ['note.txt'])
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import re
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Callable

from qkv.errors import QkvError

_ATTEMPTS = 100  # fresh random names to try before giving up (a clash has odds 2^-48 each)


def _new_temp_file(path: Path) -> Path:
    """Create an empty, unique `.<name>.<random>.tmp` beside `path`; the umask sets its mode."""
    for _ in range(_ATTEMPTS):
        # os.urandom, not the random module: drawing from it would move the caller's seeded RNG.
        tmp = path.with_name(f".{path.name}.{os.urandom(6).hex()}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue
        os.close(fd)
        return tmp
    raise FileExistsError(f"{path.parent}: no free temporary file name after {_ATTEMPTS} tries")


def _keep_mode(path: Path, tmp: Path) -> None:
    """Give `tmp` the permission bits of the file it replaces (a 0644 or 0600 file stays so)."""
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        return  # a new file: the umask decided its mode when it was created
    os.chmod(tmp, mode)


def _destination(path: Path) -> tuple[Path, bool]:
    """`(where the bytes go, whether it is a regular file or a new one)`: a link is followed,
    as a shell redirection follows it; a directory is refused."""
    target = Path(os.path.realpath(path)) if path.is_symlink() else path
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        return target, True
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, "is a directory, not a file", str(path))
    return target, stat.S_ISREG(mode)


def _named(e: OSError, path: Path) -> OSError:
    """The same error, naming `path` (what the caller asked for), not a temporary file."""
    return type(e)(e.errno, e.strerror or str(e), str(path)) if e.errno else e


def atomic_write(path: str | os.PathLike, write: Callable[[str], None]) -> None:
    """Run `write(tmp_path)`, then move the temporary file onto `path` in one step.

    `write` receives the path of an existing, empty file to overwrite (libraries such as
    `safetensors` and matplotlib want a file name). Missing parent directories are created.
    A link is written through, a device or FIFO in place (see the module's docstring).

    Raises:
        OSError: the file cannot be written; `filename` is `path`.
    """
    path = Path(path)
    try:
        target, regular = _destination(path)
        if not regular:
            _write_in_place(target, write)
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = _new_temp_file(target)
    except OSError as e:
        raise _named(e, path) from None
    try:
        write(str(tmp))
        _keep_mode(target, tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())  # the bytes reach the disk before the rename makes them visible
        os.replace(tmp, target)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError) and (e.filename is None or str(tmp) in str(e.filename)):
            raise _named(e, path) from None
        raise


def _write_in_place(target: Path, write: Callable[[str], None]) -> None:
    """A device or FIFO: the writer fills a private temporary file, whose bytes are then copied
    into `target` opened for writing (`> /dev/stdout`): the device stays a device."""
    with tempfile.TemporaryDirectory(prefix="qkv-") as d:
        tmp = os.path.join(d, "out")
        open(tmp, "wb").close()
        write(tmp)
        with open(tmp, "rb") as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst)


def check_writable(path: str | os.PathLike, flag: str) -> None:
    """Fail now, before any work, when `atomic_write` could not write `path`.

    A regular (or new) file needs a temporary file beside it: one is created and removed, which
    catches read-only mounts, `/sys` and missing permissions that `os.access` can miss. A
    device or FIFO must be writable. Missing parent directories are not created here.

    Raises:
        QkvError: naming `flag`, the path and the reason.
    """
    path = Path(path)
    try:
        target, regular = _destination(path)
        if not regular:
            if not os.access(target, os.W_OK):
                raise PermissionError(errno.EACCES, "permission denied", str(path))
            return
        parent = target.parent
        while not parent.exists() and parent != parent.parent:
            parent = parent.parent
        if not parent.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, f"{parent} is not a directory", str(path))
        os.unlink(_new_temp_file(parent / target.name))
    except OSError as e:
        raise QkvError(f"{flag} {str(path)!r} cannot be written ({e.strerror or e})") from None


# -- reading what comes from outside -----------------------------------------------------------
MAX_JSON_DEPTH = 64  # deeper than any config or tokenizer file; far below Python's recursion limit
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
_JSON_BRACKET = re.compile(r"[\[\]{}]")


def read_regular(path: str | os.PathLike) -> bytes:
    """The bytes of `path`, which must be a regular file (a link to one is followed).

    Opened without blocking and checked on the open descriptor, so a FIFO or a device is
    refused at once and a file swapped after the check is never read.

    Raises:
        QkvError: missing, unreadable, or not a regular file — naming the path.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise QkvError(f"{os.fspath(path)} is missing") from None
    except OSError as e:
        raise QkvError(f"{os.fspath(path)} cannot be read ({e.strerror or e})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # before fdopen: a directory's error names the fd
        os.close(fd)
        raise QkvError(f"{os.fspath(path)} is not a regular file (a directory, FIFO or "
                       f"device is never read)")
    with os.fdopen(fd, "rb") as f:
        try:
            return f.read()
        except OSError as e:
            raise QkvError(f"{os.fspath(path)} cannot be read ({e.strerror or e})") from None


def json_depth(text: str, limit: int) -> int:
    """How deeply `text`'s arrays and objects nest, counting no further than `limit + 1`."""
    depth = deepest = 0
    for m in _JSON_BRACKET.finditer(_JSON_STRING.sub('""', text)):
        depth += 1 if m.group() in "[{" else -1
        if depth > deepest:
            deepest = depth
            if deepest > limit:
                break
    return deepest


def parse_json(text: str | bytes, where: str, *, max_depth: int = MAX_JSON_DEPTH) -> object:
    """`json.loads` for text from outside: UTF-8 (a BOM dropped), nesting at most
    `max_depth` levels, NaN/Infinity and numbers beyond a float (1e999) refused; each failure one
    QkvError naming `where`.

    Examples:
        >>> parse_json('{"a": [1, 2]}', "x.json")
        {'a': [1, 2]}
    """
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8-sig")
        except UnicodeDecodeError as e:
            raise QkvError(f"{where} is not valid UTF-8 (byte 0x{text[e.start]:02x} at position "
                           f"{e.start})") from None
    if json_depth(text, max_depth) > max_depth:
        raise QkvError(f"{where} is not a usable JSON file: it nests arrays/objects more than "
                       f"{max_depth} levels deep")

    def refuse(constant: str):
        raise QkvError(f"{where} holds {constant}, which is not a JSON number")

    def finite(number: str) -> float:  # 1e999 parses to inf: as far from a number as Infinity
        value = float(number)
        if not math.isfinite(value):
            raise QkvError(f"{where} holds {number}, which is too large for a float (it would "
                           f"read as infinity)")
        return value

    try:
        return json.loads(text, parse_constant=refuse, parse_float=finite)
    except (ValueError, RecursionError) as e:
        if isinstance(e, QkvError):
            raise
        raise QkvError(f"{where} is not valid JSON ({e})") from None


def read_json(path: str | os.PathLike, *, max_depth: int = MAX_JSON_DEPTH) -> object:
    """`parse_json` of the regular file `path`."""
    return parse_json(read_regular(path), os.fspath(path), max_depth=max_depth)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write `text` (UTF-8) to `path` atomically."""
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to `path` atomically."""
    atomic_write(path, lambda tmp: Path(tmp).write_bytes(data))


# -- manifests: config.json's "files" = {plain name: sha256} ---------------------------------------
FILES_KEY = "files"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def check_name(name: object, where: str) -> str:
    """`name` must be a plain file name (no directory part, not hidden, not `..`)."""
    if (not isinstance(name, str) or not name or name in (".", "..") or name.startswith(".")
            or "/" in name or "\\" in name or "\x00" in name):
        raise QkvError(f"{where}: file name {name!r} is not a plain file name inside the "
                       f"checkpoint directory")
    return name


def manifest_files(manifest: dict, where: str) -> dict[str, str] | None:
    """The `"files"` section of a manifest, each name plain and each sha256 well-formed;
    None when the manifest has none (a checkpoint from elsewhere, e.g. the Hugging Face Hub)."""
    files = manifest.get(FILES_KEY)
    if files is None:
        return None
    if not isinstance(files, dict):
        raise QkvError(f"{where}: corrupt checkpoint (\"files\" must map file names to sha256)")
    for name, digest in files.items():
        check_name(name, where)
        if not isinstance(digest, str) or not _SHA256.match(digest):
            raise QkvError(f"{where}: no valid sha256 recorded for {name!r} (got {digest!r})")
    return files


def verify_listed_files(directory: str | os.PathLike, files: dict[str, str]) -> None:
    """Every listed file is a regular file in `directory` whose bytes match its sha256.

    Raises:
        QkvError: naming the first file that is missing, not regular, or changed.
    """
    for name, digest in files.items():
        read_verified(os.path.join(os.fspath(directory), name), digest)


def read_verified(path: str | os.PathLike, digest: str, what: str = "the file") -> bytes:
    """The bytes of the listed file `path` (not a link: a checkpoint's files are read only
    from its own directory), which must match the sha256 `digest` config.json records; the
    bytes checked are the bytes returned. `what` names the file in messages (`"weights
    file"`)."""
    if os.path.islink(path):
        raise QkvError(f"{os.fspath(path)}: a symbolic link, listed in config.json; a checkpoint's "
                       f"files are read only from its own directory")
    data = read_regular(path)
    if hashlib.sha256(data).hexdigest() != digest:
        raise QkvError(f"{os.fspath(path)}: corrupt checkpoint ({what} does not match its sha256 "
                       f"in config.json; it changed after it was saved)")
    return data
