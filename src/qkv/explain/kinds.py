"""The one table of result kinds: what each :mod:`qkv.explain` result is, and how it is asked for
and shown.

Every result class says its ``kind`` (a class attribute; ``to_dict()["kind"]`` carries it), and
:data:`KINDS` holds one :class:`ResultKind` row per kind. Everything that turns results into
something else reads this table — nothing dispatches on a class name:

* the CLI prints a result with its row's ``render`` (``--json``: ``json(to_dict())``);
* the viewer's API (:mod:`qkv.view.api`) serves ``/api/<endpoint>`` for each row with a ``run``,
  taking the row's ``fields``, refusing a model without the row's ``needs`` capability;
* the ``--html`` export and a notebook (:mod:`qkv.view.notebook`) open the page at ``request(result)``;
* the page draws the answer its ``kind`` names.

A new result kind is a result class and one row here (plus, to show it, a panel in
``view/static/app.js``).

    >>> KINDS["steps"].fields, KINDS["steps"].needs
    (('token', 'layer', 'head', 'words'), 'self_attention')
    >>> sorted({k.endpoint for k in KINDS.values() if k.endpoint and not k.document})
    ['cross', 'cross_steps', 'effects', 'map', 'maps', 'overview', 'probe', 'received', 'steps']
    >>> sorted(k.endpoint for k in KINDS.values() if k.document)
    ['doc_block_map', 'doc_overview', 'doc_received', 'doc_rows']
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from qkv.explain import (
    cross, document_results, find_heads, induction, maps, overview, received, steps,
)
from qkv.explain.head_effects import HeadEffects, head_effects


def _whole(doc: dict) -> Any:
    return doc


def _heads_list(doc: dict) -> Any:
    return doc["heads"]  # ``qkv heads --json`` prints the ranked heads only (documented)


@dataclass(frozen=True)
class ResultKind:
    """One kind of result.

    Fields:
        name: the result's ``kind`` (and ``to_dict()["kind"]``).
        needs: the capability a model must have (a field of :class:`~qkv.models.protocol.Capabilities`).
        render: ``"module:function"`` printing it in a terminal: ``function(console, result,
            **options)`` taking those of ``names``/``top``/``model_arg`` it declares.
        endpoint: the viewer endpoint that answers with it (None: not in the viewer).
        run: ``(model, text, **fields) → result``: what that endpoint runs (None: another row's
            ``run`` answers it, or the API computes it itself — whole maps are cached there).
        fields: the request fields ``run`` takes besides ``model`` and ``text``.
        request: result → the fields that ask for it again (where a page showing it opens).
        json: what ``--json`` prints of ``to_dict()``.
        text: whether a request needs a text (a probe runs on its own).
        whole_map: it traces every query row of a layer (O(t²)): the viewer keeps such requests
            to texts within its map limit.
        result: the result class a notebook displays as this row's panel (its ``kind`` is
            ``name``; :mod:`qkv.view.notebook` registers it), or None: not displayed on its own.
        document: answered from a :class:`~qkv.explain.document.Document` (``qkv view --file``):
            ``run(document, **fields)``; the request names no model or text (the document's).
    """

    name: str
    needs: str
    render: str
    endpoint: str | None = None
    run: Callable[..., Any] | None = None
    fields: tuple[str, ...] = ()
    request: Callable[[Any], dict] | None = None
    json: Callable[[dict], Any] = _whole
    text: bool = True
    whole_map: bool = False
    result: type | None = None
    document: bool = False


def _effects(model, text, *, probe=None):
    """The viewer's ablation effects: ``probe`` None is the model's default probe (the one whose
    best heads the model view marks, :func:`~qkv.explain.find_heads.default_probe`)."""
    return head_effects(model, find_heads.default_probe(model) if probe is None else probe)


KINDS: dict[str, ResultKind] = {k.name: k for k in (
    ResultKind("overview", "self_attention", "qkv.explain.render:render_overview", "overview",
               overview.explain, ("token", "words", "method"),
               lambda r: {"token": r.unit, "words": r.units.words, "method": r.method},
               result=overview.Overview),
    ResultKind("steps", "self_attention", "qkv.explain.render:render_steps", "steps",
               steps.explain_head, ("token", "layer", "head", "words"),
               lambda r: {"token": r.token_index, "layer": r.layer, "head": r.head, "words": False},
               result=steps.HeadSteps),
    ResultKind("map", "self_attention", "", "map", None, ("layer", "head", "words"),
               lambda r: {"layer": r.layer, "head": r.head, "words": r.units.words},
               result=maps.AttentionMap),
    # every head's maps feed the overview's thumbnails: no panel (or request) of their own
    ResultKind("maps", "self_attention", "", "maps", None, ("words",)),
    ResultKind("received", "self_attention", "", "received", received.attention_received,
               ("layer", "head", "words"),
               lambda r: {"layer": r.map.layer, "head": r.map.head, "words": r.map.units.words},
               whole_map=True, result=received.AttentionReceived),
    ResultKind("probe", "self_attention", "qkv.explain.render:render_probe", "probe",
               lambda model, text: find_heads.probe(model), (), lambda r: {}, _heads_list,
               text=False, result=find_heads.ProbeResult),
    ResultKind("head-scores", "self_attention", "qkv.explain.render_induction:render_head_scores",
               "probe", request=lambda r: {}, text=False, result=induction.HeadScores),
    ResultKind("heads", "self_attention", "qkv.explain.render:render_pair", json=_heads_list),
    ResultKind("no-projection", "self_attention", "qkv.explain.render:render_ablation"),
    # one dimension's softmax saturation (qkv softmax-demo prints a list of them as one table)
    ResultKind("saturation", "self_attention", ""),
    # causal ground truth (issue 22): ablation effects per head, and the methods ranked against them
    ResultKind("head_effects", "self_attention", "qkv.explain.render_faithfulness:render_effects",
               "effects", _effects, ("probe",), lambda r: {"probe": r.probe}, text=False,
               result=HeadEffects),
    ResultKind("faithfulness", "self_attention",
               "qkv.explain.render_faithfulness:render_faithfulness"),
    ResultKind("ablation", "self_attention", ""),  # qkv.explain.ablate: numbers for a program
    ResultKind("patching", "self_attention", ""),  # qkv.explain.patch
    # what tokens contribute by a method (qkv.explain.contributions), and the methods side by side
    ResultKind("contributions", "self_attention", ""),
    ResultKind("comparison", "self_attention", "qkv.explain.render_contributions:render_compare"),
    ResultKind("cross", "cross_attention", "qkv.explain.render_cross:render_cross_overview",
               "cross", cross.cross_attention, ("token",), lambda r: {"token": r.focus},
               result=cross.CrossAttention),
    ResultKind("cross_steps", "cross_attention", "qkv.explain.render_cross:render_cross_steps",
               "cross_steps", cross.cross_attention_head, ("token", "layer", "head"),
               lambda r: {"token": r.french_index, "layer": r.steps.layer, "head": r.steps.head},
               result=cross.CrossHeadSteps),
    # a long document (qkv view --file): one recorded forward answers every question, O(N)
    ResultKind("document-overview", "self_attention", "", "doc_overview", document_results.overview,
               ("token", "method"), document=True),
    ResultKind("block-map", "self_attention", "", "doc_block_map", document_results.block_map,
               ("layer", "head", "block"), document=True),
    ResultKind("weight-rows", "self_attention", "", "doc_rows", document_results.weight_rows,
               ("layer", "head", "start", "stop", "key_start", "key_stop"), document=True),
    ResultKind("document-received", "self_attention", "", "doc_received", document_results.received,
               ("layer", "head"), document=True),
)}


def kind_of(result) -> ResultKind:
    """The row of ``result`` (by its ``kind``); ValueError for something that is not a result."""
    name = getattr(result, "kind", None)
    if name not in KINDS:
        raise ValueError(f"result must be a qkv.explain result (with a kind), got "
                         f"{type(result).__name__}")
    return KINDS[name]
