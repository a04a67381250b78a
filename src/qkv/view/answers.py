"""What the page receives for each kind of :mod:`qkv.explain` result: its ``to_dict()`` plus the
few fields the page needs to lay it out (sizes, which units are special).

One function per result type, used by the API (:mod:`qkv.view.api`) and by the results'
``_repr_html_`` alike, so a notebook and a browser get the same answer for the same result.
Results are read through their public fields only; nothing here imports :mod:`qkv.explain`
(which imports this module for ``_repr_html_``).

:func:`answer_key` is how the page looks an answer up in an exported file: the endpoint and the
request's fields other than ``model`` and ``text``, as canonical JSON — the same string
``app.js``'s ``answerKey`` builds.

    >>> answer_key("steps", {"head": 1, "layer": 0, "token": 2, "words": False, "text": "x"})
    'steps{"head":1,"layer":0,"token":2,"words":false}'
"""

from __future__ import annotations

import base64
import json


def answer_key(endpoint: str, fields: dict) -> str:
    kept = {k: v for k, v in fields.items() if k not in ("model", "text") and v is not None}
    return endpoint + json.dumps(kept, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def encode_f32(t) -> str:
    """A tensor as base64 of its little-endian float32 bytes, row-major (the page decodes it
    with ``new Float32Array``)."""
    import torch

    return base64.b64encode(t.detach().to(torch.float32).contiguous().numpy().astype("<f4").tobytes()).decode()


def overview(ov) -> dict:
    return {**ov.to_dict(), "kind": "overview", "num_layers": ov.num_layers,
            "num_heads": ov.num_heads, "special": list(ov.units.special)}


def steps(st) -> dict:
    return {**st.to_dict(), "kind": "steps", "notes": [str(n) for n in st.notes],
            "word": st.word, "word_tokens": list(st.word_tokens)}


def head_map(m) -> dict:
    """One head's map (an :class:`~qkv.explain.AttentionMap`), weights as float32 base64."""
    return {"kind": "map", "model": m.model, "text": m.text, "units": m.units.labels,
            "special": list(m.units.special), "words": m.units.words, "layer": m.layer,
            "head": m.head, "shape": list(m.weights.shape), "encoding": "float32-base64",
            "weights": encode_f32(m.weights)}


def all_maps(maps) -> dict:
    """Every head's map (an :class:`~qkv.explain.AttentionMaps`): weights (L, H, U, U)."""
    return {"kind": "maps", "model": maps.model, "units": maps.units.labels,
            "special": list(maps.units.special), "words": maps.units.words,
            "shape": list(maps.weights.shape), "encoding": "float32-base64",
            "weights": encode_f32(maps.weights)}


def probe(result) -> dict:
    return {**result.to_dict(), "kind": "probe"}


def cross(ca) -> dict:
    counts = ca.alignment()
    return {**ca.to_dict(), "kind": "cross", "num_layers": len(ca.layers),
            "alignment": counts[list(ca.layers)].tolist() if counts is not None else None}


def cross_steps(cs) -> dict:
    return {**cs.to_dict(), "kind": "cross_steps"}


def of_result(result) -> tuple[str, dict, dict]:
    """(endpoint, request fields, answer) for a result a notebook shows (``_repr_html_``)."""
    name = type(result).__name__
    if name == "Overview":
        return "overview", {"token": result.unit, "words": result.units.words,
                            "method": "weight"}, overview(result)
    if name == "HeadSteps":
        index = result.token_index
        fields = {"token": index, "layer": result.layer, "head": result.head, "words": False}
        return "steps", fields, steps(result)
    if name == "AttentionMap":
        return "map", {"layer": result.layer, "head": result.head, "words": result.units.words}, \
            head_map(result)
    if name == "CrossAttention":
        return "cross", {"token": result.token}, cross(result)
    if name == "CrossHeadSteps":
        fields = {"token": result.french_index, "layer": result.steps.layer, "head": result.steps.head}
        return "cross_steps", fields, cross_steps(result)
    raise TypeError(f"no page for a {name}")
