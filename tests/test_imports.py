"""Importing qkv changes nothing in the process, and its modules import each other without cycles.

Side effects are measured in fresh interpreters (``sys.executable -c``), since this test process
has long since imported everything. Three of them, started with the same environment:

* **qkv**: snapshot the process state, import ``qkv``, ``qkv.explain``, ``qkv.translate``,
  ``qkv.cli`` and every module under ``src/qkv``, snapshot again.
* **bare**: import only what the snapshot itself needs (torch, numpy, matplotlib), snapshot.
* **deps**: import every non-qkv module the qkv process ended up with, in the same order, snapshot.

The umask, torch's thread count and matplotlib's backend must be those of the *bare* process:
qkv may not set them, whatever it imports. ``matplotlib.get_backend()`` resolves the backend
(it may pick one and import pyplot), so it is called only after the last snapshot, in both
processes; the raw ``rcParams`` entry is compared before that. The rest of the state (RNGs,
environment, warning filters, …) must be that of the *deps* process: importing a library is not
qkv's doing, but anything qkv's own module code does at import is. (So a library that changes
state when imported is not caught: ``rich.style`` draws from Python's global RNG, and only
importing rich lazily would spare qkv's callers that.) Calls that set process state from qkv's own
code are caught even when the old value is put back at once. qkv's registries must hold the same
keys after everything is imported as right after their defining module was.

The import graph is read from the source with :mod:`ast`, so it includes imports inside functions
(``def f(): from qkv.x import y``): a lazy import hides a dependency from the import machinery,
not from the design.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
from collections import deque
from pathlib import Path

import pytest

import qkv

SOURCE = Path(qkv.__file__).resolve().parent  # src/qkv

# (module, attribute) of every name → implementation table that qkv fills as it imports.
REGISTRIES = (("qkv.attention.backends", "BACKENDS"), ("qkv.models.registry", "FAMILIES"),
              ("qkv.models.protocol", "MIXER_KINDS"), ("qkv.hf.mixers", "RECOGNISERS"),
              ("qkv.explain.contributions", "METHODS"))

# A package's __main__ runs the program when imported (``python -m qkv``); it is a script, not a
# module to import.
SCRIPTS = {"qkv.__main__"}


def module_name(path: Path, root: Path = SOURCE) -> str:
    """``src/qkv/a/b.py`` → ``qkv.a.b``; ``src/qkv/a/__init__.py`` → ``qkv.a``."""
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def qkv_modules(root: Path = SOURCE) -> dict[str, Path]:
    """Every module under ``root`` (src/qkv), by dotted name."""
    return {module_name(p, root): p for p in sorted(root.rglob("*.py"))}


# --------------------------------------------------------------------------------------------
# Side effects
# --------------------------------------------------------------------------------------------

# Prints {"before": state, "after": state, "backend": get_backend(), "registries": …, "modules": […]}
# for one of the three processes (argv[1] = "qkv" | "bare" | "deps"; argv[2] = a JSON list of
# modules to import).
PROBE = r'''
import hashlib, importlib, json, locale, logging, os, random, signal, sys, warnings

import matplotlib, numpy, torch

# Seeded, so that the RNG states of two processes are comparable.
random.seed(0); numpy.random.seed(0); torch.manual_seed(0)


def digest(x):
    return hashlib.sha256(repr(x).encode()).hexdigest()[:16]


def backend():
    """rcParams["backend"] without resolving it (reading it the usual way may pick one)."""
    raw = matplotlib.rcParams._get("backend")
    return "auto, not chosen yet" if raw is matplotlib.rcsetup._auto_backend_sentinel else str(raw)


def snapshot():
    umask = os.umask(0o022)  # the only way to read the umask is to set it: put it back at once
    os.umask(umask)
    rc = matplotlib.rcParams
    return {
        "umask": oct(umask),
        "torch.get_num_threads()": torch.get_num_threads(),
        "matplotlib backend (raw rcParams)": backend(),
        "torch.get_num_interop_threads()": torch.get_num_interop_threads(),
        "torch.get_default_dtype()": str(torch.get_default_dtype()),
        "torch RNG": digest(torch.get_rng_state().tolist()),
        "torch.are_deterministic_algorithms_enabled()": torch.are_deterministic_algorithms_enabled(),
        "torch.is_grad_enabled()": torch.is_grad_enabled(),
        "torch.get_float32_matmul_precision()": torch.get_float32_matmul_precision(),
        "torch print options": repr(vars(torch._tensor_str.PRINT_OPTS)),
        "python RNG": digest(random.getstate()),
        "numpy RNG": digest(numpy.random.get_state()[1].tolist()),
        "numpy.geterr()": numpy.geterr(),
        "numpy print options": repr(numpy.get_printoptions()),
        "matplotlib rcParams (but backend)": digest({k: rc._get(k) for k in rc if k != "backend"}),
        "os.environ": dict(os.environ),
        "os.getcwd()": os.getcwd(),
        "warnings.filters": [repr(f) for f in warnings.filters],
        "logging root": [logging.root.level, len(logging.root.handlers)],
        "signal handlers": {s: repr(signal.getsignal(getattr(signal, s)))
                            for s in ("SIGINT", "SIGTERM", "SIGPIPE")},
        "locale": locale.setlocale(locale.LC_ALL),  # no second argument: reads, sets nothing
        "sys.excepthook, sys.displayhook": [repr(sys.excepthook), repr(sys.displayhook)],
        "sys.getrecursionlimit()": sys.getrecursionlimit(),
    }


def registries(names):
    out = {}
    for module, attr in names:
        try:
            table = getattr(importlib.import_module(module), attr, None)
        except ModuleNotFoundError:
            table = None
        out[f"{module}.{attr}"] = None if table is None else sorted(table)
    return out


# Functions that set process state. A call from qkv's own code during import is recorded even if
# the state is put back at once (reading the umask by setting it races with other threads).
SETTERS = {
    os: ("umask", "chdir", "putenv", "unsetenv"),
    torch: ("set_num_threads", "set_num_interop_threads", "set_default_dtype", "set_default_device",
            "manual_seed", "seed", "use_deterministic_algorithms", "set_float32_matmul_precision",
            "set_printoptions"),
    numpy: ("seterr", "set_printoptions"),
    numpy.random: ("seed",),
    random: ("seed",),
    matplotlib: ("use",),
    warnings: ("filterwarnings", "simplefilter"),
    logging: ("basicConfig",),
    signal: ("signal",),
    sys: ("setrecursionlimit",),
    locale: ("setlocale",),
}
calls = []


def watch(module, name):
    original = getattr(module, name)

    def watched(*args, **kwargs):
        caller = sys._getframe(1)
        where = caller.f_globals.get("__name__", "")
        if where == "qkv" or where.startswith("qkv."):
            calls.append(f"{module.__name__}.{name}() from {where}, line {caller.f_lineno}")
        return original(*args, **kwargs)

    setattr(module, name, watched)


kind, modules, registry_names = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
before, loaded = snapshot(), set(sys.modules)
if kind == "qkv":
    for module, names in SETTERS.items():
        for name in names:
            watch(module, name)
first = registries(registry_names) if kind == "qkv" else {}
for name in modules:
    try:
        importlib.import_module(name)
    except Exception:
        if kind == "qkv":
            raise
        # deps: a few entries of sys.modules are not importable by name (aliases, shims).
after = snapshot()
print(json.dumps({
    "before": before, "after": after, "backend": matplotlib.get_backend(),
    "registries": [first, registries(registry_names) if kind == "qkv" else {}], "calls": calls,
    "modules": [m for m in sys.modules if m not in loaded and m.split(".")[0] != "qkv"],
}))
'''

# Must equal the bare process: qkv may not set these, whatever it imports.
STRICT = ("umask", "torch.get_num_threads()", "matplotlib backend (raw rcParams)")


def probe(kind: str, modules: list[str], cwd: Path) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", PROBE, kind, json.dumps(modules), json.dumps(REGISTRIES)],
        cwd=cwd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"the {kind} probe failed:\n{result.stderr[-3000:]}"
    return json.loads(result.stdout)


def differences(got: dict, expected: dict, keys) -> list[str]:
    return [f"{k}: {expected[k]!r} → {got[k]!r}" for k in keys if got[k] != expected[k]]


@pytest.fixture(scope="module")
def probes(tmp_path_factory) -> dict[str, dict]:
    cwd = tmp_path_factory.mktemp("probe")  # not the repository: nothing imports from the cwd
    names = ["qkv", "qkv.explain", "qkv.translate", "qkv.cli"]
    names += [m for m in qkv_modules() if m not in SCRIPTS and m not in names]
    with_qkv = probe("qkv", names, cwd)
    return {"qkv": with_qkv, "bare": probe("bare", [], cwd),
            "deps": probe("deps", with_qkv["modules"], cwd)}


def test_importing_qkv_sets_no_umask_thread_count_or_backend(probes):
    qkv_run, bare = probes["qkv"], probes["bare"]
    assert not differences(qkv_run["before"], bare["after"], STRICT), "the two probes started apart"
    changed = differences(qkv_run["after"], bare["after"], STRICT)
    if qkv_run["backend"] != bare["backend"]:
        changed.append(f"matplotlib.get_backend(): {bare['backend']!r} → {qkv_run['backend']!r}")
    assert not changed, "importing qkv changed: " + "; ".join(changed)


def test_qkv_calls_no_state_setter_while_imported(probes):
    """Even a setting put back at once (``os.umask(0); os.umask(old)``) is a change while it lasts."""
    assert not probes["qkv"]["calls"], "qkv code called, at import: " + "; ".join(probes["qkv"]["calls"])


def test_importing_qkv_changes_no_other_process_state(probes):
    """Everything in the snapshot, against a process that imported the same libraries without qkv."""
    qkv_run, deps = probes["qkv"], probes["deps"]
    keys = [k for k in qkv_run["after"] if k not in STRICT]
    assert not differences(qkv_run["before"], deps["before"], keys), "the two probes started apart"
    changed = differences(qkv_run["after"], deps["after"], keys)
    assert not changed, "importing qkv (beyond importing its dependencies) changed: " + "; ".join(changed)


def test_importing_every_module_registers_nothing_new(probes):
    first, last = probes["qkv"]["registries"]
    missing = [name for name, keys in first.items() if keys is None]
    assert not missing, f"registries not found (update REGISTRIES in {Path(__file__).name}): {missing}"
    grown = {name: sorted(set(last[name]) - set(keys)) for name, keys in first.items() if last[name] != keys}
    assert not grown, f"importing other qkv modules added registry entries: {grown}"


# --------------------------------------------------------------------------------------------
# Import cycles
# --------------------------------------------------------------------------------------------


def imports_of(path: Path, name: str, known: set[str]) -> dict[str, int]:
    """The qkv modules that module ``name`` (at ``path``) imports, with the line of the first import.

    Every ``import``/``from … import`` counts, at any depth (functions, ``if`` blocks, ``try``).
    ``from qkv.a import b`` is an edge to ``qkv.a.b`` when that is a module, else to ``qkv.a``;
    relative imports are resolved against ``name``'s package.
    """
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    edges: dict[str, int] = {}

    def add(target: str, line: int) -> None:
        if target != name and (target == "qkv" or target.startswith("qkv.")):
            edges.setdefault(target, line)

    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                add(sub if sub in known else source, node.lineno)
    return edges


def import_graph() -> tuple[dict[str, dict[str, int]], dict[str, Path]]:
    modules = qkv_modules()
    known = set(modules)
    graph = {name: imports_of(path, name, known) for name, path in modules.items()}
    unknown = {f"{m} → {t}" for m, edges in graph.items() for t in edges if t not in known}
    assert not unknown, f"imports of qkv modules that do not exist: {sorted(unknown)}"
    return graph, modules


def strongly_connected(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one module (each one has a cycle)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def shortest_cycle(graph: dict[str, dict[str, int]], component: list[str]) -> list[str]:
    """The shortest cycle through the component's first module, staying inside the component."""
    start, inside = component[0], set(component)
    parent: dict[str, str] = {}
    queue = deque([start])
    while queue:
        v = queue.popleft()
        for w in sorted(graph[v]):
            if w not in inside:
                continue
            if w == start:
                path = [v]  # v, its BFS parent, …, start
                while path[-1] != start:
                    path.append(parent[path[-1]])
                return [start, *reversed(path[:-1]), start]
            if w not in parent:
                parent[w] = v
                queue.append(w)
    raise AssertionError(f"no cycle through {start} in {component}")  # Tarjan said there is one


def describe(cycle: list[str], graph: dict[str, dict[str, int]], modules: dict[str, Path],
             root: Path = SOURCE) -> str:
    """``a → b → a`` and, for each step, the file and line of the import that makes it."""
    steps = [f"{a} → {b} ({modules[a].relative_to(root.parent)}:{graph[a][b]})"
             for a, b in zip(cycle, cycle[1:])]
    return " → ".join(cycle) + "\n      " + "\n      ".join(steps)


def _made_up_package(tmp_path: Path) -> Path:
    """A package qkv with a subpackage a (a/b.py) and a module c.py, all empty: the parsers' tests
    write the module under test into it."""
    root = tmp_path / "qkv"
    (root / "a").mkdir(parents=True)
    for f in ("__init__.py", "a/__init__.py", "a/b.py", "c.py"):
        (root / f).write_text("")
    return root


def test_imports_of_finds_every_kind_of_import(tmp_path):
    """The parser itself, on a made-up package: nested, relative, and package-or-module targets."""
    root = _made_up_package(tmp_path)
    (root / "a" / "x.py").write_text(
        "import os\n"
        "from qkv.a import b, helper\n"           # module qkv.a.b; qkv.a for a plain name
        "def f():\n"
        "    from . import b as again\n"          # relative, inside a function
        "    from ..c import thing\n"             # relative, two levels: qkv.c
        "if True:\n"
        "    import qkv.c\n")
    known = set(qkv_modules(root))
    assert known == {"qkv", "qkv.a", "qkv.a.b", "qkv.a.x", "qkv.c"}
    assert imports_of(root / "a" / "x.py", "qkv.a.x", known) == {"qkv.a.b": 2, "qkv.a": 2, "qkv.c": 5}


def test_cycle_finder_names_the_cycle():
    graph = {"qkv.a": {"qkv.b": 1}, "qkv.b": {"qkv.c": 2}, "qkv.c": {"qkv.a": 3, "qkv.d": 4}, "qkv.d": {}}
    assert strongly_connected(graph) == [["qkv.a", "qkv.b", "qkv.c"]]
    assert shortest_cycle(graph, ["qkv.a", "qkv.b", "qkv.c"]) == ["qkv.a", "qkv.b", "qkv.c", "qkv.a"]
    assert strongly_connected({"qkv.a": {"qkv.b": 1}, "qkv.b": {}}) == []


def test_qkv_modules_import_each_other_without_cycles():
    graph, modules = import_graph()
    cycles = [describe(shortest_cycle(graph, c), graph, modules) for c in strongly_connected(graph)]
    assert not cycles, (f"{len(cycles)} import cycle(s) among qkv modules (counting imports inside "
                        f"functions; file:line of each import):\n  " + "\n  ".join(cycles))


# -- no module uses another package's private names ---------------------------------------------
# torch.ops.<namespace>.<operator> is torch's public operator registry; ATen's names for operators
# without a Python function begin with "_" by convention (attention/flash_cpu.py is the one wrapper
# of the fused CPU kernel, which returns the lse that torch's public sdpa does not).
OPERATOR_REGISTRY = "torch.ops."


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _package(module: str, path: Path) -> str:
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def _is_module(name: str, modules: dict[str, Path]) -> bool:
    if name.split(".")[0] == "qkv":
        return name in modules
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent that is not a package
        return False


def private_uses(path: Path, module: str, modules: dict[str, Path]) -> list[str]:
    """``file:line: name`` for each private name of another package that `path` imports
    (``from x import _y``) or reads off an imported module (``x._y``, ``x.z._y``). A private name
    is another package's when the module it comes from lies outside the importer's own package
    (its folder): qkv's subpackages count as packages of their own."""
    tree = ast.parse(path.read_text(), filename=str(path))
    own, found, bound = _package(module, path), [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                bound[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = own.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            source = base if base.split(".")[0] != "qkv" else _package(base, modules.get(base, Path("x.py")))
            for a in node.names:
                if _private(a.name) and source != own:
                    found.append(f"{path.name}:{node.lineno}: from {base} import {a.name}")
                elif _is_module(f"{base}.{a.name}", modules):
                    bound[a.asname or a.name] = f"{base}.{a.name}"
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and _private(node.attr)):
            continue
        chain, value = [], node.value
        while isinstance(value, ast.Attribute):
            chain.append(value.attr)
            value = value.value
        if isinstance(value, ast.Name) and value.id in bound:
            owner = ".".join([bound[value.id], *reversed(chain)])
            if not (owner + ".").startswith(OPERATOR_REGISTRY) and owner != own:
                found.append(f"{path.name}:{node.lineno}: {owner}.{node.attr}")
    return found


def test_private_use_finder_finds_each_form(tmp_path):
    root = _made_up_package(tmp_path)
    (root / "a" / "x.py").write_text(
        "import os\n"
        "from qkv.a.b import _mine\n"            # the same package (qkv.a): allowed
        "from qkv.c import _theirs\n"            # qkv.c lies in qkv, not qkv.a
        "from ..c import _too\n"                 # the same, relative
        "from qkv import c\n"
        "import torch\n"
        "x = (c._attr, os._exit, os.__name__, torch.ops.aten._op)\n")
    modules = qkv_modules(root)
    assert private_uses(root / "a" / "x.py", "qkv.a.x", modules) == [
        "x.py:3: from qkv.c import _theirs", "x.py:4: from qkv.c import _too",
        "x.py:7: qkv.c._attr", "x.py:7: os._exit"]


def test_no_module_uses_another_packages_private_names():
    modules = qkv_modules()
    found = [use for name, path in modules.items() for use in private_uses(path, name, modules)]
    assert not found, "private names of another package:\n  " + "\n  ".join(found)
