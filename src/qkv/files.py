"""Atomic file writes: a reader sees the old file or the new one, never half of either.

The new content is written to a temporary file in the target's directory, flushed to disk, and
moved onto the target with ``os.replace`` (one atomic rename within a filesystem). If anything
fails — the write itself, a full disk, a Ctrl-C — the temporary file is removed and the target is
left as it was.

The temporary file is created with mode ``0o666`` and the kernel applies the process umask, so
the result has the same permissions as any new file. (``tempfile.mkstemp`` would make it ``0600``,
and fixing that afterwards needs the umask, which Python can only read by setting it.) A file
that is overwritten keeps its own permission bits, as it would with ``>`` in a shell.

Example:
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     atomic_write_text(Path(d) / "note.txt", "hello")
    ...     (Path(d) / "note.txt").read_text(), os.listdir(d)
    ('hello', ['note.txt'])
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Callable

_ATTEMPTS = 100  # fresh random names to try before giving up (a clash has odds 2^-48 each)


def _new_temp_file(path: Path) -> Path:
    """Create an empty, unique ``.<name>.<random>.tmp`` beside ``path``; the umask sets its mode."""
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
    """Give ``tmp`` the permission bits of the file it replaces (a 0644 or 0600 file stays so)."""
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        return  # a new file: the umask decided its mode when it was created
    os.chmod(tmp, mode)


def atomic_write(path: str | os.PathLike, write: Callable[[str], None]) -> None:
    """Run ``write(tmp_path)``, then move the temporary file onto ``path`` in one step.

    ``write`` receives the path of an existing, empty file to overwrite (libraries such as
    ``safetensors`` and matplotlib want a file name). Missing parent directories are created.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _new_temp_file(path)
    try:
        write(str(tmp))
        _keep_mode(path, tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())  # the bytes reach the disk before the rename makes them visible
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""
    atomic_write(path, lambda tmp: Path(tmp).write_bytes(data))
