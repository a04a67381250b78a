"""The one table of result kinds: what each [`qkv.explain`][qkv.explain] result is, and how it is
asked for and shown.

Every result class says its `kind` (a class attribute; `to_dict()["kind"]` carries it), and
`KINDS` holds one [`ResultKind`][qkv.explain.kinds.ResultKind] row per kind. Everything that turns
results into something else reads this table — nothing dispatches on a class name or keeps a list of
its own:

* the CLI prints a result with its row's `render` (`--json`: `json(to_dict())`), draws its
  `figure` for `--png` and writes its `page` for `--html` (`qkv.cli.command`);
  `qkv show KIND TEXT` runs any row with a `run` and a text, its `fields` as flags;
* the `--html` export (`qkv.view.export`) runs a row as its `export` says — once per
  text, once per layer, or once per head (only rows answered from the cached maps: a forward per
  head would break the export's budget of a few forwards per token);
* the viewer's API (`qkv.view.api`) serves `/api/<endpoint>` for each row with a `run`,
  taking, checking and defaulting the row's `fields` ([`Field`][qkv.explain.kinds.Field]), refusing
  a model without the row's `needs` capability, answering in the row's `encoding`; `/api/info` sends
  the rows to the page;
* the `--html` export and a notebook (`qkv.view.notebook`) open the page at `request(result)`;
* the page draws an answer with `PANELS[kind]` (`view/static/app.js`), where the row's
  `panel` says.

A new result kind is a result class, one row here and, to show it, one entry of `PANELS`.

Examples:
    >>> [f.name for f in KINDS["steps"].fields], KINDS["steps"].needs
    (['token', 'layer', 'head', 'words'], 'self_attention')
    >>> sorted({k.endpoint for k in KINDS.values() if k.endpoint and not k.document})
    ['cross', 'cross_steps', 'effects', 'gate', 'indexed', 'map', 'maps', 'overview', 'probe', 'received', 'row_entropy', 'steps', 'why']
    >>> sorted(k.endpoint for k in KINDS.values() if k.document)
    ['doc_block_map', 'doc_overview', 'doc_received', 'doc_rows', 'doc_spans']
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from qkv.explain import (
    cross,
    maps,
    overview,
    received,
    row_entropy,
    steps,
)
from qkv.explain.long import document_heads, document_results
from qkv.errors import QkvError
from qkv.explain.circuits import residual as circuits_residual, score as circuits_score
from qkv.explain.forward import check_layer_head
from qkv.explain.probes import find_heads, induction
from qkv.explain.mixers import gate, sparse
from qkv.explain.wording import ArgumentError
from qkv.explain.contributions import DEFAULT as DEFAULT_METHOD
from qkv.explain.causal.head_effects import HeadEffects, head_effects


def _whole(doc: dict) -> Any:
    return doc


def _heads_list(doc: dict) -> Any:
    return doc["heads"]  # ``qkv heads --json`` prints the ranked heads only (documented)


FIELD_TYPES = ("index", "bool", "token", "method", "probe")


@dataclass(frozen=True)
class Field:
    """One request field of a result kind: its name (the library's argument), type, default and
    bounds — what the viewer's API checks and the page is told (`/api/info`).

    The types:

    - `index`: an integer, `0 ≤ value < 2**31` (the library checks it against the model:
      `layer 9 is out of range …`).
    - `bool`: true or false.
    - `token`: an index, a word or `"word@N"` (at most `limit` characters); None: the
      library's default (the last word). `key` (a score's key) is one too, required.
    - `method`: a name of `qkv.explain.contributions.METHODS` that applies to the model.
    - `probe`: a probe whose effects the library measures on the model; None: its default probe.

    `default` is what an absent field means; a `required` field has none.

    Examples:
        >>> LAYER.required, WORDS.default, METHOD.default
        (True, False, 'weight')
    """

    name: str
    type: str
    default: Any = None
    required: bool = False
    limit: int | None = None  # a string's most characters

    def __post_init__(self):
        if self.type not in FIELD_TYPES:
            raise ValueError(f"field {self.name}: unknown type {self.type!r}; the types are "
                             f"{', '.join(FIELD_TYPES)}")

    def to_dict(self) -> dict:
        return {"name": self.name, "type": self.type, "default": self.default,
                "required": self.required, "limit": self.limit}


TOKEN = Field("token", "token", limit=100)
LAYER = Field("layer", "index", required=True)
HEAD = Field("head", "index", required=True)
WORDS = Field("words", "bool", False)
METHOD = Field("method", "method", DEFAULT_METHOD)
PROBE = Field("probe", "probe", limit=100)
KEY = Field("key", "token", required=True, limit=100)  # a score's key (qkv why --to)


def _indices(run: Callable, *names: str) -> tuple[Field, ...]:
    """Index fields with the defaults of `run`'s own keyword arguments (none: required)."""
    import inspect

    params = inspect.signature(run).parameters
    return tuple(Field(n, "index", None if params[n].default is inspect.Parameter.empty
                       else params[n].default, required=params[n].default is inspect.Parameter.empty)
                 for n in names)


ENCODINGS = ("json", "map", "maps", "document-overview", "values")
PANELS = ("main", "head", "cell", "alone")
EXPORTS = ("text", "layer", "head")


def _later(where: str) -> Callable:
    """`"module:function"` as a function that imports it when called (drawing and pages
    import matplotlib and the viewer; the table stays cheap to import)."""
    def call(*args, **kwargs):
        import importlib

        module, _, name = where.partition(":")
        # the table names its renderers as "module:function" strings so that importing it stays
        # cheap: resolving one is an attribute of a module by name, not a model read
        return getattr(importlib.import_module(module), name)(*args, **kwargs)

    call.__qualname__ = call.__name__ = where
    return call


def _page_of_dict(where: str) -> Callable:
    """A page drawn from the result's `to_dict()` (the needle and atlas pages)."""
    draw = _later(where)
    return lambda result: draw(result.to_dict())


def _result_page(result) -> str:
    """The result alone, drawn by its panel (`qkv.view.export.result_page`)."""
    return _later("qkv.view.export:result_page")(result)


@dataclass(frozen=True)
class ResultKind:
    """One kind of result.

    Attributes:
        name: the result's `kind` (and `to_dict()["kind"]`).
        needs: the capability a model must have (a field of
            [`Capabilities`][qkv.models.protocol.Capabilities]).
        render: `"module:function"` printing it in a terminal: `function(console, result,
            **options)` taking those of `names`/`top`/`model_arg` it declares.
        endpoint: the viewer endpoint that answers with it (None: not in the viewer).
        run: `(model, text, **fields) → result`: what that endpoint runs (None: another row's
            `run` answers it, or the API computes it itself — whole maps are cached there).
        fields: the request fields ([`Field`][qkv.explain.kinds.Field]) `run` takes besides `model`
            and `text`.
        request: result → the fields that ask for it again (where a page showing it opens).
        json: what `--json` prints of `to_dict()`.
        text: whether a request needs a text (a probe runs on its own).
        whole_map: it traces every query row of a layer (O(t²)): the viewer keeps such requests
            to texts within its map limit.
        from_map: `run(map)` reads one head's [`AttentionMap`][qkv.explain.maps.AttentionMap] (the
            `layer`/`head`/`words` fields pick it; no `run`: the map itself): the viewer
            answers it from the text's maps, which it keeps, instead of a forward per head.
        result: the result class a notebook displays as this row's panel (its `kind` is
            `name`; `qkv.view.notebook` registers it), or None: not displayed on its own.
        document: answered from a [`Document`][qkv.explain.long.document.Document]
            (`qkv view --file`): `run(document, **fields)`; the request names no model or text (the
            document's).
        encoding: how the viewer sends it — `"json"`: its `to_dict()`; the others send its
            numbers as float32 bytes (`qkv.view.answers.ENCODINGS`).
        panel: where the page draws it with `PANELS[name]`: `"main"` (its own place in the
            page: model view, head view, step panel), `"head"` (a section of its own under the
            head view, asked again with the selection's fields whenever the head changes),
            `"cell"` (a section under the head view for the heat map's clicked cell: the
            selection's fields with the cell's column as `key`),
            `"alone"` (only a result shown on its own: a notebook), None (no panel).
        figure: result → a matplotlib figure, what `--png` draws (None: the command has none).
        page: result → a self-contained HTML page, what `--html` writes (None: none).
        export: how the `--html` export runs it for a short text: `"text"` (one request, the
            selection's token), `"layer"` (one per layer), `"head"` (one per head: only a
            `from_map` row, answered from the maps the export keeps, costs no forward per
            head), or None (not exported; the page asks a server).
        layers: model → the layers this kind answers (an indexer's, a gated output's), or None:
            every layer. `/api/info` sends them per model, so the page shows the panel only
            where the selected layer has one; `qkv explain --layer L --head H` prints every such
            row that answers layer L after the head's steps.
    """

    name: str
    needs: str
    render: str
    endpoint: str | None = None
    run: Callable[..., Any] | None = None
    fields: tuple[Field, ...] = ()
    request: Callable[[Any], dict] | None = None
    json: Callable[[dict], Any] = _whole
    text: bool = True
    whole_map: bool = False
    from_map: bool = False
    result: type | None = None
    document: bool = False
    encoding: str = "json"
    panel: str | None = None
    figure: Callable[[Any], Any] | None = None
    page: Callable[[Any], str] | None = None
    export: str | None = None
    layers: Callable[[Any], list[int]] | None = None

    def __post_init__(self):
        if self.encoding not in ENCODINGS or self.panel not in (*PANELS, None):
            raise ValueError(f"row {self.name}: encoding {self.encoding!r} / panel {self.panel!r}; "
                             f"the encodings are {', '.join(ENCODINGS)}, the panels {', '.join(PANELS)}")
        if self.export not in (*EXPORTS, None) or (self.export == "head" and not self.from_map):
            raise ValueError(f"row {self.name}: export {self.export!r}; the exports are "
                             f"{', '.join(EXPORTS)}, and 'head' only for a from_map row (a forward "
                             f"per head would break the export's forward budget)")

    @property
    def field_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)

    def to_dict(self) -> dict:
        """What the page is told of the row (`/api/info`'s `kinds`)."""
        return {"name": self.name, "needs": self.needs, "endpoint": self.endpoint,
                "fields": [f.to_dict() for f in self.fields], "text": self.text,
                "whole_map": self.whole_map, "panel": self.panel, "encoding": self.encoding,
                "per_layer": self.layers is not None}


def _effects(model, text, *, probe=None):
    """The viewer's ablation effects: `probe` None is the model's default probe (the one whose
    best heads the model view marks, `default_probe`)."""
    return head_effects(model, find_heads.default_probe(model) if probe is None else probe)


def _why(model, text, *, layer, head, key, token=None):
    """The viewer's "why this weight" (a clicked cell): `score_attribution` of `key` for
    the query `token`; a model whose stream or projections qkv cannot split is refused as the
    `model`'s fault, by its one-line reason."""
    check_layer_head(model, layer, head)
    try:
        circuits_residual.check(model)
        circuits_score.check_model(model, layer)
    except ArgumentError:
        raise
    except QkvError as e:
        raise ArgumentError("model", "{reason}", reason=str(e)) from None
    return circuits_score.score_attribution(model, text, layer=layer, head=head, token=token, key=key)


def _head_request(r) -> dict:
    """A one-head result's request: the head of the map it reads."""
    return {"layer": r.map.layer, "head": r.map.head, "words": r.map.units.words}


KINDS: dict[str, ResultKind] = {k.name: k for k in (
    ResultKind("overview", "self_attention", "qkv.explain.rendering.render:render_overview", "overview",
               overview.explain, (TOKEN, WORDS, METHOD),
               lambda r: {"token": r.unit, "words": r.units.words, "method": r.method},
               result=overview.Overview, panel="main",
               figure=_later("qkv.explain.rendering.figures:overview_figure")),
    ResultKind("steps", "self_attention", "qkv.explain.rendering.render:render_steps", "steps",
               steps.explain_head, (TOKEN, LAYER, HEAD, WORDS),
               lambda r: {"token": r.token_index, "layer": r.layer, "head": r.head, "words": False},
               result=steps.HeadSteps, panel="main"),
    ResultKind("map", "self_attention", "", "map", None, (LAYER, HEAD, WORDS),
               lambda r: {"layer": r.layer, "head": r.head, "words": r.units.words},
               from_map=True, result=maps.AttentionMap, encoding="map", panel="main"),
    # every head's maps feed the overview's thumbnails: no request of their own
    ResultKind("maps", "self_attention", "", "maps", None, (WORDS,), encoding="maps", panel="main"),
    ResultKind("received", "self_attention", "", "received", received.AttentionReceived,
               (LAYER, HEAD, WORDS), _head_request, whole_map=True, from_map=True,
               result=received.AttentionReceived, panel="head", export="head"),
    ResultKind("row-entropy", "self_attention", "", "row_entropy", row_entropy.RowEntropy,
               (LAYER, HEAD, WORDS), _head_request, whole_map=True, from_map=True,
               result=row_entropy.RowEntropy, panel="head", export="head"),
    ResultKind("probe", "self_attention", "qkv.explain.rendering.render:render_probe", "probe",
               lambda model, text: find_heads.probe(model), (), lambda r: {}, _heads_list,
               text=False, result=find_heads.ProbeResult, panel="main"),
    ResultKind("head-scores", "self_attention", "qkv.explain.rendering.render_induction:render_head_scores",
               "probe", request=lambda r: {}, text=False, result=induction.HeadScores, panel="main"),
    ResultKind("heads", "self_attention", "qkv.explain.rendering.render:render_pair", json=_heads_list),
    ResultKind("no-projection", "self_attention", "qkv.explain.rendering.render:render_ablation"),
    # one dimension's softmax saturation (qkv softmax-demo prints a list of them as one table)
    ResultKind("saturation", "self_attention", ""),
    # causal ground truth (issue 22): ablation effects per head, and the methods ranked against them
    ResultKind("head_effects", "self_attention", "qkv.explain.rendering.render_faithfulness:render_effects",
               "effects", _effects, (PROBE,), lambda r: {"probe": r.probe}, text=False,
               result=HeadEffects, panel="main"),
    ResultKind("faithfulness", "self_attention",
               "qkv.explain.rendering.render_faithfulness:render_faithfulness",
               figure=_later("qkv.explain.rendering.render_faithfulness:effects_figure")),
    ResultKind("ablation", "self_attention", ""),  # qkv.explain.ablate: numbers for a program
    ResultKind("patching", "self_attention", ""),  # qkv.explain.patch
    # why a head scores a key (qkv why; the viewer's "why this weight": a clicked heat-map cell)
    ResultKind("score-attribution", "self_attention", "qkv.explain.circuits.render:render_terms", "why",
               _why, (TOKEN, KEY, LAYER, HEAD),
               lambda r: {"token": r.token_index, "key": r.key_index, "layer": r.layer, "head": r.head},
               result=circuits_score.ScoreAttribution, panel="cell",
               figure=_later("qkv.explain.circuits.render:terms_figure"), page=_result_page),
    ResultKind("score-row", "self_attention", ""),  # score_attribution(..., key=None)
    ResultKind("logit-attribution", "next_token", ""),  # qkv.explain.logit_attribution
    ResultKind("composition", "self_attention", ""),  # qkv.explain.composition
    # what tokens contribute by a method (qkv.explain.contributions), and the methods side by side
    ResultKind("contributions", "self_attention", ""),
    ResultKind("comparison", "self_attention", "qkv.explain.rendering.render_contributions:render_compare"),
    ResultKind("cross", "cross_attention", "qkv.explain.rendering.render_cross:render_cross_overview",
               "cross", cross.cross_attention, (TOKEN,), lambda r: {"token": r.focus},
               result=cross.CrossAttention, panel="main",
               figure=_later("qkv.explain.rendering.figures:cross_figure")),
    ResultKind("cross_steps", "cross_attention", "qkv.explain.rendering.render_cross:render_cross_steps",
               "cross_steps", cross.cross_attention_head, (TOKEN, LAYER, HEAD),
               lambda r: {"token": r.target_index, "layer": r.steps.layer, "head": r.steps.head},
               result=cross.CrossHeadSteps, panel="main",
               figure=lambda r: _later("qkv.explain.rendering.figures:cross_head_figure")(
                   r.attention, r.steps.layer, r.steps.head)),
    # sparse (indexed) attention: the indexer's scores, selection and cut for one query (DeepSeek
    # V3.2, GLM-DSA); shown under the head view and by qkv explain --layer on an indexed layer
    ResultKind("indexed", "self_attention", "qkv.explain.rendering.render_mixers:render_indexed", "indexed",
               sparse.indexed, (TOKEN, LAYER, HEAD),
               lambda r: {"token": r.token, "layer": r.layer, "head": r.head},
               result=sparse.IndexedSelection, panel="head", layers=sparse.indexed_layers),
    # a gated attention output (Qwen3-Next / 3.5): what the gate lets through of a head, per token
    ResultKind("gate", "self_attention", "qkv.explain.rendering.render_mixers:render_gate", "gate",
               gate.gated_head, (TOKEN, LAYER, HEAD),
               lambda r: {"token": r.token, "layer": r.layer, "head": r.head},
               result=gate.GatedHead, panel="head", layers=gate.gated_layers),
    # Wu et al.'s retrieval heads on needle inputs (retrieval.py: qkv heads --probe retrieval)
    ResultKind("retrieval-scores", "self_attention", "qkv.explain.rendering.render_retrieval:render_retrieval"),
    ResultKind("retrieval-ablation", "self_attention", ""),  # retrieval.retrieval_ablation
    ResultKind("needle-map", "self_attention", "qkv.explain.rendering.render_retrieval:render_needle",
               figure=_later("qkv.explain.rendering.figures:needle_figure"),
               page=_page_of_dict("qkv.view.needle_page:needle_page")),  # qkv needle
    ResultKind("atlas", "self_attention", "qkv.explain.rendering.render_atlas:render_atlas",
               page=_page_of_dict("qkv.view.atlas_page:atlas_page")),  # qkv atlas
    # every head's sink share and attention distance over a long document (document_heads.py):
    # the long page's sinks-and-spans grid
    ResultKind("head-spans", "self_attention", "", "doc_spans", document_heads.head_spans,
               _indices(document_heads.head_spans, "first"), document=True),
    # a long document (qkv view --file): one recorded forward answers every question, O(N)
    ResultKind("document-overview", "self_attention", "", "doc_overview", document_results.overview,
               (TOKEN, METHOD), document=True, encoding="document-overview"),
    ResultKind("block-map", "self_attention", "", "doc_block_map", document_results.block_map,
               _indices(document_results.block_map, "layer", "head", "block"), document=True, encoding="values"),
    ResultKind("weight-rows", "self_attention", "", "doc_rows", document_results.weight_rows,
               _indices(document_results.weight_rows, "layer", "head", "start", "stop", "key_start",
                        "key_stop"), document=True, encoding="values"),
    ResultKind("document-received", "self_attention", "", "doc_received", document_results.received,
               (LAYER, HEAD), document=True, encoding="values"),
)}


def kind_of(result) -> ResultKind:
    """The row of `result` (by its `kind`); ValueError for something that is not a result."""
    # any object may be handed here, and the results share no base class (each declares its
    # `kind` as a class attribute): a non-result lacks it, and that is the ValueError below
    name = getattr(result, "kind", None)
    if name not in KINDS:
        raise ValueError(f"result must be a qkv.explain result (with a kind), got "
                         f"{type(result).__name__}")
    return KINDS[name]
