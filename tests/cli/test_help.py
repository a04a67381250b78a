"""``--help`` of every command: every option says what it is, examples run one command per line
and parse, and the lists it shows (models, probes) are read from the library's tables."""

import argparse
import contextlib
import io
import shlex

import pytest

from qkv.cli import build_parser


def commands(parser: argparse.ArgumentParser, name: str = "qkv"):
    """(command name, parser) for qkv and every sub-command, sub-sub-commands included."""
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            seen = set()
            for sub_name, sub in action.choices.items():
                if id(sub) not in seen:
                    seen.add(id(sub))
                    yield from commands(sub, f"{name} {sub_name}")


PARSER = build_parser()
COMMANDS = dict(commands(PARSER))


def test_the_walk_finds_every_command():
    assert {"qkv explain", "qkv heads", "qkv softmax-demo", "qkv walkthrough", "qkv view",
            "qkv translate", "qkv evaluate", "qkv train translate", "qkv train lm",
            "qkv faithfulness"} <= set(COMMANDS)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_option_has_help(name):
    parser = COMMANDS[name]
    missing = [a.option_strings[0] if a.option_strings else a.dest for a in parser._actions
               if not isinstance(a, (argparse._HelpAction, argparse._VersionAction))
               and (not a.help or a.help == argparse.SUPPRESS)]
    assert not missing, f"{name}: no help for {missing}"
    assert parser.description or name == "qkv" or parser._subparsers, f"{name} has no description"


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_examples_are_one_command_a_line_and_parse(name):
    epilog = COMMANDS[name].epilog or ""
    for line in epilog.splitlines():
        command = line.split(":", 1)[1] if line.startswith("example") else line
        if "qkv " not in command:
            continue
        assert command.count("qkv ") == 1, f"{name}: two commands on one line: {line!r}"
        argv = shlex.split(command)
        assert argv[0] == "qkv"
        with contextlib.redirect_stderr(io.StringIO()):
            PARSER.parse_args(argv[1:])  # SystemExit (exit 2) on an example that does not parse


def test_long_examples_are_not_wrapped():
    help_text = COMMANDS["qkv view"].format_help()
    assert '  qkv view "The dog found some pizza next to the baby and ate it" --html it.html\n' in help_text


def test_heads_names_every_probe():
    from qkv.explain.probes.registry import PROBES

    heads = COMMANDS["qkv heads"]
    probe = next(a for a in heads._actions if a.dest == "probe")
    for name in PROBES:
        assert name in heads.description and name in probe.help, name


@pytest.mark.parametrize("name", ["qkv explain", "qkv heads", "qkv faithfulness", "qkv view"])
def test_model_help_names_the_shipped_models_it_takes(name):
    from qkv.models.registry import SHIPPED

    model = next(a for a in COMMANDS[name]._actions if a.dest == "model")
    takes_cross_attention = name in ("qkv explain", "qkv view")
    for shipped_name, shipped in SHIPPED.items():
        if shipped.display == SHIPPED["minilm"].display and shipped_name != "minilm":
            continue  # a second name of minilm
        listed = shipped_name in model.help
        assert listed == (shipped.self_attention or takes_cross_attention), (name, shipped_name)
    assert "a known name (minilm)" not in model.help
