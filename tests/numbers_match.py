"""Compare printed output with expected output, robust to float round-off, strict about the rest.

Shared by the tests that check what a command prints (``tests/docs``, ``tests/cli``): a number
printed to 4 decimals on one CPU may differ in its last digit on another, and a test pinned to
one machine's rounding fails for no reason. The rule:

* Trailing spaces are ignored and runs of spaces count as one space (table columns may shift
  when a number's width changes).
* Numbers with a decimal point are compared as numbers: equal within one unit of the last
  printed digit of the expected number (so 0.7500 matches 0.7501, not 0.7520).
* Numbers in scientific notation (``2.4e-07``) are float round-off reports: they match when both
  are below 1e-5, otherwise within 5 %.
* Integers and all other text must match exactly.
* In :func:`output_matches`, an expected line that is exactly ``...`` matches any number of
  lines (zero or more).

    >>> line_matches("L3 H1   0.7500   pizza", "L3 H1 0.7501 pizza")
    True
    >>> line_matches("L3 H1   0.7500   pizza", "L3 H1 0.7520 pizza")
    False
"""

import re

NUMBER = re.compile(r"(-?\d+\.\d+(?:e[-+]?\d+)?|-?\d+e[-+]?\d+)")


def _parts(line: str) -> list[str]:
    """Text and numbers alternately: even indices are text, odd ones numbers."""
    return NUMBER.split(" ".join(line.split()))


def numbers_match(want: str, got: str) -> bool:
    """Whether the printed number ``got`` equals ``want`` within ``want``'s printed precision."""
    a, b = float(want), float(got)
    if "e" in want.lower():
        return (abs(a) < 1e-5 and abs(b) < 1e-5) or abs(a - b) <= 0.05 * abs(a)
    decimals = len(want.split(".")[1])
    return abs(a - b) <= 10 ** -decimals * 1.0001


def line_matches(want: str, got: str) -> bool:
    """One line against another by the rule in the module docstring."""
    w, g = _parts(want), _parts(got)
    if len(w) != len(g):
        return False
    for i, (x, y) in enumerate(zip(w, g)):
        if i % 2 == 0:
            if x != y:
                return False
        elif not numbers_match(x, y):
            return False
    return True


def contains_line(want: str, got: str) -> bool:
    """Whether some line of the output ``got`` matches ``want``."""
    return any(line_matches(want, line) for line in got.splitlines())


def output_matches(want: list[str], got: list[str]) -> bool:
    """Match with ``...`` lines as wildcards (zero or more lines), by dynamic programming."""
    want = [w.rstrip() for w in want]
    got = [g.rstrip() for g in got]
    # ok[i][j]: want[i:] matches got[j:]
    ok = [[False] * (len(got) + 1) for _ in range(len(want) + 1)]
    ok[len(want)][len(got)] = True
    for i in range(len(want) - 1, -1, -1):
        for j in range(len(got), -1, -1):
            if want[i] == "...":
                ok[i][j] = ok[i + 1][j] or (j < len(got) and ok[i][j + 1])
            else:
                ok[i][j] = j < len(got) and line_matches(want[i], got[j]) and ok[i + 1][j + 1]
    return ok[0][0]
