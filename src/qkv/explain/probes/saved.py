"""Reading a saved result back: the checks a `to_dict()` from a file must pass to be a result again.

`qkv needle --json` and `qkv atlas --json` write a result's `to_dict()`; the viewer shows a
saved one (`POST /api/needle`, `/api/atlas`) only after `NeedleMap.from_dict` / `Atlas.from_dict`
have rebuilt the typed result from it. Anything else is one `QkvError` line naming the field by its
path and the value found:

```pycon
>>> whole({"tokens": "12"}, "tokens", "atlas", least=1)
Traceback (most recent call last):
...
qkv.errors.QkvError: atlas: tokens must be a whole number ≥ 1, got '12'

```
"""

from __future__ import annotations

import math

from qkv.errors import QkvError

SHOWN = 60  # characters of a bad value quoted in a message


def _bad(where: str, name: str, must: str, value) -> QkvError:
    return QkvError(f"{where}: {name} must be {must}, got {repr(value)[:SHOWN]}")


def get(d, name: str, where: str):
    """`d[name]`; an error when `d` is not an object or has no `name`."""
    if not isinstance(d, dict):
        raise QkvError(f"{where} must be a JSON object, got {type(d).__name__}")
    if name not in d:
        raise QkvError(f"{where}: {name} is missing")
    return d[name]


def whole(d, name: str, where: str, *, least: int = 0) -> int:
    """A whole number ≥ `least` (a JSON bool is not one)."""
    value = get(d, name, where)
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise _bad(where, name, f"a whole number ≥ {least}", value)
    return value


def number(value, name: str, where: str, *, low: float = -math.inf, high: float = math.inf) -> float:
    """A finite number within `low … high` (`value` already read)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not low <= value <= high:
        bounds = "" if math.isinf(low) and math.isinf(high) else f" in {low:g} … {high:g}"
        raise _bad(where, name, f"a finite number{bounds}", value)
    return float(value)


def text(d, name: str, where: str) -> str:
    value = get(d, name, where)
    if not isinstance(value, str):
        raise _bad(where, name, "a string", value)
    return value


def items(d, name: str, where: str, *, least: int = 0) -> list:
    """A JSON array of at least `least` items."""
    value = get(d, name, where)
    if not isinstance(value, list) or len(value) < least:
        raise _bad(where, name, f"a list of at least {least} item(s)", value)
    return value


def kind(d, expected: str) -> None:
    """`d["kind"]` is `expected` (what `to_dict()` wrote)."""
    found = get(d, "kind", expected)
    if found != expected:
        raise QkvError(f"this is not a saved {expected}: its kind is {repr(found)[:SHOWN]} "
                       f"(qkv {expected.split('-')[0]} --json writes one)")


__all__ = ["get", "items", "kind", "number", "text", "whole"]
