"""docs/tutorial.md answers the seeds' questions, each with commands; the line rule its output is
compared by. (Every ``$ qkv ...`` line of the tutorial, as of every page, is re-run and its output
compared by tests/docs/test_docs.py, in one process with the other pages' commands.)
"""

import re
from pathlib import Path

import pytest
from numbers_match import line_matches, output_matches

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


CASES = commands(TUTORIAL.read_text(encoding="utf-8"))


def test_the_tutorial_has_commands_for_every_question():
    text = TUTORIAL.read_text(encoding="utf-8")
    for heading in ("Why queries, keys and values", "What are the values for", "Why divide by √d_k",
                    "Why several heads", "Does \"it\" find \"pizza\"", "Why values?"):
        assert heading in text
    assert len(CASES) >= 7
    assert all(expected for _, expected in CASES), "every command shows its output"


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
