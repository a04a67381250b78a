"""What the page receives for a [`qkv.explain`][qkv.explain] result: its `to_dict()`, which is
complete and carries its `kind` (whole maps travel as float32 base64).

Used by the API (`qkv.view.api`), the export and the notebook display
(`qkv.view.notebook`) alike, so a notebook and a browser get the same answer for the same
result.

"""

from __future__ import annotations

import base64

from qkv.explain.kinds import kind_of
from qkv.explain.mixer_maps import EffectiveMap
from qkv.models.tokenizer import display_text, display_token


def encode_f32(t) -> str:
    """A tensor as base64 of its little-endian float32 bytes, row-major (the page decodes it
    with `new Float32Array`)."""
    import torch

    return base64.b64encode(t.detach().to(torch.float32).contiguous().numpy().astype("<f4").tobytes()).decode()


def head_map(m) -> dict:
    """One head's map (an [`AttentionMap`][qkv.explain.AttentionMap], or a linear / state-space
    layer's `EffectiveMap` with its marks: signed, its row sums), weights
    as float32 base64."""
    marks = m.marks() if isinstance(m, EffectiveMap) else {}
    return {"kind": m.kind, "model": m.model, "text": m.text, "units": m.units.labels,
            "special": list(m.units.special), "words": m.units.words, "layer": m.layer,
            "head": m.head, "shape": list(m.weights.shape), "encoding": "float32-base64",
            "weights": encode_f32(m.weights), **marks}


def all_maps(maps) -> dict:
    """Every head's map (an [`AttentionMaps`][qkv.explain.AttentionMaps]): weights (L, H, U, U)."""
    return {"kind": maps.kind, "model": maps.model, "units": maps.units.labels,
            "special": list(maps.units.special), "words": maps.units.words,
            "shape": list(maps.weights.shape), "encoding": "float32-base64",
            "weights": encode_f32(maps.weights)}


def document_overview(r) -> dict:
    """A document's overview (`DocumentOverview`): every
    head's row over the N keys as one float32 (rows, N) array, in the order of `heads`."""
    import torch

    d = r.to_dict()
    for head in d["heads"]:
        del head["weights"]
    d["shape"] = [len(r.overview.rows), len(r.overview.units)]
    d["encoding"] = "float32-base64"
    d["weights"] = encode_f32(torch.stack([row.weights for row in r.overview.rows]))
    if "scores" in d:  # a method's raw scores (L, h, N): the same numbers as bytes
        d["scores"] = encode_f32(r.overview.scores.double().mean(-2))
        d["scores_shape"] = list(r.overview.scores.shape[:-2]) + [r.overview.scores.shape[-1]]
    return d


def values_as_bytes(r) -> dict:
    """A result whose numbers are one tensor (its `values` field names it: a block map's tiles,
    rows of weights, received sums): that tensor as float32 base64, the rest (`header()`) JSON."""
    return r.header() | {r.values: encode_f32(getattr(r, r.values)), "encoding": "float32-base64"}


# How each row of qkv.explain.kinds.KINDS is sent, by its ``encoding``: whole maps travel as float32
# bytes (a 512-token text's maps in JSON numbers would be ~10× larger), and so do a long document's
# rows, tiles and column sums (N numbers each); everything else is its ``to_dict()``.
ENCODINGS = {"json": lambda r: r.to_dict(), "map": head_map, "maps": all_maps,
             "document-overview": document_overview, "values": values_as_bytes}


def answer(result) -> dict:
    """What the page receives for `result`: as its row's `encoding` says (its `to_dict()`,
    complete, with its `kind`; or for whole maps the same numbers as float32 base64), with
    `labelled`'s display labels beside its token strings."""
    return labelled(ENCODINGS[kind_of(result).encoding](result))


# an answer's token strings (the tokenizer's: "Ġdog", "Ċ") → the field of their display labels
TOKEN_LISTS = {"tokens": "labels", "source": "source_labels", "target": "target_labels"}


def labelled(d: dict) -> dict:
    """`d` with the display text of each of its token lists (`TOKEN_LISTS`) beside it, as
    [`display_token`][qkv.models.tokenizer.display_token] gives it: the page shows these, never a
    raw `Ġ` or `Ċ`; the raw tokens stay, as the result has them.

    Examples:
        >>> labelled({"tokens": ["<bos>", "Ġdog", "Ċ"]})["labels"]
        ['<bos>', 'dog', '↵']
    """
    for raw, shown in TOKEN_LISTS.items():
        tokens = d.get(raw)
        if isinstance(tokens, list) and all(isinstance(t, str) for t in tokens):
            d[shown] = [display_token(t) for t in tokens]
    return d


def saved_labelled(d: dict) -> dict:
    """A saved atlas's `to_dict()` (`qkv atlas --json`) with each context's key shown as a
    label (`key_label`: [`display_text`][qkv.models.tokenizer.display_text] — a newline key is `↵`);
    any other saved result as it is.

    Examples:
        >>> ctx = {"query": 3, "key": 2, "weight": 0.5, "distance": 1, "text": "a b", "key_text": "\\n"}
        >>> saved_labelled({"kind": "atlas", "heads": [{"contexts": [ctx]}]})["heads"][0]["contexts"][0]["key_label"]
        '↵'
    """
    if d.get("kind") == "atlas":
        for head in d.get("heads", []):
            for c in head.get("contexts", []):
                c["key_label"] = display_text(c["key_text"])
    return d


def of_result(result) -> tuple[str, dict, dict]:
    """(endpoint, request fields, answer) for a result shown on its own (a notebook, an export):
    its row of `qkv.explain.kinds.KINDS` says where the page opens."""
    row = kind_of(result)
    if row.endpoint is None or row.request is None:
        raise ValueError(f"a {row.name} result has no panel in the viewer")
    return row.endpoint, row.request(result), answer(result)
