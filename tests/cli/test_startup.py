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
