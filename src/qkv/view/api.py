"""The viewer's JSON API: a request's fields checked, a [`qkv.explain`][qkv.explain] result
returned.

The page never computes attention: every number it shows is a field of a `to_dict()` answered
here. The endpoints are the rows of `qkv.explain.kinds.KINDS` (the request body is a JSON
object; `model` and `text` name what to run, the other fields are the row's `fields`, the
library's arguments):

```text
overview     explain(model, text, token, words, method)              → Overview
steps        explain_head(model, text, token, layer, head, words)    → HeadSteps
map          one head's (U, U) map, float32 in base64     (attention_maps(...).head(l, h))
maps         every head's map at once (short texts only: the model view's thumbnails)
received     AttentionReceived(the head's map)  (= attention_received(model, text, layer, head, words))
row_entropy  RowEntropy(the head's map)         (= row_entropy(model, text, layer, head, words))
probe        probe(model) — the model's default probe (coref; induction for a causal
             model) (the best heads the model view marks)
cross        cross_attention(model, text, token)          (encoder-decoders; gold: the model's own)
cross_steps  cross_attention_head(model, text, token, layer, head)
effects      head_effects(model, probe) — each head's ablation effect on a probe that applies
             to the model (``/api/info`` lists them, its default first: the model view's)
why          score_attribution(model, text, layer, head, token, key) — "why this weight": one
             score split into (query × key component) terms (a clicked heat-map cell; a model
             whose residual stream qkv cannot split: 422 naming ``model`` and the reason)
```

A server started on a long document (`qkv view --file`) holds its
[`Document`][qkv.explain.long.document.Document], built once, and answers the `document` rows from
it (their requests name no model or text; `qkv.explain.document_results`):

```text
doc_overview   doc.explain(token, method)                 → DocumentOverview (rows as bytes)
doc_block_map  doc.block_map(layer, head, block)          → BlockMap (tile sums)
doc_rows       doc.weights(layer, head, start…stop)[:, key_start…key_stop] → WeightRows
doc_received   doc.received(layer, head), its top keys     → KeysReceived
doc_spans      head_spans(doc, first): every head's sink share and mean distance → HeadSpans
```

Each request field is declared once, in its row ([`Field`][qkv.explain.kinds.Field]: name, type,
default, bounds), checked here by `read_field` and sent to the page by `/api/info` with
the rows, so the page's defaults are the library's. A row marked `from_map` is answered from
the text's maps (one forward, kept in an LRU) rather than a forward per head.

Which endpoints a model takes is its `capabilities` ([`qkv.models.protocol`][qkv.models.protocol])
against the row's `needs`; `/api/info` sends each model's capabilities to the page. A translation's
gold alignment is the model's own (`model.gold_alignment`: the toy grammar's for the translation
model, none for a transformers encoder-decoder).

Every field is checked before anything runs; a bad one is an `ApiError` (HTTP 4xx) whose
JSON names the field: `{"error": {"field": "layer", "message": "layer 9 is out of range …"}}`.

Models are loaded once, on first use, and shared by every request; torch calls run one at a time
under `Models.lock` (a forward is not re-entrant with traces, and two at once would only
fight for the same cores). Answers are kept in a small LRU (bounded in bytes), so a page going
back and forth between heads costs one forward per text.

Examples:
    >>> api = Api(Models(["minilm"]))
    >>> api.handle("steps", {"text": "the cat sat", "token": 2, "layer": 0, "head": 1})["token"]
    'cat'
    >>> api.handle("steps", {"text": "the cat sat", "layer": 9, "head": 0})
    Traceback (most recent call last):
    ...
    qkv.view.api.ApiError: layer: layer 9 is out of range: all-MiniLM-L6-v2 has 6 layers (0–5)
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import replace
from typing import Any, Callable, Sequence

from qkv.errors import QkvError
from qkv.explain import ArgumentError, attention_map, attention_maps
from qkv.explain.cost import whole_maps_fit, whole_maps_units
from qkv.explain.mixer_maps import effective_layer
from qkv.explain.long import document_results
from qkv.explain.finite import NonFiniteError
from qkv.explain.forward import check_layer_head
from qkv.explain.causal.head_effects import probes_for
from qkv.explain.contributions import DEFAULT, METHODS as REGISTRY
from qkv.explain.kinds import KINDS, Field
from qkv.view import answers

MAX_TEXT_CHARS = 20000  # a 2,048-token decoder input is ~10,000 characters; the model's own limit applies too
MAX_TOKEN_CHARS = 100
# ``map`` keeps every head's (t, t) map of a text (one forward): 6 × 12 × 512² float32 = 75 MB
# for MiniLM. Longer texts (a 2,048-token decoder: 2.4 GB for GPT-2 small) get no map; the head
# view then draws the selected token's row, which the overview already holds (O(L · H · t)).
MAX_MAP_TOKENS = 512
CACHE_BYTES = 256 * 2**20  # answers and per-text maps kept, at most


def methods() -> dict[str, str]:
    """The method switch's choices: name → formula, in the registry's order (the weights first)."""
    return {name: m.formula for name, m in REGISTRY.items()}


METHODS = methods()
# What the page needs to know of the methods besides their names: which one a request without
# ``method`` means, and which give the attention weights themselves (drawn as weights, not shares).
METHOD_INFO = {"default_method": DEFAULT, "raw_methods": [n for n, m in REGISTRY.items() if m.raw]}
# endpoint → the row of qkv.explain.kinds.KINDS that answers it (the one with a run, or a whole map)
ROWS = {k.endpoint: k for k in KINDS.values() if k.endpoint and (k.run or k.name == k.endpoint)}
ENDPOINTS = tuple(ROWS)
# The fields each endpoint takes (``model`` and ``text`` aside): its row's.
FIELDS = {endpoint: set(row.field_names) for endpoint, row in ROWS.items()}


class ApiError(QkvError):
    """A request the API refuses: `status` (4xx), the `field` at fault and a message."""

    def __init__(self, field: str | None, message: str, status: int = 422):
        super().__init__(f"{field}: {message}" if field else message)
        self.field, self.message, self.status = field, message, status

    def to_dict(self) -> dict:
        return {"error": {"field": self.field, "message": self.message}}


# -- fields ------------------------------------------------------------------------------------
def _string(body: dict, field: str, *, limit: int, required: bool = False) -> str | None:
    value = body.get(field)
    if value is None:
        if required:
            raise ApiError(field, f"{field} is required")
        return None
    if not isinstance(value, str):
        raise ApiError(field, f"{field} must be a string, got {type(value).__name__}")
    if len(value) > limit:
        raise ApiError(field, f"{field} is {len(value)} characters; the limit is {limit}", 413)
    return value


def _integer(body: dict, field: str, *, required: bool = False) -> int | None:
    value = body.get(field)
    if value is None:
        if required:
            raise ApiError(field, f"{field} is required")
        return None
    # bool is an int in Python; JSON true is not a layer number
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(field, f"{field} must be an integer, got {json.dumps(value)[:40]}")
    if not 0 <= value < 2**31:
        raise ApiError(field, f"{field} {value} is out of range (counting from 0)")
    return value


def _boolean(body: dict, field: str) -> bool:
    value = body.get(field, False)
    if not isinstance(value, bool):
        raise ApiError(field, f"{field} must be true or false, got {json.dumps(value)[:40]}")
    return value


def _token(body: dict, field: str, limit: int, *, required: bool = False) -> str | None:
    """A token field (`token`, `key`): an index (int), a word, `"word@N"`, or absent (the
    last word; a required one: an error)."""
    value = body.get(field)
    if value is None:
        if required:
            raise ApiError(field, f"{field} is required")
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise ApiError(field, f"{field} {value} is out of range (counting from 0)")
        return str(value)
    return _string(body, field, limit=limit)


def read_field(body: dict, field: Field) -> Any:
    """`field`'s value in `body`, checked by its type (absent: its default; required: an error).
    Whether a method or probe applies to the model is asked of the library afterwards."""
    if field.type == "index":
        value = _integer(body, field.name, required=field.required)
    elif field.type == "bool":
        value = _boolean(body, field.name) if field.name in body else None
    elif field.type == "token":
        value = _token(body, field.name, field.limit, required=field.required)
    else:  # method, probe: names
        value = _string(body, field.name, limit=field.limit or MAX_TOKEN_CHARS)
    return field.default if value is None else value


# -- models ------------------------------------------------------------------------------------
class Models:
    """The models a viewer may run (names or directories given at start), each loaded once.

    A page may only name one of `names`: a request cannot make the server read another path.
    Every model loads with [`qkv.load`][qkv.load] and is described by its `capabilities`.
    """

    def __init__(self, names: Sequence[str], *, loader: Callable[[str], Any] | None = None):
        if not names:
            raise ValueError("a viewer needs at least one model")
        self.names = list(dict.fromkeys(str(n) for n in names))
        self.lock = threading.RLock()
        self._loaded: dict[str, tuple[str, Any]] = {}
        self._loader = loader

    @property
    def default(self) -> str:
        return self.names[0]

    def get(self, name: str) -> Any:
        """The model, loading it the first time (under the lock)."""
        if name not in self.names:
            raise ApiError("model", f"model {name!r} is not served here; choose one of: "
                           f"{', '.join(self.names)}")
        loaded = self._loaded.get(name)
        if loaded is not None:  # no lock: a cached answer must not wait for another's forward
            return loaded
        with self.lock:
            if name not in self._loaded:
                if self._loader is not None:
                    loaded = self._loader(name)
                else:
                    from qkv.models import load

                    loaded = load(name)
                self._loaded[name] = loaded
            return self._loaded[name]

    def info(self, name: str) -> dict:
        """The model's name, capabilities (what the page chooses its panels by), the methods
        that apply to it as the page can ask (no `target_text`: `grad` needs a decoder) and
        the probes whose ablation effects it has (the library's
        [`probes_for`][qkv.explain.causal.head_effects.probes_for])."""
        model = self.get(name)
        caps = model.capabilities
        return {"name": name, "capabilities": caps.to_dict(), "example": example_for(caps),
                "methods": [m for m in METHODS if caps.self_attention and _applies(model, m)],
                "probes": probes_for(model) if caps.self_attention else [],
                # ``maps`` (every head at once) up to this many units; longer texts go per head
                "whole_maps_units": whole_maps_units(model) if caps.self_attention else 0,
                # the layers each per-layer kind answers (an indexer's, a gated output's)
                "layers": {row.name: row.layers(model) if getattr(caps, row.needs) else []
                           for row in KINDS.values() if row.layers is not None}}


# The text a page opens with when none is given: a sentence the model can read (the toy
# translation grammar knows neither "dog" nor "pizza"), by what the model does.
EXAMPLES = {"cross_attention": "the red apple is next to the black cats",
            "self_attention": "The dog found some pizza next to the baby and ate it"}


def example_for(caps) -> str:
    return EXAMPLES["cross_attention" if caps.cross_attention else "self_attention"]


def page_info(models: list[dict], *, default_text: str | None = None,
              map_tokens: int = MAX_MAP_TOKENS, document: dict | None = None) -> dict:
    """What `/api/info` answers (and an exported page or a notebook embeds): the models
    (`Models.info`), the methods, the limits and the rows of
    `KINDS` with their fields — every default the page uses."""
    return {"models": models, "default_model": models[0]["name"], "default_text": default_text,
            "methods": METHODS, **METHOD_INFO,
            "limits": {"text_chars": MAX_TEXT_CHARS, "map_tokens": map_tokens},
            "kinds": {k.name: k.to_dict() for k in KINDS.values() if k.endpoint},
            "document": document}


def _applies(model, method: str) -> bool:
    """Whether the library runs `method` on `model` (it is asked, not second-guessed here)."""
    from qkv.explain.contributions import check_method

    try:
        check_method(model, method)
    except ArgumentError:
        return False
    return True


class _Lru:
    """A least-recently-used cache bounded by the summed `size` of its values (thread-safe)."""

    def __init__(self, max_bytes: int):
        self.max_bytes, self.bytes = max_bytes, 0
        self._items: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key):
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key][0]
        return None

    def put(self, key, value, size: int) -> None:
        with self._lock:
            if key in self._items:
                self.bytes -= self._items.pop(key)[1]
            self._items[key] = (value, size)
            self.bytes += size
            while self.bytes > self.max_bytes and len(self._items) > 1:
                self.bytes -= self._items.popitem(last=False)[1][1]


# -- the API -----------------------------------------------------------------------------------
class Api:
    """`handle(endpoint, body)` → the JSON-ready answer, or `ApiError`."""

    def __init__(self, models: Models, *, cache_bytes: int = CACHE_BYTES,
                 map_tokens: int = MAX_MAP_TOKENS, text: str | None = None, document=None):
        self.models, self.text = models, text  # text: what the bare page opens with
        # document: a qkv.explain.long.document.Document (qkv view --file), answering the rows of
        # KINDS marked ``document``; described once (its token labels go to the page once)
        self.document = document
        self._described = None if document is None else document_results.describe(document)
        self.map_tokens = map_tokens
        self._answers = _Lru(cache_bytes // 2)
        self._map_cache = _Lru(cache_bytes // 2)

    def info(self) -> dict:
        return page_info([self.models.info(n) for n in self.models.names], default_text=self.text,
                         map_tokens=self.map_tokens, document=self._described)

    def handle(self, endpoint: str, body: dict) -> dict:
        if endpoint not in ENDPOINTS:
            raise ApiError("endpoint", f"no endpoint {endpoint!r}; the endpoints are: "
                           f"{', '.join(ENDPOINTS)}", 404)
        if not isinstance(body, dict):
            raise ApiError("body", "the body must be a JSON object", 400)
        row = ROWS[endpoint]
        allowed = FIELDS[endpoint] | (set() if row.document else {"model", "text"})
        unknown = sorted(set(body) - allowed)
        if unknown:
            raise ApiError(unknown[0], f"unknown field {unknown[0]!r} for {endpoint}; it takes: "
                           f"{', '.join(sorted(allowed))}")
        args = {f.name: read_field(body, f) for f in row.fields}
        if row.document:
            return self._from_document(row, args)
        model = _string(body, "model", limit=4096) or self.models.default
        loaded = self.models.get(model)
        if not getattr(loaded.capabilities, row.needs):
            raise ApiError("model", f"model {model!r} has no {row.needs.replace('_', '-')}; "
                           f"{endpoint} needs a model with one")
        text = _string(body, "text", limit=MAX_TEXT_CHARS, required=row.text)
        if text is not None and not text.strip():
            raise ApiError("text", "text is empty; type a sentence")
        self._check_names(row, args, model, loaded)
        try:
            if row.run is None or row.from_map:  # from the text's maps, kept here
                answer = self._from_maps(row, loaded, text, args)
            else:
                answer = self._run(row, loaded, text, args)
        except ArgumentError as e:
            raise ApiError(e.argument, str(e)) from None
        except ApiError:
            raise
        except NonFiniteError as e:  # a broken model: named by layer and head, whatever the endpoint
            raise ApiError("model", str(e)) from None
        except QkvError as e:  # an empty text, too many tokens, a word the model does not know
            raise ApiError("text", str(e)) from None
        return answer

    def _check_names(self, row, args: dict, model: str, loaded) -> None:
        """A `method` field must name a method that applies to `model`, a `probe` one whose
        effects the library measures on it (absent: the model's default probe)."""
        for field in row.fields:
            value = args[field.name]
            if field.type == "method":
                if not isinstance(value, str) or value not in METHODS:
                    raise ApiError("method", f"unknown method {value!r}; the methods are: "
                                   f"{', '.join(METHODS)}")
                if not _applies(loaded, value):
                    raise ApiError("method", f"method {value} does not apply to {model}: the "
                                   f"methods for it are {', '.join(self.models.info(model)['methods'])}")
            elif field.type == "probe" and value is not None:
                known = self.models.info(model)["probes"]
                if value not in known:
                    raise ApiError("probe", f"probe {value!r} does not apply to {model}; its probes "
                                   f"are: {', '.join(known)}")

    def answer(self, endpoint: str, body: dict) -> bytes:
        """`handle`'s answer as JSON bytes, kept in the LRU (the server sends these)."""
        key = json.dumps([endpoint, body], sort_keys=True) if isinstance(body, dict) else None
        cached = self._answers.get(key) if key is not None else None
        if cached is None:
            answer = self.handle(endpoint, body)
            try:
                cached = json.dumps(answer, allow_nan=False, ensure_ascii=False).encode()
            except ValueError:  # NaN/inf that no trace check caught: refused, never a 500
                raise ApiError("model", "the answer holds NaN or infinity: the model's weights or "
                               "input give non-finite numbers, so there is nothing true to show") from None
            self._answers.put(key, cached, len(cached))
        return cached

    def _from_document(self, row, args: dict) -> dict:
        """A `document` row's answer: `run` on the served Document under the lock (its
        fields already checked; absent optional ones left to `run`'s defaults)."""
        if self.document is None:
            raise ApiError("endpoint", f"{row.endpoint} answers about a document and this server "
                           "has none: start it with qkv view --file FILE", 404)
        method = args.get("method")
        if method is not None and method not in self._described["methods"]:
            raise ApiError("method", f"method {method!r}: a document answers "
                           f"{', '.join(self._described['methods'])}")
        args = {k: v for k, v in args.items() if v is not None}
        try:
            with self.models.lock:
                result = row.run(self.document, **args)
        except ArgumentError as e:
            raise ApiError(e.argument, str(e)) from None
        except QkvError as e:
            raise ApiError(None, str(e)) from None
        return answers.answer(result)

    def _run(self, row, model, text, args: dict) -> dict:
        """The row's library call under the lock, its result as the page receives it."""
        if row.whole_map:
            self._check_map_tokens(model, text)
        with self.models.lock:
            result = row.run(model, text if row.text else None, **args)
        return answers.answer(result)

    def _check_map_tokens(self, model, text) -> None:
        with self.models.lock:
            n = len(model.tokenizer.encode(text).ids)
        if n > self.map_tokens:
            raise ApiError("text", f"text is {n} tokens; whole maps are kept for at most "
                           f"{self.map_tokens} (the overview holds each head's row of one token)")

    def _all_maps(self, model, text, words):
        key = (id(model), text, words)
        maps = self._map_cache.get(key)
        if maps is None:  # only texts within the limit are ever cached: a hit needs no check
            with self.models.lock:
                maps = self._map_cache.get(key)  # computed while this request waited?
                if maps is not None:
                    return maps
                self._check_map_tokens(model, text)
                maps = attention_maps(model, text, words=words)
            if not words:  # float32 halves the cache, losing nothing: a token's weights are the forward's float32
                maps = replace(maps, weights=maps.weights.float())  # (L, H, U, U)
            self._map_cache.put(key, maps, maps.weights.numel() * maps.weights.element_size())
        return maps

    def _from_maps(self, row, model, text, args: dict) -> dict:
        """A row answered from `text`'s maps (one forward, kept): the whole maps (`maps`:
        short texts only), one head's map, or `run` on one head's map (`from_map`)."""
        if not row.from_map:
            with self.models.lock:
                n = len(model.tokenizer.encode(text).ids)
            if not whole_maps_fit(model, n):
                raise ApiError("text", f"text is {n} tokens; whole maps of every head are sent for at "
                               f"most {whole_maps_units(model)} (ask for one head's map instead)")
            return answers.answer(self._all_maps(model, text, args["words"]))
        if effective_layer(model, args["layer"]):  # a linear / SSM layer: its exact M, one head
            if row.run is not None:
                raise ApiError("layer", f"layer {args['layer']} has no softmax rows ({row.endpoint} reads "
                               f"them); its map is the effective attention: ask for map")
            with self.models.lock:
                return answers.answer(attention_map(model, text, layer=args["layer"], head=args["head"],
                                                    words=args["words"]))
        maps = self._all_maps(model, text, args["words"])
        check_layer_head(model, args["layer"], args["head"])
        one = maps.head(args["layer"], args["head"])
        return answers.answer(one if row.run is None else row.run(replace(one, weights=one.weights.double())))
