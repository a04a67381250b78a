"""Writing a command's results: whole JSON documents, and a clean end when stdout fails.

Two rules every command follows:

* **A result is built completely before a byte of it is written.** `print_json` renders
  the whole document first, so a value that cannot be written (NaN from a broken model) ends
  the command with one error line and nothing on stdout, never half a JSON object.
* **A failed write is one line, not a traceback.** `qkv explain … > /dev/full` fails when
  Python flushes stdout; `finish_output` flushes it while the command can still say so
  (`qkv: error: cannot write the output: No space left on device`, exit 2), then points
  stdout at `/dev/null` so the interpreter's own flush at exit cannot fail a second time.
"""

from __future__ import annotations

import json
import math
import os
import sys

from qkv.errors import QkvError


def print_json(obj, **kw) -> None:
    """Write `obj` as one JSON document and a newline, all or nothing.

    Raises:
        QkvError: `obj` holds NaN or ±inf (strict JSON has no spelling for them); nothing is
            written.

    Examples:
        >>> print_json({"a": [1, 2.5]})
        {"a": [1, 2.5]}
    """
    try:
        text = json.dumps(obj, allow_nan=False, **kw)
    except ValueError:
        where = first_non_finite(obj)
        where = f" at {where}" if where else ""
        raise QkvError(f"the result holds a non-finite number{where}: the model's weights or "
                       f"input give NaN or infinity, so there is nothing true to show") from None
    sys.stdout.write(text + "\n")


def first_non_finite(obj, path: str = "") -> str | None:
    """Where the first NaN/inf in a JSON-like object is (`['heads'][3]['weight']`), or None.

    Examples:
        >>> first_non_finite({"a": [1.0, float("nan")]})
        "['a'][1]"
    """
    if isinstance(obj, float) and not math.isfinite(obj):
        return path or "the top"
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, (list, tuple)) else ()
    for key, value in items:
        found = first_non_finite(value, f"{path}[{key!r}]" if isinstance(key, str) else f"{path}[{key}]")
        if found:
            return found
    return None


def finish_output(code: int) -> int:
    """Flush stdout; on a failed write print one error line and return 2, else `code`."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:  # the reader left (qkv … | head): not an error of qkv's
        _silence_stdout()
        return code
    except OSError as e:
        _silence_stdout()
        print(f"qkv: error: cannot write the output: {e.strerror or e}", file=sys.stderr)
        return 2
    return code


def write_failed(e: OSError) -> int:
    """The exit code for an `OSError` a command raised (a file or stdout it could not use)."""
    if isinstance(e, BrokenPipeError):
        _silence_stdout()
        return 0
    where = f"{e.filename}: " if e.filename else "cannot write the output: "
    if not e.filename:
        _silence_stdout()
    print(f"qkv: error: {where}{e.strerror or e}", file=sys.stderr)
    return 2


def _silence_stdout() -> None:
    """Point stdout's file descriptor at /dev/null so the flush at exit has nowhere to fail."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # a StringIO (tests) or a closed stream
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def check_files(args, *, example: str) -> None:
    """Before the model runs: `--png` and `--html` (where the command has them and they are
    given) must be writable files — a typo costs nothing. `example`: the page's file name to
    suggest instead of a directory (`why.html`)."""
    if getattr(args, "png", None):
        from qkv.explain.rendering.plots import check_writable

        check_writable(args.png)
    if getattr(args, "html", None):
        from qkv.paths import check_output_path

        check_output_path(args.html, flag="--html", example=example)


def write_files(args, *, figure=None, page=None) -> list[str]:
    """Write `figure()` to `--png` and `page()` (a self-contained HTML string) to
    `--html`, each atomically (no partial file), where given; the paths written, for
    `say_written` once the result is printed."""
    written = []
    if figure is not None and getattr(args, "png", None):
        from qkv.explain.rendering.plots import save_atomic

        save_atomic(figure(), args.png)
        written.append(args.png)
    if page is not None and getattr(args, "html", None):
        from qkv.files import atomic_write_text

        atomic_write_text(args.html, page())
        written.append(args.html)
    return written


def say_written(paths: list[str]) -> None:
    """`wrote FILE` on stderr for each file a command wrote (stdout keeps the result)."""
    for path in paths:
        print(f"wrote {path}", file=sys.stderr)
