"""The one table of result kinds, and the direction of the dependencies around it: the library
knows nothing of the viewer or the CLI; they read the table."""

from __future__ import annotations

import ast
from pathlib import Path

import qkv.explain
from qkv.explain.kinds import KINDS

EXPLAIN = Path(qkv.explain.__file__).resolve().parent


def imported_modules(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
    return out


def test_explain_imports_neither_view_nor_cli():
    offenders = {str(p.relative_to(EXPLAIN)): sorted(m for m in imported_modules(p)
                                                     if m.startswith(("qkv.view", "qkv.cli")))
                 for p in EXPLAIN.rglob("*.py")}
    assert not {k: v for k, v in offenders.items() if v}


def test_the_api_serves_exactly_the_tables_endpoints():
    from qkv.view.api import ENDPOINTS, FIELDS

    assert set(ENDPOINTS) == {k.endpoint for k in KINDS.values() if k.endpoint}
    for endpoint in ENDPOINTS:
        rows = [k for k in KINDS.values() if k.endpoint == endpoint and (k.run or k.name == endpoint)]
        assert FIELDS[endpoint] == set(rows[0].fields)


def test_every_row_names_a_capability_and_a_printer_that_exist():
    import importlib

    from qkv.models.protocol import Capabilities

    for row in KINDS.values():
        assert row.needs in Capabilities.__dataclass_fields__, row.name
        if row.render:
            module, _, name = row.render.partition(":")
            assert callable(getattr(importlib.import_module(module), name)), row.render
