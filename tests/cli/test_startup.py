"""What every command pays before it starts: building the parser and loading a shipped model
import neither transformers nor torch._dynamo (issue 32: ``qkv view TEXT --html`` spent ~5 s
importing transformers through an import in circuits/norms.py, and 1.5–3 s in torch._dynamo,
which torch's meta-device ``normal_``/``arange`` import on first use)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("transformers", "torch._dynamo")


def test_the_parser_and_the_shipped_models_import_nothing_heavy():
    code = ("import json, sys\n"
            "from qkv.cli import build_parser\n"
            "build_parser()\n"
            "import qkv, qkv.view.export, qkv.view.api\n"
            "qkv.load('minilm'); qkv.load('translate'); qkv.load('lm')\n"
            f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == []


def test_torch_runs_on_one_thread_unless_told(monkeypatch, capsys):
    """A second torch thread on a busy machine made one sentence take a minute (issue 32's 102 s):
    every command runs on one thread unless --threads or OMP_NUM_THREADS says otherwise."""
    import torch

    from qkv.cli import main

    before = torch.get_num_threads()
    try:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        torch.set_num_threads(2)
        assert main(["explain", "the cat sat", "--json"]) == 0
        assert torch.get_num_threads() == 1
        torch.set_num_threads(2)
        assert main(["translate", "the cat is red", "--threads", "2"]) == 0  # told: kept
        assert torch.get_num_threads() == 2
        monkeypatch.setenv("OMP_NUM_THREADS", "2")  # told by the environment: left alone
        assert main(["explain", "the cat sat", "--json"]) == 0
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    capsys.readouterr()


# -- issue 41 item 3: the CLI answers --help, --version and argument errors without torch ----------
# Each of these ends before any command runs. Importing torch alone costs ~3 s of CPU (2.9 s
# measured for `qkv --help` on main, a loaded 2-core machine); without it the answer takes
# ~0.05 s, so 1 s of CPU is a bound with room for a slow machine, not a tuned figure.
CPU_LIMIT_S = 1.0
QUICK = [
    ["--help"], ["--version"], [], ["no-such-command"],
    ["explain", "--help"], ["heads", "--help"], ["why", "--help"], ["faithfulness", "--help"],
    ["atlas", "--help"], ["needle", "--help"], ["view", "--help"], ["walkthrough", "--help"],
    ["translate", "--help"], ["evaluate", "--help"], ["softmax-demo", "--help"], ["train", "--help"],
    ["explain", "the cat", "--top", "0"], ["explain", "the cat", "--no-such-flag"],
    ["heads", "--probe"], ["why", "the cat", "--to", "cat", "--layer", "x", "--head", "0"],
    ["needle", "--lengths", "1,x"], ["atlas", "--file", "c.txt", "--window", "1"],
    ["faithfulness", "--probe", "coref", "--sequences", "0"], ["view", "--port", "70000"],
    ["explain", "the cat", "--dtype", "float8"], ["why", "the cat", "--device", "tpu"],
    ["translate", "--beam", "0"], ["evaluate", "--threads", "0"], ["softmax-demo", "--dims", "0"],
    ["walkthrough", "--dim", "1"], ["train", "lm", "--steps", "0"], ["train", "reader", "--help"],
    ["train", "translate", "--lr", "nan"], ["show", "--help"], ["show", "steps", "x", "--layer", "y"],
]


@pytest.fixture(scope="module")
def cache_home(tmp_path_factory) -> str:
    """A cache of its own for the help texts that list the library's tables (options.Later)."""
    return str(tmp_path_factory.mktemp("cache"))


def _child(argv: list[str], cache_home: str) -> tuple[int, float, bool, str]:
    """(exit code, CPU seconds, whether torch was imported, stderr) of ``qkv ARGV`` in a fresh
    interpreter: the CPU time is the child's own (resource.getrusage of the children)."""
    import os
    import resource

    code = ("import sys\nfrom qkv.cli import main\nrc = main(sys.argv[1:])\n"
            "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH', file=sys.stderr)\n"
            "sys.exit(rc)\n")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                         timeout=300, env=os.environ | {"XDG_CACHE_HOME": cache_home})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    *err, marker = out.stderr.rstrip("\n").split("\n")
    return out.returncode, cpu, marker == "TORCH", "\n".join(err)


@pytest.mark.parametrize("argv", QUICK, ids=" ".join)
def test_help_version_and_argument_errors_import_no_torch(argv, cache_home):
    """What a parser needs from the library's tables (a help's lists of models and probes, the
    training configs' fields, the kinds' fields) is read once (torch), then from the cache kept
    for this version of qkv's source: the second answer is the one measured."""
    _child(argv, cache_home)
    rc, cpu, torch_imported, err = _child(argv, cache_home)
    assert rc in (0, 2), err
    assert not torch_imported, f"qkv {' '.join(argv)} imported torch"
    assert cpu <= CPU_LIMIT_S, f"qkv {' '.join(argv)} took {cpu:.2f} s of CPU"
    if rc == 2:
        assert "\n" not in err and err.startswith("qkv: error: "), err


def test_parsing_imports_no_torch_and_the_command_does():
    """Parsing a full command line leaves torch out; running it brings torch in (once it runs)."""
    code = ("import sys\nfrom qkv.cli import build_parser\n"
            "args = build_parser(lazy=True).parse_args(['walkthrough', '--dim', '4'])\n"
            "parsed = 'torch' in sys.modules\n"
            "import io, contextlib\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n    args.func(args)\n"
            "print(parsed, 'torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True"]


def test_import_qkv_imports_no_torch_until_a_name_is_used():
    code = ("import sys, qkv\nbefore = 'torch' in sys.modules\nqkv.MultiHeadAttention\n"
            "print(before, 'torch' in sys.modules, qkv.load.__module__)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True", "qkv.models.loading"]
