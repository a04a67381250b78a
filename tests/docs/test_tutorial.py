"""docs/tutorial.md cannot go stale: every ``$ qkv ...`` line in its ```console blocks is re-run
and its output compared with what the tutorial shows.

The expected output is the block's lines after the command, up to the next ``$ `` line or the
end of the block, compared by the rule of ``tests/numbers_match.py`` (robust to float round-off,
strict about everything else; a line ``...`` matches any number of lines).

Commands run in-process through ``qkv.cli.main`` (stdout captured, which is not a terminal, so
the output is the plain 120-column text the tutorial shows), and must exit with 0.
"""

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest
from numbers_match import line_matches, output_matches

from qkv.cli import main

TUTORIAL = Path(__file__).resolve().parents[2] / "docs" / "tutorial.md"


def commands(text: str) -> list[tuple[str, list[str]]]:
    """(command, expected output lines) for every ``$ qkv`` line of every console block."""
    found = []
    for block in re.findall(r"```console\n(.*?)```", text, flags=re.S):
        for chunk in re.split(r"^(?=\$ )", block, flags=re.M):
            if chunk.startswith("$ "):
                first, *rest = chunk.rstrip("\n").split("\n")
                found.append((first[2:].strip(), rest))
    return found


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
                    "Why several heads", "Does \"it\" find \"pizza\"", "Why values?"):
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
