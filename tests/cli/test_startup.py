"""What every command pays before it starts: building the parser and loading a shipped model
import neither transformers nor torch._dynamo (issue 32: ``qkv view TEXT --html`` spent ~5 s
importing transformers through an import in circuits/norms.py, and 1.5–3 s in torch._dynamo,
which torch's meta-device ``normal_``/``arange`` import on first use)."""

from __future__ import annotations

import json
import subprocess
import sys

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
