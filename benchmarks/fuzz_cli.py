"""The long CLI fuzz run: many random command lines per command, the same contract as the test.

    .venv/bin/python benchmarks/fuzz_cli.py [--examples 400] [--seed 0] [--command explain]

Builds argument lists with ``tests/cli_fuzzing.py`` (from the parser: wrong types, extremes,
Unicode, invalid bytes, missing/unknown arguments), runs each with ``qkv.cli.main`` in this
process from an empty temporary directory, and checks the contract (exit 0 or 2, no traceback,
at most one ``qkv: error:`` line, no file outside that directory, no ``.tmp`` left). Prints, per
command, how many inputs were tried, how they ended (exit 0 / one error line / other exit 2),
and the time; the first failure is printed with its argument list and the run exits 1.

The working directory holds hostile files the fuzz draws as paths (``make_hostile_files``: links
and a dangling link as outputs, a directory named ``.png``, a model directory whose config.json
nests 50,000 levels deep, one whose config.json is a FIFO, one with a stray unlisted
``model.safetensors``, two saved with NaN weights; ``/dev/null``, ``/proc/…`` and ``/sys/…`` as
unwritable outputs). After the random runs: every command once more as a real process with its
stdout closed; every explanation and probe on the NaN models (``nan_model_argvs``: one error
line naming the NaN, exit 2); and the viewer's Host/Origin rule on ``--examples`` fuzzed
headers each (the generators of tests/view/test_origin.py): every foreign or malformed Host
and every Origin but the page's own refused, naming the header.

Hypothesis keeps its files (a Unicode table) in the temporary directory, not the repository.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tests" / "view"))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--examples", type=int, default=400, help="inputs per command")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--command", default=None, help="only this command (e.g. 'explain')")
    p.add_argument("--slow", type=float, default=5.0, help="print inputs that take longer (s)")
    args = p.parse_args()

    import torch
    from hypothesis import HealthCheck, given, seed, settings
    from hypothesis.configuration import set_hypothesis_home_dir

    from cli_fuzzing import (
        argv_for, check_result, closed_stdout_argvs, commands, make_hostile_files, nan_model_argvs,
        run_cli, run_with_stdout_closed,
    )

    torch.set_num_threads(1)
    before = set(os.listdir(REPO))
    total, failed = 0, False
    print(f"{'command':<18}{'inputs':>8}{'exit 0':>8}{'error':>8}{'other 2':>9}{'seconds':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        set_hypothesis_home_dir(Path(tmp) / ".hypothesis")  # not <cwd at import>/.hypothesis
        make_hostile_files(tmp)
        for command in commands():
            if args.command and command.name != args.command:
                continue
            tally: Counter = Counter()
            start = time.perf_counter()

            @seed(args.seed)
            @settings(max_examples=args.examples, deadline=None, database=None,
                      suppress_health_check=list(HealthCheck))
            @given(argv=argv_for(command))
            def run(argv):
                began = time.perf_counter()
                r = run_cli(argv, parse_only=command.parse_only)
                check_result(r)
                if time.perf_counter() - began > args.slow:
                    print(f"  slow ({time.perf_counter() - began:.1f} s): {argv!r}", flush=True)
                tally["inputs"] += 1
                tally["exit 0" if r.code == 0 else "error" if "qkv: error:" in r.err else "other 2"] += 1

            try:
                run()
            except Exception as e:  # the first input that breaks the contract
                print(f"{command.name}: FAILED\n{e}", file=sys.stderr)
                failed = True
            seconds = time.perf_counter() - start
            total += tally["inputs"]
            print(f"{command.name:<18}{tally['inputs']:>8}{tally['exit 0']:>8}{tally['error']:>8}"
                  f"{tally['other 2']:>9}{seconds:>9.1f}", flush=True)
            leftovers = list(Path(tmp).rglob("*.tmp"))
            if leftovers:
                print(f"{command.name}: temporary files left: {leftovers}", file=sys.stderr)
                failed = True
        if not args.command:
            start, closed = time.perf_counter(), 0
            for argv in closed_stdout_argvs():
                r = run_with_stdout_closed(argv)
                try:
                    check_result(r)
                    assert r.code == 2 and r.err.startswith("qkv: error: standard output is closed")
                    closed += 1
                except AssertionError as e:
                    print(f"stdout closed: FAILED {argv!r}\n{e}", file=sys.stderr)
                    failed = True
            print(f"{'stdout closed':<18}{len(closed_stdout_argvs()):>8}{0:>8}{closed:>8}{0:>9}"
                  f"{time.perf_counter() - start:>9.1f}", flush=True)
            failed |= not _nan_models(run_cli, check_result, nan_model_argvs())
            failed |= not _viewer_headers(args.examples, args.seed)
        os.chdir(REPO)
    new = set(os.listdir(REPO)) - before
    if new:
        print(f"written into the repository: {sorted(new)}", file=sys.stderr)
        failed = True
    print(f"total: {total} inputs, {'FAILED' if failed else 'contract held for every one'}")
    return 1 if failed else 0


def _nan_models(run_cli, check_result, argvs) -> bool:
    """Every explanation and probe on a model with NaN weights: one error line naming it."""
    start, named = time.perf_counter(), 0
    for argv in argvs:
        r = run_cli(argv)
        try:
            check_result(r)
            assert r.code == 2 and "NaN" in r.err and r.out == "", (r.code, r.out[:200], r.err[:300])
            named += 1
        except AssertionError as e:
            print(f"NaN model: FAILED {argv!r}\n{e}", file=sys.stderr)
    print(f"{'NaN models':<18}{len(argvs):>8}{0:>8}{named:>8}{0:>9}"
          f"{time.perf_counter() - start:>9.1f}", flush=True)
    return named == len(argvs)


def _viewer_headers(n: int, seed: int) -> bool:
    """The viewer's Host/Origin rule (qkv.view.server.refusal) on ``n`` fuzzed headers of each."""
    import random

    from test_origin import _fuzzed_hosts, _fuzzed_origins
    from qkv.view.server import allowed_hosts, refusal

    start, rng, port = time.perf_counter(), random.Random(seed), 8765
    hosts, bad = allowed_hosts("127.0.0.1"), []
    for host in _fuzzed_hosts(rng, n):
        why = refusal({"host": host}, hosts, api=True)
        if why is None or why[0] != "host":
            bad.append(("Host", host, why))
    own = f"127.0.0.1:{port}"
    origins = _fuzzed_origins(rng, port, n)
    for origin in origins:
        why = refusal({"host": own, "origin": origin}, hosts, api=True)
        if (why is None) != (origin == f"http://{own}") or (why is not None and why[0] != "origin"):
            bad.append(("Origin", origin, why))
    for kind, value, why in bad[:1]:
        print(f"viewer headers: FAILED {kind} {value!r} → {why!r}", file=sys.stderr)
    refused = 2 * n - len(bad) - sum(o == f"http://{own}" for o in origins)
    print(f"{'viewer headers':<18}{2 * n:>8}{2 * n - len(bad) - refused:>8}{refused:>8}{len(bad):>9}"
          f"{time.perf_counter() - start:>9.1f}", flush=True)
    return not bad


if __name__ == "__main__":
    sys.exit(main())
