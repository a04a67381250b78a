"""docs/architecture.md's recipe for a new result kind, followed once at test size.

The kind: each token's final vector's length (a per-token quantity with a forward of its own).
What the recipe asks for is written here as it would be in the tree — the result and its
function (``explain/<name>.py``) and its row (``explain/kinds.py``) — and nothing else: the CLI
shows it (``qkv show``, its JSON and its table), the viewer's API answers it and the ``--html``
export runs it once per text, without a line of theirs changed. (The third file of the recipe,
the page's ``PANELS[name]`` in ``view/static/app.js``, draws ``to_dict()``; a page test is the
viewer's.)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch

from qkv.cli import main


# -- file 1: explain/token_norms.py ------------------------------------------------------------------
@dataclass(frozen=True)
class TokenNorms:
    """The length of each token's vector after the last layer: ``norms`` (t,) float64."""

    kind: ClassVar[str] = "token-norms"  # its row in qkv.explain.kinds.KINDS

    model: str
    text: str
    tokens: list[str]
    norms: torch.Tensor  # (t,)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "model": self.model, "text": self.text, "tokens": self.tokens,
                "norms": self.norms.tolist()}


def token_norms(model, text: str) -> TokenNorms:
    """One forward of ``text``; each token's last-layer vector's L2 norm, in float64."""
    from qkv.explain.forward import encode

    enc = encode(model, text)
    ids = torch.tensor([enc.ids])  # (1, t)
    with torch.no_grad():
        hidden = model(ids, torch.ones_like(ids)).last_hidden_state[0]  # (t, E)
    return TokenNorms(model.name, text, list(enc.tokens), hidden.double().norm(dim=-1))


# -- file 2: its row of explain/kinds.py ---------------------------------------------------------------
@pytest.fixture
def row(monkeypatch):
    from qkv.explain import kinds
    from qkv.view import api

    row = kinds.ResultKind("token-norms", "self_attention", "", "token_norms", token_norms, (),
                           lambda r: {}, result=TokenNorms, panel="head", export="text")
    monkeypatch.setitem(kinds.KINDS, row.name, row)  # what adding the line to KINDS does
    # the API's index of KINDS, made when it is imported (adding the line to KINDS makes it there)
    monkeypatch.setitem(api.ROWS, row.endpoint, row)
    monkeypatch.setattr(api, "ENDPOINTS", (*api.ENDPOINTS, row.endpoint))
    monkeypatch.setitem(api.FIELDS, row.endpoint, set(row.field_names))
    return row


TEXT = "the cat sat on the mat"


def reference(text: str) -> list[float]:
    """The same numbers from the model's own forward, computed here in float64 from its output."""
    import qkv

    model = qkv.load("minilm")
    ids = torch.tensor([model.tokenizer.encode(text).ids])
    with torch.no_grad():
        return model(ids, torch.ones_like(ids)).last_hidden_state[0].double().norm(dim=-1).tolist()


def test_the_cli_shows_the_new_kind_by_its_row(row, capsys):
    assert main(["show", "token-norms", TEXT, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["kind"] == "token-norms" and out["norms"] == reference(TEXT)  # one forward, same numbers
    assert main(["show", "token-norms", TEXT]) == 0  # no table in its row: its JSON
    assert json.loads(capsys.readouterr().out)["tokens"][0] == "[CLS]"
    assert main(["show", "token-norms", TEXT, "--layer", "1"]) == 2  # a field it does not take
    assert "--layer is not a field of token-norms" in capsys.readouterr().err


def test_the_viewer_and_the_export_answer_it_by_its_row(row):
    from qkv.view.api import Api, Models
    from qkv.view.export import collect

    api = Api(Models(["minilm"]))
    answer = api.handle("token_norms", {"model": "minilm", "text": TEXT})
    assert answer["kind"] == "token-norms" and answer["norms"] == reference(TEXT)
    assert "token-norms" in api.info()["kinds"]  # the page is told of it
    answers, _ = collect(api, "minilm", TEXT, probe=False)
    asked = [fields for endpoint, fields, _ in answers if endpoint == "token_norms"]
    assert asked == [{}]  # export="text": once for the text, not once per head


def test_a_row_that_would_run_a_forward_per_head_is_refused():
    from qkv.explain.kinds import ResultKind

    with pytest.raises(ValueError, match="'head' only for a from_map row"):
        ResultKind("token-norms", "self_attention", "", "token_norms", token_norms, export="head")
