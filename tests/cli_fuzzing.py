"""Random command lines for every ``qkv`` command, built from the parser itself (hypothesis).

Shared by ``tests/cli/test_fuzz.py`` (a bounded run in the normal suite) and
``benchmarks/fuzz_cli.py`` (a long run). Nothing here knows the commands by hand: it walks
``qkv.cli.build_parser()``, finds every command (``explain``, ``train translate``, …) and each
one's arguments, and draws values from what each argument's type says
(:mod:`qkv.cli.options` marks each type with its kind and limits):

* numbers inside the limits (small ones: the run must stay cheap), at the limits, just outside,
  absurdly large (``10**40``), not numbers at all (``"1.5"``, ``"nan"``, ``""``);
* text: real words, Unicode (emoji, CJK, RTL, combining marks), bytes that are not UTF-8 (as
  Python hands them over in ``sys.argv``: ``surrogateescape``), a BOM, empty, very long;
* structure: a missing required argument, an unknown option, an option without its value,
  repeated options, ``--``, a stray word.

:func:`run_cli` runs ``qkv.cli.main(argv)`` in this process (no interpreter start-up: hundreds
of inputs a minute) with stdout/stderr captured, standard input given, and torch's thread count
put back afterwards. :func:`check_result` is the contract every command line must meet:
exit code 0 or 2, no traceback, at most one ``qkv: error:`` line.

Commands that cannot run cheaply are only *parsed* (their values still go through every check
of qkv.cli.options); each says why in :data:`PARSE_ONLY`. A command added later runs in full
unless it is listed there.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import signal
import sys
from dataclasses import dataclass

from hypothesis import strategies as st

from qkv.cli import build_parser, main
from qkv.cli.options import MARK

# Commands only parsed, never run, and why; an entry covers the commands under it too
# (("train",) is ``qkv train`` and every ``qkv train MODEL``).
PARSE_ONLY = {
    ("train",): "trains a model for minutes",
    ("evaluate",): "translates the whole test split (about 10 s a run)",
    ("view",): "starts a web server (or writes a page of every head's map)",
}
# Arguments put before the drawn ones to keep a run cheap (a drawn value still overrides them).
CHEAP = {
    ("softmax-demo",): ["--trials", "20"],
}
STDIN = b"\xef\xbb\xbfthe cat is red\nthe zebra is red\nthe cat \xff is red\n\n"

WORDS = ["the", "cat", "dog", "is", "red", "it", "ate", "pizza", "apple", "next", "to", "7",
         "The", "found", "some", "baby", "and", "black", "cats", "juice", "tree"]
ODD_TEXT = ["", " ", "\t\n", "\ufeffthe cat", "猫が好き", "שלום עולם", "🐈‍⬛ 🍕", "e\u0301",
            "a\u200bb", "\x00", "the cat \udcff is red", "\udcc3\udca9", "\ud800", "-x", "--", "@",
            "it@0", "it@-1", "it@99", "the@1", "7@0", "x" * 3000, " ".join(["dog"] * 600)]


def surrogate_text() -> st.SearchStrategy[str]:
    """Bytes, as ``sys.argv`` holds them: decoded with ``surrogateescape`` (invalid UTF-8 kept)."""
    return st.binary(max_size=24).map(lambda b: b.decode("utf-8", "surrogateescape"))


def any_text() -> st.SearchStrategy[str]:
    return st.one_of(
        st.lists(st.sampled_from(WORDS), min_size=1, max_size=8).map(" ".join),
        st.sampled_from(ODD_TEXT),
        st.text(max_size=20),
        surrogate_text(),
    )


def integers_for(limits: dict) -> st.SearchStrategy[str]:
    lo, hi = limits.get("lo"), limits.get("hi")
    base = lo if lo is not None else 0
    near = st.integers(base, base + 8 if hi is None else min(hi, base + 8))
    values = [near.map(str)]
    if limits.get("threads"):
        # More threads than free cores make every op wait (a run takes minutes on a busy
        # machine); the limit itself is tested by its bad neighbour hi + 1.
        values = [st.sampled_from(["1", "2"])]
    elif hi is not None and hi <= 100:
        values.append(st.just(str(hi)))
    bad = [st.just(v) for v in ("1.5", "", " ", "x", "0x10", "1e3", "nan", "٣", "+", "--1")]
    if lo is not None:
        bad.append(st.just(str(lo - 1)))
    if hi is not None:
        bad.append(st.just(str(hi + 1)))
    bad.append(st.integers(5, 45).map(lambda k: str(10**k)))
    bad.append(st.integers(5, 45).map(lambda k: str(-10**k)))
    return st.one_of(st.one_of(*values), st.one_of(*bad))  # half good, half bad


def reals_for(limits: dict) -> st.SearchStrategy[str]:
    return st.one_of(
        st.floats(allow_nan=True, allow_infinity=True).map(repr),
        st.sampled_from(["nan", "inf", "-inf", "1e309", "-0", "0", "1", "1e-9", "x", "", "1,5"]),
    )


def int_lists_for(limits: dict) -> st.SearchStrategy[str]:
    one = st.one_of(st.integers(1, 40).map(str), integers_for(limits))
    return st.lists(one, min_size=0, max_size=4).map(",".join)


# Hostile files (issue 23), made by make_hostile_files in the run's working directory: links
# and devices as outputs, model directories whose config.json is nested too deep or a FIFO,
# outputs that cannot be written.
HOSTILE_NAMES = ["link.png", "dangling.svg", "dir.png", "link.html", "/dev/null", "nested_model",
                 "fifo_model", "stray_model", "/proc/qkv-cannot/x.png", "/sys/qkv-cannot",
                 "file/below.png", "nan_model", "nan_minilm"]


def make_hostile_files(directory) -> None:
    """Create :data:`HOSTILE_NAMES`' files in ``directory`` (a fresh temporary one)."""
    import os
    import shutil
    from importlib import resources
    from pathlib import Path

    d = Path(directory)
    (d / "target.png").write_bytes(b"old")
    (d / "link.png").symlink_to(d / "target.png")
    (d / "link.html").symlink_to(d / "target.html")
    (d / "dangling.svg").symlink_to(d / "made_by_a_link.svg")
    (d / "dir.png").mkdir()
    (d / "file").write_text("a file where a directory is expected")
    (d / "nested_model").mkdir()
    (d / "nested_model" / "config.json").write_text(
        '{"model_type": "llama", "x": ' + "[" * 50_000 + "]" * 50_000 + "}")
    (d / "fifo_model").mkdir()
    os.mkfifo(d / "fifo_model" / "config.json")
    shutil.copytree(str(resources.files("qkv") / "data" / "lm"), d / "stray_model")
    (d / "stray_model" / "model.safetensors").write_bytes(b"not the listed weights")
    make_nan_model(d / "nan_model")
    make_nan_minilm(d / "nan_minilm")


def make_nan_model(directory) -> None:
    """The shipped lm saved broken: NaN in layer 1's query projection (every head), its manifest
    re-hashed so that the model loads and runs — as a run trained with a NaN loss would save it."""
    import json
    import shutil
    from importlib import resources
    from pathlib import Path

    import torch
    from safetensors.torch import load_file, save_file

    from qkv.training.checkpoint import sha256_file

    d = Path(directory)
    shutil.copytree(str(resources.files("qkv") / "data" / "lm"), d)
    config = json.loads((d / "config.json").read_text())
    name = next(n for n in config["files"] if n.endswith(".safetensors"))
    tensors = load_file(d / name)
    tensors["model.layers.1.self_attn.q_proj.weight"] = torch.full_like(
        tensors["model.layers.1.self_attn.q_proj.weight"], float("nan"))
    save_file(tensors, d / name, metadata={"format": "pt"})
    config["files"][name] = sha256_file(d / name)
    (d / "config.json").write_text(json.dumps(config, indent=2))


def make_nan_minilm(directory) -> None:
    """MiniLM (an encoder: the coref probe runs on it) with NaN in layer 2's query projection."""
    import shutil
    from pathlib import Path

    import torch
    from safetensors.torch import load_file, save_file

    from qkv.models.loading import KNOWN_MODELS

    source, d = Path(KNOWN_MODELS["minilm"][1]()), Path(directory)
    d.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt",
                 "special_tokens_map.json"):
        if (source / name).exists():
            shutil.copy(source / name, d / name)
    tensors = load_file(source / "model.safetensors")
    name = next(n for n in tensors if "layer.2." in n and n.endswith("query.weight"))
    tensors[name] = torch.full_like(tensors[name], float("nan"))
    save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})


NAN_TEXTS = {"nan_model": "baka bala bama baka bala bama",  # the lm's own words
             "nan_minilm": "the dog found the pizza and ate it"}


def nan_model_argvs() -> list[list[str]]:
    """Every way a model's numbers reach the screen, on both NaN models (the decoder lm: its
    probes are induction and previous-token; MiniLM: coref): each must end in one
    ``qkv: error:`` line naming the NaN — never print ``nan``, never exit 0."""
    argvs = []
    for name, text in NAN_TEXTS.items():
        model = ["--model", name]
        argvs += [["explain", text, *model], ["explain", text, *model, "--json"],
                  ["explain", text, *model, "--words"],
                  ["explain", text, *model, "--layer", "1", "--head", "0"],
                  ["explain", text, *model, "--no-projection"],
                  ["explain", text, *model, "--method", "norm"],
                  ["heads", text, *model, "--to", text.split()[1]],
                  ["heads", text, *model, "--to", text.split()[1], "--json"]]
    argvs += [["heads", "--probe", probe, "--model", "nan_model"]
              for probe in ("induction", "previous-token")]
    argvs += [["heads", "--probe", "induction", "--ablate", "--model", "nan_model"],
              ["heads", "--probe", "coref", "--model", "nan_minilm"],
              ["heads", "--probe", "coref", "--json", "--model", "nan_minilm"]]
    return argvs


def names_for(limits: dict) -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from(["minilm", "translate", "coref", "nope", ".", "..", "/nonexistent/dir",
                         "~", "", "a\x00b", "out.png", "map.svg", "x.pdf", "x.txt", "sub/x.png",
                         "/proc/x.png", "é.png", "\udcff.png", "-", "127.0.0.1", "x" * 300]),
        st.sampled_from(HOSTILE_NAMES),
        st.text(max_size=12),
        surrogate_text(),
    )


def values_for(action: argparse.Action) -> st.SearchStrategy[str]:
    """Strings to give ``action`` on the command line."""
    if action.choices is not None and not isinstance(action, argparse._SubParsersAction):
        return st.one_of(st.sampled_from([str(c) for c in action.choices]), any_text())
    info = getattr(action.type, MARK, {"kind": "text"})
    kind = info["kind"]
    if kind == "integer":
        return integers_for(info)
    if kind == "real":
        return reals_for(info)
    if kind == "int_list":
        return int_lists_for(info)
    if kind in ("path", "name"):
        return names_for(info)
    return any_text()


@dataclass(frozen=True)
class Command:
    """One runnable command: its words (``("train", "translate")``) and its parser."""

    words: tuple[str, ...]
    parser: argparse.ArgumentParser

    @property
    def name(self) -> str:
        return " ".join(self.words) or "qkv"

    @property
    def is_group(self) -> bool:
        """``qkv`` or ``qkv train``: picks a sub-command (each sub-command is fuzzed on its own)."""
        return any(isinstance(a, argparse._SubParsersAction) for a in self.parser._actions)

    @property
    def parse_only(self) -> bool:
        # A group's random sub-command could be one that must not run (a server, training).
        covered = any(self.words[:len(words)] == words for words in PARSE_ONLY)
        return covered or self.is_group


def commands(parser: argparse.ArgumentParser | None = None,
             words: tuple[str, ...] = ()) -> list[Command]:
    """Every command of ``parser`` (sub-commands included), the root ``qkv`` first."""
    parser = parser or build_parser()
    out = [Command(words, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += commands(sub, words + (name,))
    return out


def _nargs_count(action: argparse.Action, draw) -> int:
    n = action.nargs
    if n is None:
        return 1
    if n == "?":
        return draw(st.integers(0, 1))
    if n == "*":
        return draw(st.integers(0, 4))
    if n == "+":
        return draw(st.integers(1, 4))
    if isinstance(n, int):
        return n
    return 1


@st.composite
def argv_for(draw, command: Command) -> list[str]:
    """A random argument list for ``command`` (its words first)."""
    argv = list(command.words) + list(CHEAP.get(command.words, []))
    actions = [a for a in command.parser._actions
               if not isinstance(a, (argparse._HelpAction, argparse._VersionAction))]
    positionals = [a for a in actions if not a.option_strings
                   and not isinstance(a, argparse._SubParsersAction)]
    optionals = [a for a in actions if a.option_strings]
    subcommands = [a for a in actions if isinstance(a, argparse._SubParsersAction)]

    for action in positionals:
        if action.nargs is None and draw(st.integers(0, 9)) == 0:
            continue  # a missing required argument
        for _ in range(_nargs_count(action, draw)):
            argv.append(draw(values_for(action)))
    if subcommands and draw(st.booleans()):
        argv.append(draw(st.one_of(st.sampled_from(sorted(subcommands[0].choices)), any_text())))
    if optionals:
        chosen = draw(st.lists(st.sampled_from(optionals), max_size=4))
        for action in chosen:
            flag = draw(st.sampled_from(action.option_strings))
            argv.append(flag)
            if action.nargs == 0:
                continue
            if draw(st.integers(0, 19)) == 0:
                continue  # an option without its value
            for _ in range(_nargs_count(action, draw)):
                argv.append(draw(values_for(action)))
    extra = draw(st.integers(0, 14))
    if extra == 0:
        argv.append("--bogus-option")
    elif extra == 1:
        argv.append(draw(any_text()))  # a stray word
    elif extra == 2:
        argv.insert(len(command.words), "--")
    elif extra == 3:
        argv.append("--help")
    return argv


@dataclass(frozen=True)
class Result:
    argv: list[str]
    code: object
    out: str
    err: str
    raised: BaseException | None


class TooSlow(BaseException):
    """One command line ran past :data:`TIME_LIMIT` (a BaseException: ``main`` must not catch it)."""


TIME_LIMIT = 60  # seconds for one command line; more means a command that should be PARSE_ONLY


def _too_slow(signum, frame):
    raise TooSlow(f"ran for more than {TIME_LIMIT} s: bound its options, or list the command in "
                  f"PARSE_ONLY with the reason")


def run_cli(argv: list[str], *, parse_only: bool = False, stdin: bytes = STDIN) -> Result:
    """``qkv.cli.main(argv)`` in this process, output captured, torch threads put back."""
    import torch

    previous = signal.signal(signal.SIGALRM, _too_slow)
    signal.alarm(TIME_LIMIT)
    threads = torch.get_num_threads()
    out, err = io.StringIO(), io.StringIO()
    saved_stdin = sys.stdin
    sys.stdin = io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8")
    raised, code = None, None
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            if parse_only:
                code = _parse_only(argv)
            else:
                code = main(argv)
    except BaseException as e:  # the contract is that nothing escapes main
        raised = e
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        sys.stdin = saved_stdin
        torch.set_num_threads(threads)
    return Result(argv, code, out.getvalue(), err.getvalue(), raised)


def _parse_only(argv: list[str]) -> int:
    try:
        build_parser().parse_args(argv)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 2
    return 0


def check_result(r: Result) -> None:
    """The contract: exit 0 or 2, never a traceback, at most one ``qkv: error:`` line."""
    where = f"argv={r.argv!r}\nstderr={r.err[-2000:]!r}"
    if r.raised is not None:
        raise AssertionError(f"{type(r.raised).__name__} escaped main: {r.raised!r}\n{where}") from r.raised
    assert r.code in (0, 2), f"exit code {r.code!r}\n{where}"
    assert "Traceback" not in r.err, where
    errors = [line for line in r.err.splitlines() if line.startswith("qkv: error:")]
    assert len(errors) <= 1, where
    assert "usage:" not in r.err or r.code == 2 and not errors, where  # no usage block with errors


# -- a closed stdout (``qkv … >&-``): only a real process can have one --------------------------
def closed_stdout_argvs() -> list[list[str]]:
    """One cheap command line per command: each, run with stdout closed, must end in one
    ``qkv: error:`` line and exit 2 (the check comes before any parsing or work)."""
    return [list(c.words) + (["the cat"] if c.words in (("explain",), ("translate",)) else [])
            for c in commands()]


def run_with_stdout_closed(argv: list[str], timeout: float = 120) -> Result:
    """``python -m qkv argv`` with file descriptor 1 closed; the contract plus that error line."""
    import os
    import subprocess

    import qkv

    # this qkv, whatever the working directory (the fuzz runs in a temporary one)
    src = os.path.dirname(os.path.dirname(os.path.abspath(qkv.__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-m", "qkv", *argv], stderr=subprocess.PIPE, text=True,
                       timeout=timeout, preexec_fn=lambda: os.close(1), env=env)
    return Result(argv, r.returncode, "", r.stderr, None)
