"""The package's surface: the library functions, and imports that go one way with no side effects."""

import subprocess
import sys

import qkv.explain


def test_the_library_functions_are_exported():
    for name in ("explain", "explain_head", "attention_map", "heads", "probe", "no_projection",
                 "cross_attention", "cross_attention_head", "ArgumentError"):
        assert name in qkv.explain.__all__ and hasattr(qkv.explain, name)
    # a function never shadows a submodule of the same name
    from qkv.explain.probes import find_heads

    assert callable(qkv.explain.heads) and find_heads.heads is qkv.explain.heads


def _fresh(code: str) -> str:
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return r.stdout.strip()


def test_translate_does_not_import_explain():
    """explain uses translate (cross-attention); translate never uses explain."""
    code = ("import sys, qkv.translate, qkv.translate.report, qkv.translate.metrics; "
            "print(sorted(m for m in sys.modules if m.startswith(('qkv.explain', 'qkv.cli'))))")
    assert _fresh(code) == "[]"


def test_importing_the_library_draws_and_prints_nothing():
    """Computation imports neither rich nor matplotlib, and leaves matplotlib's backend alone."""
    code = ("import sys, qkv.explain; "
            "print(sorted(m for m in sys.modules if m.startswith(('rich', 'matplotlib', 'qkv.cli'))))")
    assert _fresh(code) == "[]"
