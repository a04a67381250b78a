"""Messages name arguments by role, spelled by whoever shows them (the library or the CLI)."""

import pytest

from qkv.errors import QkvError
from qkv.explain.wording import ARGUMENTS, ArgumentError, Message

FLAGS = {"token": "--token", "source": "--from", "words": "--words"}


def test_roles_are_spelled_by_the_caller():
    m = Message("{name} {spec!r} is missing; try {words}", "source", spec="cat")
    assert str(m) == "source 'cat' is missing; try words=True"
    assert m.spelled(FLAGS) == "--from 'cat' is missing; try --words"
    assert m.spelled({}) == str(m)  # a mapping only overrides the roles it names


def test_values_are_shown_as_typed():
    """A user's text with braces in it is a value, never part of the template."""
    m = Message("{name} {spec!r} is not a word", "token", spec="{layer} {0}")
    assert m.spelled(FLAGS) == "--token '{layer} {0}' is not a word"


def test_nested_messages_are_spelled_the_same_way():
    inner = Message("pick another with {name} it@0", "token")
    outer = Message("{first} Add {words}.", first=inner)
    assert str(outer) == "pick another with token it@0 Add words=True."
    assert outer.spelled(FLAGS) == "pick another with --token it@0 Add --words."


def test_argument_error_is_a_qkv_error_and_a_value_error():
    e = ArgumentError("layer", "{name} {value} is out of range", value=6)
    assert isinstance(e, QkvError) and isinstance(e, ValueError)
    assert (str(e), e.argument) == ("layer 6 is out of range", "layer")
    cli = e.spelled({"layer": "--layer"})
    assert type(cli) is QkvError and str(cli) == "--layer 6 is out of range"


def test_a_template_naming_an_unknown_field_fails_loudly():
    with pytest.raises(KeyError):
        str(Message("{name} {vaule}", "top", value=0))


def test_every_role_has_a_library_spelling():
    assert all(isinstance(v, str) and v for v in ARGUMENTS.values())
    assert ARGUMENTS["token"] == "token" and ARGUMENTS["words"] == "words=True"
