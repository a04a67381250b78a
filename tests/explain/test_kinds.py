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
        assert FIELDS[endpoint] == set(rows[0].field_names)


def test_every_row_names_a_capability_and_a_printer_that_exist():
    import importlib

    from qkv.models.protocol import Capabilities

    for row in KINDS.values():
        assert row.needs in Capabilities.__dataclass_fields__, row.name
        if row.render:
            module, _, name = row.render.partition(":")
            assert callable(getattr(importlib.import_module(module), name)), row.render


def test_every_result_class_has_a_row():
    """A class of qkv.explain with a ``kind`` and a ``to_dict`` is a result: the table has its row
    (kind_of would raise for it, and the CLI, the API and the notebook could not read it)."""
    import importlib
    import inspect
    import pkgutil

    kinds = {}
    for info in pkgutil.walk_packages(qkv.explain.__path__, "qkv.explain."):
        module = importlib.import_module(info.name)
        for name, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == info.name and isinstance(getattr(cls, "kind", None), str) \
                    and callable(getattr(cls, "to_dict", None)):
                kinds[f"{info.name}.{name}"] = cls.kind
    assert "qkv.explain.causal.head_effects.HeadEffects" in kinds  # the walk finds the results
    assert {c: k for c, k in kinds.items() if k not in KINDS} == {}


def test_the_causal_results_are_complete_and_read_through_their_rows():
    """ablate, patch, head_effects, faithfulness (issue 22): ``to_dict()`` carries the kind and
    every field; the viewer asks head effects again from the row's request."""
    import dataclasses

    import qkv
    from qkv.explain import ablate, faithfulness, head_effects, patch
    from qkv.explain.kinds import kind_of
    from qkv.view import answers

    lm = qkv.load("lm")
    a = ablate(lm, "baka bela dima fona", heads=[(1, 0)])
    p = patch(lm, "baka bela dima fona", "baka bela doka fona", heads=[(0, 1)])
    e = head_effects(lm, "previous-token", sequences=2)
    f = faithfulness(lm, "previous-token", methods=["weight", "rollout"], sequences=2)
    renamed = {"Ablation": {"logits": "logits"},  # a decoder: logits, no hidden state
               "Faithfulness": {"scores": "methods", "per": "methods", "spearman": "methods"}}
    for result in (a, p, e, f):
        d = result.to_dict()
        assert d["kind"] == result.kind and kind_of(result).name == result.kind
        names = renamed.get(type(result).__name__, {})
        for field in dataclasses.fields(result):
            if getattr(result, field.name) is not None:
                assert names.get(field.name, field.name) in d, (result.kind, field.name)
    assert f.to_dict()["clean"] == e.to_dict()["clean"] or f.effects.sequences == 2
    assert {k for k in e.to_dict() if k != "kind"} <= set(f.to_dict())  # the effects' fields, once
    assert answers.of_result(e) == ("effects", {"probe": "previous-token"}, e.to_dict())
