"""A short seeded run of ``benchmarks/fuzz_kernel.py`` (issue 40): random shapes, grouped heads,
dtypes, interval masks, thread counts and layouts (transposed, expanded, overlapping, sliced,
non-contiguous outputs and gradients), forward and backward, against a float64 dense reference
with derived tolerances, and nothing printed by BLAS. The long runs are in docs/reliability.md."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from qkv.attention import kernels

pytestmark = pytest.mark.skipif(
    kernels.load() is None,
    reason="qkv's C++ kernel is not built here (make setup builds it: python -m qkv.attention.kernels.build)")

FUZZER = Path(__file__).resolve().parents[2] / "benchmarks" / "fuzz_kernel.py"


def fuzzer():
    spec = importlib.util.spec_from_file_location("fuzz_kernel", FUZZER)
    module = importlib.util.module_from_spec(spec)
    sys.modules["fuzz_kernel"] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def test_a_short_seeded_fuzz_run_holds(capsys):
    # 24 cases, ~8 s on an idle 2-core machine; the case's line names what broke and its number
    # (rerun it alone: python benchmarks/fuzz_kernel.py --only N --seed 1)
    assert fuzzer().main(["--cases", "24", "--seed", "1"]) == 0, capsys.readouterr().out
    assert "24 held, 0 failed" in capsys.readouterr().out


def test_the_kernels_backward_reads_its_own_forwards_lse():
    # seed 11 case 13 (issue 40): packed documents, all queries equal, scores near 50 — with the
    # spans forward's lse the kernel's backward had dv 3.5e-4 off (4.9× the bound); under
    # autograd both passes are now the kernel's
    case = fuzzer().run_case(13, 11)
    assert case.ran_kernel and not case.problems, case.problems


@pytest.mark.parametrize("index", [68, 430, 927, 1743, 2671])
def test_the_spans_paths_gradients_hold_the_flash_attention_bound(index):
    # seed 11's spans-path cases under 64 rows, bottom-right causal (issue 40): a key dominating
    # its rows, equal keys or values — 1.0-5.1× a bound taken from the plain softmax, whose P is
    # exact where FA2's P = exp(S − lse) carries lse's rounding; fuzz_kernel.flash_terms derives
    # what FA2 may add from the sum of |terms| of each gradient
    case = fuzzer().run_case(index, 11)
    assert not case.ran_kernel and not case.problems, case.problems
