"""README.md and docs/*.md cannot drift: every fenced block is run or checked here.

The convention (written for readers in docs/index.md, "Docs that cannot drift"):

* ``console`` blocks: each ``$ qkv …`` line runs in this process through ``qkv.cli.main`` (the
  line split into arguments by bash, so quoting and ``$(printf …)`` mean what a shell makes of
  them) and the lines after it, up to the next ``$ `` line, are compared with what it printed by
  the rule of ``tests/numbers_match.py`` (float round-off tolerated, ``...`` = any lines). A
  command that exits non-zero is compared on its stderr and must exit with 2 (``qkv: error:``).
  A console block with no ``$`` line holds set-up commands (``make demo``): each must name a
  Makefile target, or be the venv's activation.
* ``python`` blocks run in a fresh namespace; ``EXPR  # → TEXT`` states what EXPR evaluates to
  (``…`` elides the rest), checked with the same rule. Placeholder directories
  (``path/to/SmolLM-135M``) are tiny random checkpoints of that family saved by ``transformers``.
* ``bash`` blocks: each line is a ``qkv`` command run in a scratch directory (``> FILE`` writes its
  stdout there); the files it names must exist afterwards.
* A command that cannot run in a test (a server, minutes of training, several processes) is in
  ``NOT_RUN`` with the reason; its options are still parsed by the real parser. A block that is
  a picture or an excerpt is in ``NOT_COMMANDS`` with the reason. Anything else fails
  :func:`test_every_block_is_run_or_listed`, so nothing is skipped silently.

Models are loaded once for the whole module (``qkv.models.load`` memoised by name: the same
real model, not a stand-in) so the dozens of commands pay for each model once.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import re
import shlex
import socket
import subprocess
from pathlib import Path

import pytest
import torch
from numbers_match import line_matches

from qkv.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# Commands that are not run, by their first words, with why; each is still parsed.
NOT_RUN = {  # the first entry whose words start the command gives the reason
    "qkv view \"The dog found some pizza next to the baby and ate it\" --html":
        "writes a 3.6 MB page (about 10 s of CPU); tests/view/ check the exported page",
    "qkv view \"The dog found some pizza next to the baby and ate it\"":
        "serves until Ctrl-C (tests/view/ start the server and drive the page)",
    "qkv view --file BOOK.txt --model DIR": "placeholders for the reader's own book and model",
    "qkv train lm --out runs/lm": "minutes of training (tests/lm/ train short runs and resume them)",
    "qkv train reader --out": "17 minutes of training on two threads (tests/reader/ train short runs and resume them)",
    "torchrun --nproc-per-node 4 examples/ring_attention.py":
        "four processes; its timing is the machine's (tests/distributed/ run ring attention on gloo)",
    "python benchmarks/": "a benchmark (minutes); its results are benchmarks/RESULTS.md",
}
# Fenced blocks that are no commands and no output of one: (page, first line) → why.
NOT_COMMANDS = {
    ("architecture.md", "┌"): "a drawing of the layers",
    ("tutorial.md", "<bos> doka baha"): "an excerpt of the training data, drawn",
    ("tutorial.md", "method          per     n   spearman ρ"):
        "qkv faithfulness --model minilm --probe coref: 3 minutes, too slow for the suite; the "
        "same command on lm is run from the tutorial's console blocks",
}


def blocks(path: Path) -> list[tuple[str, str, int]]:
    """(language, body, line number) of every fenced block of a page."""
    text = path.read_text(encoding="utf-8")
    return [(m.group(1), m.group(2), text[:m.start()].count("\n") + 1)
            for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, flags=re.S | re.M)]


def console_commands(body: str) -> list[tuple[str, list[str]]]:
    """(command, expected output lines) for every ``$ `` line of a console block."""
    found = []
    for chunk in re.split(r"^(?=\$ )", body, flags=re.M):
        if chunk.startswith("$ "):
            first, *rest = chunk.rstrip("\n").split("\n")
            found.append((first[2:].strip(), rest))
    return found


def not_run_reason(command: str) -> str | None:
    return next((why for start, why in NOT_RUN.items() if command.startswith(start)), None)


def argv_of(command: str, cwd: Path | None = None) -> list[str]:
    """The arguments bash makes of ``command`` (quotes, ``$(printf …)``, comments), undecoded
    bytes kept as Python keeps them in ``sys.argv``."""
    run = subprocess.run(["bash", "-c", f'set -- {command}\nprintf "%s\\0" "$@"'],
                         capture_output=True, cwd=cwd, check=True)
    return [os.fsdecode(a) for a in run.stdout.split(b"\0")[:-1]]


def line_ok(want: str, got: str) -> bool:
    """``numbers_match``'s rule, plus ``...`` inside a line: any text there (a path, a time); the
    pieces around it must then appear as written."""
    if "..." in want and want.strip() != "...":
        pieces = (re.escape(" ".join(p.split())) for p in want.split("..."))
        return re.fullmatch(".*".join(pieces), " ".join(got.split())) is not None
    return line_matches(want, got)


def output_ok(want: list[str], got: list[str]) -> bool:
    """Line by line by :func:`line_ok`; a line ``...`` alone stands for any number of lines."""
    @functools.cache
    def match(i: int, j: int) -> bool:
        if i == len(want):
            return j == len(got)
        if want[i].strip() == "..." and want[i] == want[i].rstrip():
            return any(match(i + 1, k) for k in range(j, len(got) + 1))
        return j < len(got) and line_ok(want[i], got[j]) and match(i + 1, j + 1)
    return match(0, 0)


@functools.cache
def run_cli(argv: tuple[str, ...]) -> tuple[int, list[str], list[str]]:
    """Exit code, stdout and stderr lines of one command, run once per module (the tutorial and
    the commands page show some commands twice)."""
    assert argv[0] == "qkv", argv
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv[1:])
    return code, out.getvalue().splitlines(), err.getvalue().splitlines()


def collect():
    """Every checkable item of every page: (kind, page, line, payload)."""
    items = []
    for page in PAGES:
        for lang, body, line in blocks(page):
            where = (page.name, line)
            if lang == "console":
                commands = console_commands(body)
                if not commands:
                    items.append(("setup", *where, body))
                else:
                    items += [("console", *where, c) for c in commands]
            elif lang == "python":
                items.append(("python", *where, body))
            elif lang == "bash":
                items += [("bash", *where, c) for c in body.splitlines() if c.strip()]
            else:
                items.append(("other", *where, body))
    return items


ITEMS = collect()


def ids(kind):
    return [f"{p}:{n}:{(x[0] if isinstance(x, tuple) else x)[:60]}" for k, p, n, x in ITEMS if k == kind]


def of(kind):
    return [(p, n, x) for k, p, n, x in ITEMS if k == kind]


@pytest.fixture(scope="module", autouse=True)
def models_once():
    """``qkv.models.load`` memoised by name for this module: every command reads the same
    loaded model (the CLI asks ``qkv.models.load`` at call time)."""
    import qkv.models

    real = qkv.models.load
    cached = functools.cache(real)
    qkv.models.load = lambda path, **kw: cached(path) if not kw and isinstance(path, str) else real(path, **kw)
    yield
    qkv.models.load = real


def test_every_block_is_run_or_listed():
    listed = set(NOT_COMMANDS)
    for page, line, body in of("other"):
        key = next((k for k in listed if k[0] == page and body.lstrip(" ").startswith(k[1])), None)
        assert key, (f"{page}:{line}: a fenced block with no language that no test runs; make it a "
                     f"console/python/bash block, or list it in NOT_COMMANDS with why")
        listed.discard(key)
    assert not listed, f"NOT_COMMANDS names blocks the docs no longer have: {listed}"
    assert len(of("console")) >= 15 and len(of("python")) >= 7


@pytest.mark.parametrize("page, line, command", of("console"), ids=ids("console"))
def test_console_output_is_current(page, line, command):
    command, expected = command
    argv = argv_of(command)
    if not_run_reason(command):
        build_parser().parse_args(argv[1:]) if argv[0] == "qkv" else _script_exists(argv)
        return
    code, out, err = run_cli(tuple(argv))
    got = out if code == 0 else err
    assert code in (0, 2), f"{command} exited with {code}: {err}"
    assert output_ok(expected, got), (
        f"output of `{command}` no longer matches {page}:{line}; it is now (exit {code}):\n"
        + "\n".join(got))


def _script_exists(argv):
    script = next(a for a in argv if a.endswith(".py"))
    assert (ROOT / script).is_file(), script


@pytest.mark.parametrize("page, line, command", of("bash"), ids=ids("bash"))
def test_bash_lines_run(page, line, command, tmp_path):
    command = command.split(" #")[0].strip()
    redirect = re.search(r"\s>\s*(\S+)$", command)
    if redirect:
        command = command[:redirect.start()]
    argv = argv_of(command, cwd=tmp_path)
    if not_run_reason(command):
        build_parser().parse_args(argv[1:])
        return
    cwd = Path.cwd()
    os.chdir(tmp_path)
    try:
        code, out, err = run_cli.__wrapped__(tuple(argv))
    finally:
        os.chdir(cwd)
    assert code == 0, f"{command}: {err}"
    if redirect:
        (tmp_path / redirect.group(1)).write_text("\n".join(out), encoding="utf-8")
    for flag in ("--png", "--html", "--plot"):
        if flag in argv:
            assert (tmp_path / argv[argv.index(flag) + 1]).stat().st_size > 0, flag


@pytest.mark.parametrize("page, line, body", of("setup"), ids=ids("setup"))
def test_setup_commands_exist(page, line, body):
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    for command in (c.split("#")[0].strip() for c in body.splitlines()):
        if command.startswith("make "):
            assert re.search(rf"^{command.split()[1]}:", makefile, flags=re.M), command
        else:  # the venv `make setup` creates, whose bin/ holds the qkv script
            assert command == ". .venv/bin/activate", command
            assert "VENV   := .venv" in makefile and "-m venv $(VENV)" in makefile
            assert "qkv = \"qkv.cli:main\"" in (ROOT / "pyproject.toml").read_text(encoding="utf-8")


# -- python snippets -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def placeholders(tmp_path_factory):
    """What the snippets' placeholder directories stand for: tiny random checkpoints of the same
    family, saved by transformers (built lazily: only the snippets that name them pay)."""
    from hf_decoders import make_checkpoint

    small = dict(hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
                 max_position_embeddings=64)
    recipes = {
        "path/to/pythia-160m": ("GPTNeoXConfig", "GPTNeoXForCausalLM", small),
        "path/to/SmolLM-135M": ("LlamaConfig", "LlamaForCausalLM", small | dict(num_key_value_heads=2)),
        "path/to/gemma-2": ("Gemma2Config", "Gemma2ForCausalLM",
                            small | dict(num_key_value_heads=2, head_dim=8, sliding_window=5,
                                         attn_logit_softcapping=2.0, query_pre_attn_scalar=12)),
    }

    @functools.cache
    def directory(name):
        config, cls, kw = recipes[name]
        return make_checkpoint(tmp_path_factory.mktemp(name.split("/")[-1]), config, cls, **kw)[0]

    return recipes, directory


CHECK = re.compile(r"^(?P<expr>\S.*?)\s+# → (?P<want>.+)$")


def check_value(value, want: str, where: str) -> None:
    got = str(value)
    if "…" in want:
        head, *_ = want.split("…")
        assert line_matches(head.rstrip(" ,"), got[:len(head.rstrip(" ,"))]), f"{where}: {got}"
    else:
        assert line_matches(want, got), f"{where}: {want} is now {got}"


@pytest.mark.parametrize("page, line, body", of("python"), ids=ids("python"))
def test_python_snippets_run(page, line, body, placeholders, monkeypatch):
    recipes, directory = placeholders
    for name in recipes:
        if name in body:
            body = body.replace(f'"{name}"', repr(directory(name)))
    lines = []
    for n, text in enumerate(body.splitlines()):
        m = CHECK.match(text)
        lines.append(f"__check({m['expr']}, {m['want']!r}, {f'{page}:{line + 1 + n}'!r})" if m else text)
    if "init_process_group" in body:  # as torchrun would set them, for one process
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        for k, v in dict(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                         MASTER_PORT=str(port)).items():
            monkeypatch.setenv(k, v)
    torch.manual_seed(0)
    try:
        exec(compile("\n".join(lines), f"{page}:{line}", "exec"), {"__check": check_value})
    finally:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


def test_the_rules_of_this_file():
    assert console_commands("$ qkv a\nx\n...\n$ qkv b\n") == [("qkv a", ["x", "..."]), ("qkv b", [])]
    assert argv_of("qkv explain \"$(printf 'a \\xff b')\" --token 7  # note") == [
        "qkv", "explain", os.fsdecode(b"a \xff b"), "--token", "7"]
    assert shlex.split("qkv x") == argv_of("qkv x")
    assert not_run_reason("qkv train lm --out runs/lm --resume") and not not_run_reason("qkv evaluate")
    assert "3.6 MB" in not_run_reason('qkv view "The dog found some pizza next to the baby and ate it" --html x')
    assert output_ok(["model: .../data/translate (step 1200) · greedy"],
                     ["model: /a/b/data/translate (step 1200)   · greedy"])
    assert not output_ok(["model: .../data/translate (step 1200)"], ["model: /a/data/lm (step 1200)"])
    assert output_ok(["a", "...", "d"], ["a", "b", "c", "d"]) and not output_ok(["a", "b"], ["a", "b", "c"])
    check_value((1, 0, 0.5363), "(1, 0, 0.5363)", "here")
    with pytest.raises(AssertionError):
        check_value((1, 0, 0.5363), "(1, 1, 0.5363)", "here")
