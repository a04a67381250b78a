"""``qkv view TEXT --html FILE``: the viewer as one self-contained file, no server needed.

The file holds the page (style and script inlined, see :mod:`qkv.view.page`) and the API's
answers for one text, computed here by the same :class:`~qkv.view.api.Api` a server uses, so the
numbers are the ones the server would send. What is included:

* self-attention: the overview of the chosen token; for a short text (at most
  :data:`~qkv.view.api.MAX_WHOLE_MAPS_UNITS` units) also every token's overview, every head's
  map and per-head panels (:data:`HEAD_PANELS`: rows whose ``panel`` is ``"head"``), the step panel of every head for the chosen
  token and of the chosen head for every token, and the model's probe's best heads; for a longer text the chosen head's map and steps only;
* translation: the cross-attention (every head's map), and the step panel of every head for the
  chosen target token and of the chosen head for every target token.

Anything else the page asks for says "not in this exported file" instead of a number.

    >>> from qkv.view.api import Api, Models
    >>> answers, state = collect(Api(Models(["minilm"])), "minilm", "the cat sat", probe=False)
    >>> state["token"], sorted({endpoint for endpoint, _, _ in answers})
    (3, ['maps', 'overview', 'received', 'row_entropy', 'steps'])
"""

from __future__ import annotations

import os

from qkv.explain.kinds import KINDS, METHOD
from qkv.files import atomic_write_text
from qkv.view.api import MAX_WHOLE_MAPS_UNITS, Api, Models
from qkv.view.page import standalone

DEFAULT_METHOD = METHOD.default
# The per-head panels under the head view (the "attention received" panel …): every head's is
# exported for a short text. From the table of result kinds, so a new one comes along.
HEAD_PANELS = tuple(k for k in KINDS.values() if k.panel == "head" and k.needs == "self_attention")


def collect(api: Api, model: str, text: str, *, token: str | int | None = None, layer: int = 0,
            head: int = 0, words: bool = False, probe: bool = True) -> tuple[dict, dict]:
    """([[endpoint, request fields, answer], …], the page's opening state) for ``text`` on
    ``model`` (the page finds an answer by its request; it alone spells the lookup key)."""
    answers: dict = {}  # (endpoint, fields) → [endpoint, fields, answer]: each request once

    def get(endpoint: str, **fields) -> dict:
        fields = {k: v for k, v in fields.items() if v is not None}
        a = api.handle(endpoint, {"model": model, "text": text, **fields})
        answers[(endpoint, tuple(sorted(fields.items())))] = [endpoint, fields, a]
        return a

    token = int(token) if isinstance(token, str) and token.isdigit() else token
    if api.models.get(model).capabilities.cross_attention:
        j = api.handle("cross", {"model": model, "text": text, "token": token})["focus"]  # the library's default
        ca = get("cross", token=j)
        L, H = ca["num_layers"], ca["num_heads"]
        layer, head = min(layer, L - 1), min(head, H - 1)
        # step panels need each head's weights in qkv (a transformers encoder-decoder has none:
        # the page says the answer is missing)
        steps = api.models.get(model).capabilities.head_weights
        for l in range(L if steps else 0):
            for h in range(H):
                get("cross_steps", token=j, layer=l, head=h)
        for i in range(len(ca["target"]) if steps else 0):
            get("cross_steps", token=i, layer=layer, head=head)
        return list(answers.values()), {"token": j, "layer": layer, "head": head, "words": False,
                         "method": DEFAULT_METHOD}

    first = api.handle("overview", {"model": model, "text": text, "token": token, "words": words})
    t = first["unit_index"]
    ov = get("overview", token=t, words=words, method=DEFAULT_METHOD)
    L, H = ov["num_layers"], ov["num_heads"]
    layer, head = min(layer, L - 1), min(head, H - 1)
    short = len(first["tokens"]) <= MAX_WHOLE_MAPS_UNITS
    if short:
        get("maps", words=words)
        for u in range(len(ov["units"])):
            get("overview", token=u, words=words, method=DEFAULT_METHOD)
            get("steps", token=u, layer=layer, head=head, words=words)
        for l in range(L):
            for h in range(H):
                get("steps", token=t, layer=l, head=h, words=words)
                selection = {"token": t, "layer": l, "head": h, "words": words}
                for row in HEAD_PANELS:
                    get(row.endpoint, **{f: selection[f] for f in row.field_names})
        if probe:
            get("probe")
    else:
        get("map", layer=layer, head=head, words=words)
        get("steps", token=t, layer=layer, head=head, words=words)
    return list(answers.values()), {"token": t, "layer": layer, "head": head, "words": words,
                     "method": DEFAULT_METHOD}


def export_html(path: str | os.PathLike, model: str, text: str, *, api: Api | None = None,
                **selection) -> int:
    """Write the self-contained page for ``text`` to ``path`` (atomically); returns its bytes."""
    api = api or Api(Models([model]))
    answers, state = collect(api, model, text, **selection)
    info = api.info()
    info["models"] = [m for m in info["models"] if m["name"] == model]
    page = standalone(answers, model=model, text=text, state=state, info=info)
    atomic_write_text(path, page)
    return len(page.encode())
