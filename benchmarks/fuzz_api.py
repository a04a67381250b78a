"""The long fuzz run of the viewer's document endpoints and the causal API (issue 31).

    .venv/bin/python benchmarks/fuzz_api.py [--examples 300] [--seed 0] [--part endpoints]

Three parts, each a contract checked on every input (the run exits 1 at the first break):

* ``endpoints`` — ``qkv view --file``'s app (a ~3,000-token Document read by a random 2-layer
  Llama, served by uvicorn on 127.0.0.1) gets ``--examples`` random JSON bodies per document
  endpoint (``doc_overview``, ``doc_block_map``, ``doc_rows``, ``doc_received``): every field
  drawn from hostile values (0, −1, 2³¹ − 1, 10¹², 1.5, NaN-like strings, booleans, lists,
  null) or valid ones, now and then an unknown field. Contract: 200 with the row's ``kind``, or
  a 4xx JSON error naming a field — never a 5xx; each answer within ``--slow`` seconds; the
  process's peak resident set (VmHWM, reset before the part) grows by at most ``--rss`` MiB
  (``block`` 2³¹ − 1 allocated ~17 GB before issue 31).
* ``slow-clients`` — 250 connections send half a request line and wait: good requests are
  still answered 200 while they stay, and each of them gets a 408 within the read deadline.
* ``causal`` — ``ablate``, ``patch``, ``head_effects`` and ``faithfulness`` on the shipped
  ``lm``, and ``document`` / ``Document.weights`` / ``Document.block_map`` of a short text, with
  ``--examples`` random argument sets each (heads, texts or ids, mode, probe, sequences, length,
  methods, memory limits, rows, tile sides). Contract: a typed result whose numbers are all
  finite, or a ``ValueError`` (``QkvError``/``ArgumentError``) — never another exception, never
  NaN (a 1-token patch and ``length=1`` returned NaN before issue 31).

Prints one row per part: inputs, how they ended (answered / refused by name), seconds.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import socket
import sys
import threading
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tests" / "view"))

HOSTILE = [0, -1, 1, 2, 2**31 - 1, 2**31, 10**12, -(2**63), 10**400, 1.5, float("inf"),
           float("nan"), True, False, None, "3", "NaN", "", [], [1], {}, {"a": 1}]


def vm(key: str) -> int:
    """A /proc/self/status figure in bytes (VmHWM: the peak resident set; VmRSS: now)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key))


def reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM starts again from VmRSS


def row(name: str, inputs: int, answered: int, refused: int, seconds: float) -> None:
    print(f"{name:<14}{inputs:>8}{answered:>10}{refused:>9}{seconds:>9.1f}", flush=True)


# -- the document endpoints ------------------------------------------------------------------------
def body_for(rng: random.Random, fields: tuple, n: int) -> dict:
    """A JSON body for a row taking ``fields``: each field valid, hostile or left out."""
    valid = {"layer": lambda: rng.randrange(3), "head": lambda: rng.randrange(5),
             "block": lambda: rng.choice([1, 3, 37, 128, 1024, n, n + 1, 2**31 - 1]),
             "start": lambda: rng.randrange(n + 2), "stop": lambda: rng.randrange(n + 600),
             "key_start": lambda: rng.randrange(n + 2), "key_stop": lambda: rng.randrange(n + 2),
             "token": lambda: rng.choice([rng.randrange(n + 5), "the", "the@3", "zzz"]),
             "method": lambda: rng.choice(["weight", "norm", "rollout", "alti", "magic"])}
    body = {}
    for field in fields:
        roll = rng.random()
        if roll < 0.55:
            body[field] = valid.get(field, lambda: rng.choice(HOSTILE))()
        elif roll < 0.9:
            body[field] = rng.choice(HOSTILE)
    if rng.random() < 0.05:
        body["extra"] = 1
    return body


def endpoints(examples: int, seed: int, slow: float, rss_mib: float) -> bool:
    import httpx
    import qkv
    from conftest import serving
    from view_checks import long_text, tiny_decoder

    from qkv.explain.long.document import document
    from qkv.explain.kinds import KINDS
    from qkv.view.api import Api, Models

    model = tiny_decoder(qkv.load("minilm"), positions=4096, name="long")
    doc = document(model, long_text(2998))
    rows = [k for k in KINDS.values() if k.document]
    rng, tally, start, ok = random.Random(seed), Counter(), time.perf_counter(), True
    reset_peak()
    before = vm("VmRSS:")
    with serving(Api(Models(["long"], loader=lambda name: model), document=doc)) as served, \
            httpx.Client(base_url=served.url, timeout=120) as http:
        for _ in range(examples):
            for kind in rows:
                body = body_for(rng, tuple(getattr(f, "name", f) for f in kind.fields), len(doc))
                began = time.perf_counter()
                r = http.post("api/" + kind.endpoint, content=json.dumps(body),  # inf: Infinity
                              headers={"Content-Type": "application/json"})
                took = time.perf_counter() - began
                try:
                    if r.status_code == 200:
                        assert r.json()["kind"] == kind.name, r.text[:200]
                        tally["answered"] += 1
                    else:
                        assert 400 <= r.status_code < 500, (r.status_code, r.text[:300])
                        error = r.json()["error"]
                        assert error["message"] and "Traceback" not in error["message"], error
                        tally["refused"] += 1
                    assert took <= slow, f"{took:.1f} s"
                except AssertionError as e:
                    print(f"endpoints: FAILED {kind.endpoint} {body!r}\n{e}", file=sys.stderr)
                    return False
    grown = (vm("VmHWM:") - before) / 2**20
    if grown > rss_mib:
        print(f"endpoints: FAILED the peak resident set grew by {grown:.0f} MiB (limit {rss_mib})",
              file=sys.stderr)
        ok = False
    row("endpoints", tally["answered"] + tally["refused"], tally["answered"], tally["refused"],
        time.perf_counter() - start)
    print(f"  peak resident set +{grown:.0f} MiB over the part", flush=True)
    return ok


# -- slow clients ----------------------------------------------------------------------------------
def slow_clients(count: int = 250, deadline: float = 2.0) -> bool:
    import httpx
    import qkv
    from view_checks import tiny_decoder

    from qkv.view.api import Api, Models
    from qkv.view.server import bind, create_app, make_server, url_of

    model = tiny_decoder(qkv.load("minilm"))
    start = time.perf_counter()
    sock = bind("127.0.0.1", 0)
    server = make_server(create_app(Api(Models(["tiny"], loader=lambda name: model))), sock,
                         request_timeout=deadline)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    held = []
    try:
        for _ in range(count):
            s = socket.create_connection(sock.getsockname()[:2], timeout=10)
            s.sendall(b"GET /api/info HT")
            held.append(s)
        with httpx.Client(base_url=url_of(sock), timeout=10) as http:
            good = [http.get("api/info").status_code for _ in range(20)]
        answers = []
        for s in held:
            s.settimeout(deadline + 8)
            answers.append(s.recv(64))
    finally:
        for s in held:
            s.close()
        server.should_exit = True
        thread.join(10)
        sock.close()
    timed_out = sum(a.startswith(b"HTTP/1.1 408 ") for a in answers)
    row("slow clients", count + len(good), good.count(200), timed_out, time.perf_counter() - start)
    if good.count(200) != len(good) or timed_out != count:
        print(f"slow clients: FAILED good requests {Counter(good)}, 408s {timed_out} of {count}",
              file=sys.stderr)
        return False
    return True


# -- the causal API --------------------------------------------------------------------------------
def causal_calls(rng: random.Random, lm):
    """(name, thunk) for one random call of each causal function: each argument valid about
    two times in three, else hostile."""
    import torch

    from qkv.explain import ablate, faithfulness, head_effects, patch
    from qkv.explain.long.document import document

    ids = lm.tokenizer.encode("the cat sat on the mat").ids
    texts = ([ids, ids[:2], ids[::-1]],
             [ids[:1], [], "", b"the cat", [1.5, 2.0], [[1, 2], [3, 4]], [10**9], [-1], None, 5,
              "\ud800"])
    heads = ([[], [(0, 0)], [(1, 1), (0, 1)], [[0, 0]]],
             [[(5, 0)], [(0, -1)], None, 5, "0", [(0,)], [(True, 0)], ((0, 0) for _ in range(2))])
    sequences = ([1, 2, 3], [0, -1, 1.5, 10**9, True, None, "2"])
    lengths = ([None, 2, 3], [0, 1, -1, 10**6, 2.5, "2"])
    probes = (["induction", "previous-token", "coref"], ["x", None, 5])
    modes = (["zero", "mean"], ["x", None, 0])
    methods = ([None, ["weight"], ("weight", "norm")], ["weight", [], ["nope"], [1], 5])

    def pick(pool):
        good, bad = pool
        return rng.choice(good) if rng.random() < 0.67 else rng.choice(bad)

    doc = _document_of(lm)
    memory = ([None, 2**34, 10**12], ["x", float("nan"), float("inf"), -1, 0, True, [1]])
    rows = ([[0, 3], range(4), torch.tensor([2, 5])],
            [torch.tensor([1.0, 2.0]), [1.5], torch.tensor([True]), "1", [0] * 10**4, [10**6], None])
    blocks = ([1, 3, 128, len(doc)], [0, -1, 2**31 - 1, 10**12, 1.5, True, None, "8"])
    return [
        ("document", lambda: _Tensor(document(lm, doc.text, memory_limit=pick(memory)).received(0, 0))),
        ("doc.weights", lambda: _Tensor(doc.weights(0, 0, pick(rows)))),
        ("doc.block_map", lambda: _Tensor(doc.block_map(0, 1, block=pick(blocks)))),
        ("ablate", lambda: ablate(lm, pick(texts), heads=pick(heads), mode=pick(modes))),
        ("patch", lambda: patch(lm, pick(texts), pick(texts), heads=pick(heads))),
        ("head_effects", lambda: head_effects(lm, pick(probes), mode=pick(modes),
                                              sequences=pick(sequences), length=pick(lengths))),
        ("faithfulness", lambda: faithfulness(lm, pick((probes[0][:2], probes[1])),
                                              methods=pick(methods), sequences=pick(sequences),
                                              length=pick(lengths))),
    ]


def _document_of(lm):
    from qkv.explain.long.document import document

    return document(lm, lm.tokenizer.decode(list(range(10, 60))))  # 50 of its own words


class _Tensor:
    """A tensor answer, for :func:`numbers_of`."""

    def __init__(self, t):
        self.t = t

    def to_dict(self) -> dict:
        return {"values": self.t.double().flatten().tolist()}


def numbers_of(result) -> list[float]:
    """Every number a result's ``to_dict()`` holds."""
    out, stack = [], [result.to_dict()]
    while stack:
        x = stack.pop()
        if isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, (list, tuple)):
            stack.extend(x)
        elif isinstance(x, float):
            out.append(x)
    return out


def causal(examples: int, seed: int) -> bool:
    import qkv
    import torch

    lm = qkv.load("lm")
    rng, tally, start = random.Random(seed), Counter(), time.perf_counter()
    for _ in range(examples):
        for name, call in causal_calls(rng, lm):
            try:
                with torch.no_grad():
                    result = call()
            except ValueError:
                tally["refused"] += 1
                continue
            except Exception as e:  # noqa: BLE001 — the contract: nothing but ValueError
                print(f"causal: FAILED {name}: {type(e).__name__}: {e}", file=sys.stderr)
                return False
            bad = [x for x in numbers_of(result) if not math.isfinite(x)]
            if bad:
                print(f"causal: FAILED {name} returned {bad[:3]} ({result!r:.200})", file=sys.stderr)
                return False
            tally["answered"] += 1
    row("causal", tally["answered"] + tally["refused"], tally["answered"], tally["refused"],
        time.perf_counter() - start)
    return True


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--examples", type=int, default=300, help="inputs per endpoint / function")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--part", choices=["endpoints", "slow-clients", "causal"], default=None)
    p.add_argument("--slow", type=float, default=10.0, help="the most seconds one answer may take")
    p.add_argument("--rss", type=float, default=512, help="the most MiB the peak may grow by")
    args = p.parse_args()

    import torch

    torch.set_num_threads(1)
    print(f"{'part':<14}{'inputs':>8}{'answered':>10}{'refused':>9}{'seconds':>9}")
    ok = True
    if args.part in (None, "endpoints"):
        ok &= endpoints(args.examples, args.seed, args.slow, args.rss)
    if args.part in (None, "slow-clients"):
        ok &= slow_clients()
    if args.part in (None, "causal"):
        ok &= causal(args.examples, args.seed)
    print("contract held for every input" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
