"""`qkv view TEXT --html FILE`: the viewer as one self-contained file, no server needed.

The file holds the page (style and script inlined, see `qkv.view.page`) and the API's
answers for one text, computed here by the same `Api` a server uses, so the
numbers are the ones the server would send. Where the server answers one head per request, the
export asks the library for every head of a token at once
([`explain_heads`][qkv.explain.steps.explain_heads],
[`cross_attention_heads`][qkv.explain.cross.cross_attention_heads]: one forward, each head the
answer its request gets; tests/view/test_export.py compares them), so a sentence costs two forwards
per token, not one per head. What is included:

* self-attention: the overview of the chosen token; for a short text (one whose every map fits
  the page: [`whole_maps_fit`][qkv.explain.cost.whole_maps_fit]) also every token's overview, every head's
  map, the step panel of every head for the chosen token and of the chosen head for every token,
  the model's probe's best heads, and each row of the kinds table with an `export` rule
  (`exported_rows`) run as its rule says — once for the text, once per layer or once per head
  (per head only for rows answered from the maps, so the forwards stay a few per token); for a
  longer text the chosen head's map and steps only;
* translation: the cross-attention (every head's map), and the step panel of every head for the
  chosen target token and of the chosen head for every target token.

Anything else the page asks for says "not in this exported file" instead of a number.
`result_page` is the other form: one result alone, drawn by its panel (`qkv why --html`,
a notebook's display).

Examples:
    >>> from qkv.view.api import Api, Models
    >>> answers, state = collect(Api(Models(["minilm"])), "minilm", "the cat sat", probe=False)
    >>> state["token"], sorted({endpoint for endpoint, _, _ in answers})
    (3, ['maps', 'overview', 'received', 'row_entropy', 'steps'])
"""

from __future__ import annotations

import os
from typing import Callable

from qkv.explain.cost import whole_maps_fit
from qkv.explain.cross import cross_attention_heads
from qkv.explain.kinds import KINDS, METHOD, kind_of
from qkv.explain.probes import find_heads
from qkv.explain.steps import explain_heads
from qkv.files import atomic_write_text
from qkv.view.answers import answer as answer_of, of_result
from qkv.view.api import Api, Models, page_info
from qkv.view.page import standalone

DEFAULT_METHOD = METHOD.default


def exported_rows() -> list:
    """The rows the export runs besides the page's main answers (the "attention received" panel
    …), each as its `export` says: read from the table of result kinds when the export runs,
    so a new row comes along."""
    return [k for k in KINDS.values() if k.export and k.endpoint and k.needs == "self_attention"]


def places(export: str, every: list[tuple[int, int]], layer: int, head: int) -> list[tuple[int, int]]:
    """The (layer, head) selections a row is run at by its `export` rule: the chosen head
    alone (`"text"`: the request has no layer or head, or the page's own), the chosen head of
    every layer (`"layer"`), or every head (`"head"`).

    Examples:
        >>> places("layer", [(0, 0), (0, 1), (1, 0), (1, 1)], 1, 1)
        [(0, 1), (1, 1)]
    """
    if export == "text":
        return [(layer, head)]
    if export == "layer":
        return sorted({(l, head) for l, _ in every})
    return list(every)


class _Answers:
    """The export's answers, each request asked once, in the order asked: `[endpoint, request
    fields, answer]` by the request (the page finds an answer by its request; `_key` alone
    spells the lookup key). `progress(stage, done, total)` is told after each piece of work."""

    def __init__(self, api: Api, model: str, text: str,
                 progress: Callable[[str, int, int], None] | None):
        self.api, self.model, self.text, self.progress = api, model, text, progress
        self.loaded = api.models.get(model)
        self._by_request: dict = {}  # (endpoint, fields) → [endpoint, fields, answer]

    @staticmethod
    def _key(endpoint: str, fields: dict) -> tuple:
        return endpoint, tuple(sorted(fields.items()))

    def rows(self) -> list:
        return list(self._by_request.values())

    def ask(self, endpoint: str, **fields) -> dict:
        """The API's answer to `endpoint` with `fields` (those given as `None` left out)."""
        fields = {k: v for k, v in fields.items() if v is not None}
        if self._key(endpoint, fields) not in self._by_request:
            self.put(endpoint, fields,
                     self.api.handle(endpoint, {"model": self.model, "text": self.text, **fields}))
        return self._by_request[self._key(endpoint, fields)][2]

    def put(self, endpoint: str, fields: dict, answer: dict) -> None:
        self._by_request[self._key(endpoint, fields)] = [endpoint, fields, answer]

    def every_head(self, endpoint: str, explain_heads: Callable, every: list[tuple[int, int]],
                   **fields) -> None:
        """`endpoint`'s answer for every (layer, head) of `every` at one token, from one
        forward (`explain_heads`): each the answer the server gives that head's request."""
        with self.api.models.lock:
            # the token as the API passes it: a string (an index, a word or word@N)
            results = explain_heads(self.loaded, self.text, heads=every,
                                    **(fields | {"token": str(fields["token"])}))
        for (l, h), r in zip(every, results, strict=True):  # in the order asked
            self.put(endpoint, fields | {"layer": l, "head": h}, answer_of(r))

    def best_heads(self) -> None:
        """The model's probe (the server's `probe` answer: `find_heads.probe(model)`), run
        here to tell its own progress (49 sentences for coref: the page's longest step)."""
        with self.api.models.lock:
            result = find_heads.probe(self.loaded, progress=self.progress)
        self.put("probe", {}, answer_of(result))

    def run(self, work: list[Callable[[], object]]) -> None:
        for done, do in enumerate(work, 1):
            do()
            if self.progress is not None:
                self.progress("page", done, len(work))


def _heads(answer: dict, layer: int, head: int) -> tuple[int, int, list[tuple[int, int]]]:
    """The chosen (layer, head) kept within the model's, and every (layer, head) of the model,
    from an answer that names `num_layers` and `num_heads`."""
    L, H = answer["num_layers"], answer["num_heads"]
    return min(layer, L - 1), min(head, H - 1), [(l, h) for l in range(L) for h in range(H)]


def _translation(answers: _Answers, token, layer: int, head: int) -> dict:
    """A translation's answers (the page's opening state returned): 1) the cross-attention of
    the target token the library picks (every head's map), 2) the step panel of every head at
    that token and 3) of the chosen head at every target token."""
    j = answers.api.handle("cross", {"model": answers.model, "text": answers.text,
                                     "token": token})["focus"]  # the library's default
    cross = answers.ask("cross", token=j)  # 1
    layer, head, every = _heads(cross, layer, head)
    # step panels need each head's weights in qkv (a transformers encoder-decoder has none: the
    # page says the answer is missing)
    if answers.loaded.capabilities.head_weights:
        answers.run([lambda: answers.every_head("cross_steps", cross_attention_heads, every,
                                                token=j)]  # 2
                    + [lambda i=i: answers.ask("cross_steps", token=i, layer=layer, head=head)
                       for i in range(len(cross["target"]))])  # 3
    return {"token": j, "layer": layer, "head": head, "words": False, "method": DEFAULT_METHOD}


def _self_attention(answers: _Answers, token, layer: int, head: int, words: bool,
                    probe: bool) -> dict:
    """A text's self-attention answers (the page's opening state returned): 1) the overview of
    the chosen token; for a long text 2) the chosen head's map and steps only; for a short one
    3) every head's map, 4) the steps of every head at the chosen token, 5) every token's
    overview, 6) the chosen head's steps at every token, 7) each exported row by its rule and
    8) the model's probe's best heads."""
    first = answers.api.handle("overview", {"model": answers.model, "text": answers.text,
                                            "token": token, "words": words})
    t = first["unit_index"]
    overview = answers.ask("overview", token=t, words=words, method=DEFAULT_METHOD)  # 1
    layer, head, every = _heads(overview, layer, head)
    # a hybrid's layers that no softmax mixes (the overview's "unscored"): no steps or probe; the
    # page opens on a softmax layer, and asks an effective map per head where a server runs
    unscored = set(overview.get("unscored", {}).get("layers", ()))
    if unscored:
        mixed = [l for l in range(overview["num_layers"]) if l not in unscored]
        layer = next((l for l in mixed if l >= layer), mixed[0])
        every, probe = [(l, h) for l, h in every if l not in unscored], False
    state = {"token": t, "layer": layer, "head": head, "words": words, "method": DEFAULT_METHOD}
    if not whole_maps_fit(answers.loaded, len(first["tokens"])):  # 2
        answers.ask("map", layer=layer, head=head, words=words)
        answers.ask("steps", token=t, layer=layer, head=head, words=words)
        return state

    def exported(row, l: int, h: int) -> None:
        selection = state | {"layer": l, "head": h}
        answers.ask(row.endpoint, **{f: selection.get(f) for f in row.field_names})

    units = range(len(overview["units"]))
    answers.run(
        [lambda: answers.ask("maps", words=words),  # 3
         lambda: answers.every_head("steps", explain_heads, every, token=t, words=words)]  # 4
        + [lambda u=u: answers.ask("overview", token=u, words=words, method=DEFAULT_METHOD)
           for u in units]  # 5
        + [lambda u=u: answers.ask("steps", token=u, layer=layer, head=head, words=words)
           for u in units]  # 6
        + [lambda row=row, lh=lh: exported(row, *lh) for row in exported_rows()
           for lh in places(row.export, every, layer, head)]  # 7
        + ([answers.best_heads] if probe else []))  # 8
    return state


def collect(api: Api, model: str, text: str, *, token: str | int | None = None, layer: int = 0,
            head: int = 0, words: bool = False, probe: bool = True,
            progress: Callable[[str, int, int], None] | None = None) -> tuple[list, dict]:
    """([[endpoint, request fields, answer], …], the page's opening state) for `text` on
    `model` (the page finds an answer by its request; it alone spells the lookup key).

    `progress(stage, done, total)`: called after each group of answers (`qkv view --html`
    draws it as a bar on a terminal)."""
    answers = _Answers(api, model, text, progress)
    token = int(token) if isinstance(token, str) and token.isdigit() else token
    if answers.loaded.capabilities.cross_attention:
        state = _translation(answers, token, layer, head)
    else:
        state = _self_attention(answers, token, layer, head, words, probe)
    return answers.rows(), state


def result_page(result) -> str:
    """One [`qkv.explain`][qkv.explain] result alone as a self-contained page (its row's panel,
    `PANELS[kind]`, draws its numbers; nothing else is in it): `qkv why --html`, and a
    notebook's display in an iframe (`qkv.view.notebook`)."""
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
    """Write the self-contained page for `text` to `path` (atomically); returns its bytes."""
    api = api or Api(Models([model]))
    answers, state = collect(api, model, text, **selection)
    info = api.info()
    info["models"] = [m for m in info["models"] if m["name"] == model]
    page = standalone(answers, model=model, text=text, state=state, info=info)
    atomic_write_text(path, page)
    return len(page.encode())
