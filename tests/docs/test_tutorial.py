"""docs/tutorial.md cannot go stale: every ``$ qkv ...`` line in its ```console blocks is re-run
and its output compared with what the tutorial shows.

The matching rule (robust to float round-off, strict about everything else):

* The expected output is the block's lines after the command, up to the next ``$ `` line or the
  end of the block. Trailing spaces are ignored and runs of spaces count as one space (table
  columns may shift when a number's width changes).
* A line that is exactly ``...`` matches any number of output lines (zero or more).
* Numbers with a decimal point are compared as numbers: equal within one unit of the last
  printed digit (so 0.7500 matches 0.7501, not 0.7520). Numbers in scientific notation
  (``2.4e-07``) are float round-off reports: they match when both are below 1e-5, otherwise
  within 5 %. Integers and all other text must match exactly.

Commands run in-process through ``qkv.cli.main`` (stdout captured, which is not a terminal, so
the output is the plain 120-column text the tutorial shows), and must exit with 0.
"""

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from qkv.cli import main

TUTORIAL = Path(__file__).resolve().parents[2] / "docs" / "tutorial.md"
NUMBER = re.compile(r"(-?\d+\.\d+(?:e[-+]?\d+)?|-?\d+e[-+]?\d+)")


def commands(text: str) -> list[tuple[str, list[str]]]:
    """(command, expected output lines) for every ``$ qkv`` line of every console block."""
    found = []
    for block in re.findall(r"```console\n(.*?)```", text, flags=re.S):
        for chunk in re.split(r"^(?=\$ )", block, flags=re.M):
            if chunk.startswith("$ "):
                first, *rest = chunk.rstrip("\n").split("\n")
                found.append((first[2:].strip(), rest))
    return found


def _parts(line: str) -> list[str]:
    return NUMBER.split(" ".join(line.split()))


def _numbers_match(want: str, got: str) -> bool:
    a, b = float(want), float(got)
    if "e" in want.lower():
        return (abs(a) < 1e-5 and abs(b) < 1e-5) or abs(a - b) <= 0.05 * abs(a)
    decimals = len(want.split(".")[1])
    return abs(a - b) <= 10 ** -decimals * 1.0001


def line_matches(want: str, got: str) -> bool:
    w, g = _parts(want), _parts(got)
    if len(w) != len(g):
        return False
    for i, (x, y) in enumerate(zip(w, g)):
        if i % 2 == 0:
            if x != y:
                return False
        elif not _numbers_match(x, y):
            return False
    return True


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


def run_cli(command: str) -> list[str]:
    argv = shlex.split(command)
    assert argv[0] == "qkv", command
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main(argv[1:])
    assert code == 0, f"{command} exited with {code}"
    return out.getvalue().splitlines()


CASES = commands(TUTORIAL.read_text(encoding="utf-8"))




def test_the_tutorial_has_commands_for_every_question():
    text = TUTORIAL.read_text(encoding="utf-8")
    for heading in ("Why queries, keys and values", "What are the values for", "Why divide by √d_k",
                    "Why several heads", "Does \"it\" find \"pizza\""):
        assert heading in text
    assert len(CASES) >= 7
    assert all(expected for _, expected in CASES), "every command shows its output"


@pytest.mark.parametrize("command, expected", CASES, ids=[c[:60] for c, _ in CASES])
def test_tutorial_output_is_current(command, expected):
    got = run_cli(command)
    assert output_matches(expected, got), (
        f"output of `{command}` no longer matches docs/tutorial.md; it is now:\n" + "\n".join(got))


@pytest.mark.parametrize("want, got, same", [
    ("weight 0.7500", "weight 0.7501", True),
    ("weight 0.7500", "weight 0.7520", False),
    ("a   b", "a b   ", True),
    ("43/49", "42/49", False),
    ("diff = 2.4e-07 (x)", "diff = 3.9e-07 (x)", True),
    ("diff = 2.4e-03", "diff = 3.9e-03", False),
    ("L3 H1", "L3 H2", False),
])
def test_line_rule(want, got, same):
    assert line_matches(want, got) is same


def test_ellipsis_rule():
    assert output_matches(["a", "...", "d"], ["a", "b", "c", "d"])
    assert output_matches(["a", "...", "b"], ["a", "b"])
    assert not output_matches(["a", "...", "d"], ["a", "b", "c"])
    assert not output_matches(["a", "b"], ["a", "b", "c"])
