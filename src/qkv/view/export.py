"""``qkv view TEXT --html FILE``: the viewer as one self-contained file, no server needed.

The file holds the page (style and script inlined, see :mod:`qkv.view.page`) and the API's
answers for one text, computed here by the same :class:`~qkv.view.api.Api` a server uses, so the
numbers are the ones the server would send. Where the server answers one head per request, the
export asks the library for every head of a token at once (:func:`~qkv.explain.steps.explain_heads`,
:func:`~qkv.explain.cross.cross_attention_heads`: one forward, each head the answer its request
gets; tests/view/test_export.py compares them), so a sentence costs two forwards per token, not
one per head. What is included:

* self-attention: the overview of the chosen token; for a short text (at most
  :data:`~qkv.view.api.MAX_WHOLE_MAPS_UNITS` units) also every token's overview, every head's
  map and per-head panels (:data:`HEAD_PANELS`: rows whose ``panel`` is ``"head"``), the step panel of every head for the chosen
  token and of the chosen head for every token, and the model's probe's best heads; for a longer text the chosen head's map and steps only;
* translation: the cross-attention (every head's map), and the step panel of every head for the
  chosen target token and of the chosen head for every target token.

Anything else the page asks for says "not in this exported file" instead of a number.
:func:`result_page` is the other form: one result alone, drawn by its panel (``qkv why --html``,
a notebook's display).

    >>> from qkv.view.api import Api, Models
    >>> answers, state = collect(Api(Models(["minilm"])), "minilm", "the cat sat", probe=False)
    >>> state["token"], sorted({endpoint for endpoint, _, _ in answers})
    (3, ['maps', 'overview', 'received', 'row_entropy', 'steps'])
"""

from __future__ import annotations

import os
from typing import Callable

from qkv.explain.cross import cross_attention_heads
from qkv.explain.kinds import KINDS, METHOD, kind_of
from qkv.explain.probes import find_heads
from qkv.explain.steps import explain_heads
from qkv.files import atomic_write_text
from qkv.view.answers import answer as answer_of, of_result
from qkv.view.api import MAX_WHOLE_MAPS_UNITS, Api, Models, page_info
from qkv.view.page import standalone

DEFAULT_METHOD = METHOD.default
# The per-head panels under the head view (the "attention received" panel …): every head's is
# exported for a short text. From the table of result kinds, so a new one comes along.
HEAD_PANELS = tuple(k for k in KINDS.values() if k.panel == "head" and k.needs == "self_attention")


def collect(api: Api, model: str, text: str, *, token: str | int | None = None, layer: int = 0,
            head: int = 0, words: bool = False, probe: bool = True,
            progress: Callable[[str, int, int], None] | None = None) -> tuple[list, dict]:
    """([[endpoint, request fields, answer], …], the page's opening state) for ``text`` on
    ``model`` (the page finds an answer by its request; it alone spells the lookup key).

    ``progress(stage, done, total)``: called after each group of answers (``qkv view --html``
    draws it as a bar on a terminal)."""
    answers: dict = {}  # (endpoint, fields) → [endpoint, fields, answer]: each request once
    loaded = api.models.get(model)

    def key(endpoint: str, fields: dict) -> tuple:
        return endpoint, tuple(sorted(fields.items()))

    def get(endpoint: str, **fields) -> dict:
        fields = {k: v for k, v in fields.items() if v is not None}
        if key(endpoint, fields) not in answers:
            a = api.handle(endpoint, {"model": model, "text": text, **fields})
            answers[key(endpoint, fields)] = [endpoint, fields, a]
        return answers[key(endpoint, fields)][2]

    def every_head(endpoint: str, explain_heads: Callable, **fields) -> None:
        """``endpoint``'s answer for every head at one token, from one forward
        (``explain_heads``): each the answer the server gives that head's request."""
        with api.models.lock:
            # the token as the API passes it: a string (an index, a word or word@N)
            results = explain_heads(loaded, text, heads=every, **(fields | {"token": str(fields["token"])}))
        for (l, h), r in zip(every, results, strict=True):  # in the order asked
            one = fields | {"layer": l, "head": h}
            answers[key(endpoint, one)] = [endpoint, one, answer_of(r)]

    def run(work: list[Callable[[], object]]) -> None:
        for done, do in enumerate(work, 1):
            do()
            if progress is not None:
                progress("page", done, len(work))

    token = int(token) if isinstance(token, str) and token.isdigit() else token
    if loaded.capabilities.cross_attention:
        j = api.handle("cross", {"model": model, "text": text, "token": token})["focus"]  # the library's default
        ca = get("cross", token=j)
        L, H = ca["num_layers"], ca["num_heads"]
        layer, head = min(layer, L - 1), min(head, H - 1)
        every = [(l, h) for l in range(L) for h in range(H)]
        # step panels need each head's weights in qkv (a transformers encoder-decoder has none:
        # the page says the answer is missing)
        if loaded.capabilities.head_weights:
            run([lambda: every_head("cross_steps", cross_attention_heads, token=j)]
                + [lambda i=i: get("cross_steps", token=i, layer=layer, head=head)
                   for i in range(len(ca["target"]))])
        return list(answers.values()), {"token": j, "layer": layer, "head": head, "words": False,
                                        "method": DEFAULT_METHOD}

    first = api.handle("overview", {"model": model, "text": text, "token": token, "words": words})
    t = first["unit_index"]
    ov = get("overview", token=t, words=words, method=DEFAULT_METHOD)
    L, H = ov["num_layers"], ov["num_heads"]
    layer, head = min(layer, L - 1), min(head, H - 1)
    # a hybrid's layers that no softmax mixes (the overview's "unscored"): no steps or probe; the
    # page opens on a softmax layer, and asks an effective map per head where a server runs
    unscored = set(ov.get("unscored", {}).get("layers", ()))
    layer = next((l for l in range(layer, L) if l not in unscored), next(l for l in range(L) if l not in unscored))
    probe = probe and not unscored
    every = [(l, h) for l in range(L) if l not in unscored for h in range(H)]
    if len(first["tokens"]) > MAX_WHOLE_MAPS_UNITS:  # a long text: the chosen head only
        get("map", layer=layer, head=head, words=words)
        get("steps", token=t, layer=layer, head=head, words=words)
        return list(answers.values()), {"token": t, "layer": layer, "head": head, "words": words,
                                        "method": DEFAULT_METHOD}

    def best_heads() -> None:
        """The model's probe (the server's ``probe`` answer: ``find_heads.probe(model)``),
        run here to tell its own progress (49 sentences for coref: the page's longest step)."""
        with api.models.lock:
            result = find_heads.probe(loaded, progress=progress)
        answers[key("probe", {})] = ["probe", {}, answer_of(result)]

    def panels(l: int, h: int) -> None:
        selection = {"token": t, "layer": l, "head": h, "words": words}
        for row in HEAD_PANELS:
            get(row.endpoint, **{f: selection[f] for f in row.field_names})

    units = range(len(ov["units"]))
    run([lambda: get("maps", words=words),
         lambda: every_head("steps", explain_heads, token=t, words=words)]
        + [lambda u=u: get("overview", token=u, words=words, method=DEFAULT_METHOD) for u in units]
        + [lambda u=u: get("steps", token=u, layer=layer, head=head, words=words) for u in units]
        + [lambda lh=lh: panels(*lh) for lh in every]
        + ([best_heads] if probe else []))
    return list(answers.values()), {"token": t, "layer": layer, "head": head, "words": words,
                                    "method": DEFAULT_METHOD}


def result_page(result) -> str:
    """One :mod:`qkv.explain` result alone as a self-contained page (its row's panel,
    ``PANELS[kind]``, draws its numbers; nothing else is in it): ``qkv why --html``, and a
    notebook's display in an iframe (:mod:`qkv.view.notebook`)."""
    endpoint, fields, answer = of_result(result)
    row = kind_of(result)
    text, model = answer.get("text") or "", answer.get("model") or ""
    state = {k: v for k, v in fields.items() if v is not None} | {"view": row.name}
    # what the page knows of a model it cannot ask: the capability the result needed
    caps = {"self_attention": False, "cross_attention": False, row.needs: True}
    info = page_info([{"name": model, "capabilities": caps, "methods": [], "probes": []}])
    return standalone([[endpoint, fields, answer]], model=model, text=text, state=state, info=info)


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
