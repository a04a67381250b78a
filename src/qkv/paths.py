"""Output paths checked before any work is done: a typo in `--png`/`--html` costs nothing.

    Examples:
        >>> check_output_path("/no/such/dir/x.png", flag="--png", example="map.png")
        Traceback (most recent call last):
        ...
        qkv.errors.QkvError: --png '/no/such/dir/x.png': the directory '/no/such/dir' does not exist
"""

from __future__ import annotations

import os

from qkv.errors import QkvError


def check_output_path(path: str, *, flag: str, example: str) -> None:
    """QkvError naming `flag` when `path` is a directory or its directory is missing or not
    writable (`example`: a file name to suggest instead of a directory)."""
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise QkvError(f"{flag} {path!r} is a directory; give a file name such as {example}")
    if not os.path.isdir(directory):
        raise QkvError(f"{flag} {path!r}: the directory {directory!r} does not exist")
    if not os.access(directory, os.W_OK):
        raise QkvError(f"{flag} {path!r}: the directory {directory!r} is not writable")
