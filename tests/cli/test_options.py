"""qkv.cli.options: every option of every command is checked, and each check says why."""

import argparse
import json

import pytest

from qkv.cli import build_parser, main
from qkv.cli import options


def test_every_option_of_every_command_has_a_checking_type():
    """A new option added with ``type=int`` (or no type) fails here, naming the command and flag."""
    assert options.unchecked_options(build_parser()) == []


def test_an_unchecked_option_is_found():
    parser = options.Parser(prog="qkv")
    sub = parser.add_subparsers()
    cmd = sub.add_parser("cmd")
    cmd.add_argument("--fine", type=options.integer(1, 2))
    cmd.add_argument("--flag", action="store_true")
    cmd.add_argument("--mode", choices=["a", "b"])
    cmd.add_argument("--bare")
    cmd.add_argument("--plain-int", type=int)
    assert options.unchecked_options(parser) == ["qkv cmd --bare", "qkv cmd --plain-int"]


@pytest.mark.parametrize("parse, raw, message", [
    (options.integer(1, 64), "0", "must be at least 1, got 0"),
    (options.integer(1, 64, why="beams"), "100000", "must be at most 64 (beams), got 100000"),
    (options.integer(1, 64), "1.5", "must be a whole number, got '1.5'"),
    (options.integer(1, 64), "", "must be a whole number, got ''"),
    (options.integer(0), "9" * 60, "must be a whole number, got '" + "9" * 40 + "…'"),
    (options.seed(), str(10**23), "must be at most 9223372036854775807 (a 64-bit seed), got "
                                  "10000000…(24 digits)"),
    (options.real(0, lo_open=True), "nan", "must be a finite number, got 'nan'"),
    (options.real(), "-inf", "must be a finite number, got '-inf'"),
    (options.real(0, 1), "1.5", "must be at most 1, got 1.5"),
    (options.real(0, lo_open=True), "0", "must be greater than 0, got 0"),
    (options.int_list(1, 8, most=2), "1,2,3", "must list at most 2 numbers, got 3"),
    (options.int_list(1, 8, most=4), "4,-1", "must be comma-separated whole numbers from 1 to 8, got '-1'"),
    (options.path(), "", "must not be empty"),
    (options.path(), "a\0b", "must not contain a NUL byte, got 'a\\x00b'"),
])
def test_bad_values_are_refused_with_a_reason(parse, raw, message):
    with pytest.raises(argparse.ArgumentTypeError) as e:
        parse(raw)
    assert str(e.value) == message


def test_good_values_parse():
    assert options.integer(-3, 3)("-3") == -3
    assert options.integer(0)("1_000") == 1000
    assert options.real(0, 1)(" 0.25 ") == 0.25
    assert options.int_list(1, 1024, most=8)("4,16,,64") == [4, 16, 64]
    assert options.text()("\ufeffthe cat") == "the cat"
    assert options.word()("7") == "7"


def test_threads_are_bounded_by_the_cores():
    hi = options.THREADS_PER_CORE * options.cpu_cores()
    assert options.threads()(str(hi)) == hi
    with pytest.raises(argparse.ArgumentTypeError, match=f"must be at most {hi} "):
        options.threads()(str(hi + 1))


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("argv, line", [
    # issue 9's reproductions: each was a traceback, an OOM kill, a segfault or a minute's wait
    (["translate", "x", "--threads", "100000"],
     f"--threads must be at most {options.THREADS_PER_CORE * options.cpu_cores()} "
     f"({options.THREADS_PER_CORE} × this machine's {options.cpu_cores()} CPU cores), got 100000"),
    (["translate", "x", "--threads", "20000"], "--threads must be at most"),
    (["translate", "the cat is red", "--beam", "100000"], "--beam must be at most 64"),
    (["evaluate", "--beam", "100000"], "--beam must be at most 64"),
    (["explain", "the cat", "--top", "-3"], "--top must be at least 1, got -3"),
    (["heads", "the cat", "--top", "-3"], "--top must be at least 1, got -3"),
    (["walkthrough", "--dim", "100000000"], "--dim must be at most 512"),
    (["walkthrough", "--seed", str(10**23)], "--seed must be at most 9223372036854775807"),
    (["softmax-demo", "--dims", "4,-16"], "--dims must be comma-separated whole numbers"),
    (["softmax-demo", "--dims", "100000000"], "--dims must be comma-separated whole numbers"),
    (["softmax-demo", "--keys", "-5"], "--keys must be at least 2, got -5"),
    (["softmax-demo", "--keys", "10000000"], "--keys must be at most 4096"),
    (["softmax-demo", "--dims", "16384", "--keys", "4096"], "--dims 16384 --keys 4096 --trials 2000 "
                                                            "needs 250.0 GiB at once"),
    (["train", "translate", "--lr", "inf"], "--lr must be a finite number, got 'inf'"),
    (["train", "translate", "--clip", "nan"], "--clip must be a finite number, got 'nan'"),
    (["explain"], "the following arguments are required: text (see qkv explain --help)"),
    (["explain", "x", "--layer"], "--layer: expected one argument (see qkv explain --help)"),
    (["frobnicate"], "COMMAND: invalid choice: 'frobnicate'"),
])
def test_bad_options_end_in_one_line(capsys, argv, line):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.startswith("qkv: error: " + line) and err.count("\n") == 1, err
    assert "usage:" not in err


def test_help_and_version_still_exit_0(capsys):
    assert main(["explain", "--help"]) == 0
    assert "usage: qkv explain" in capsys.readouterr().out
    assert main(["--version"]) == 0


def test_token_help_says_a_number_is_an_index(capsys):
    main(["explain", "--help"])
    assert "A whole number is always an index" in " ".join(capsys.readouterr().out.split())


def test_a_number_is_an_index_and_the_messages_say_how_to_pick_the_word(capsys):
    code, _, err = run(capsys, "explain", "I have 7 cats", "--token", "7")
    assert code == 2 and err.endswith("; a number is always an index: for the word '7' (token 3) "
                                      "write 7@0\n"), err
    code, _, err = run(capsys, "explain", "I have 7 cats and 2 dogs", "--token", "2")
    assert code == 0
    assert "qkv: note: --token 2 is read as an index (token 2, 'have'); for the word '2' write 2@0" in err
    code, out, _ = run(capsys, "explain", "I have 7 cats and 2 dogs", "--token", "2@0", "--json")
    assert code == 0 and json.loads(out)["unit"] == "2"
