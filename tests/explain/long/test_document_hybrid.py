"""`document()` on a hybrid whose linear layers keep no lse to record: one line naming the
layer and its mixer (issue 40 item 6: a new surface's bad input is never a traceback), before
any memory estimate reads an attention the layer does not have."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")  # the qkv[hf] extra

import qkv  # noqa: E402
from hybrids import save_hybrid  # noqa: E402
from qkv.explain.wording import ArgumentError  # noqa: E402


@pytest.mark.parametrize("name", ["qwen3_5", "lfm2"])
def test_document_on_a_hybrid_names_the_layer_no_softmax_mixes(name, tmp_path):
    save_hybrid(name, tmp_path)
    model = qkv.load(tmp_path)
    first = next(i for i, p in enumerate(model.parts.layers) if not any(m.kind.softmax for m in p.mixers))
    with pytest.raises(ArgumentError) as err:
        qkv.explain.document(model, "the cat sat on the mat . a red dog")
    message = str(err.value)
    assert "\n" not in message and f"layer {first} " in message
    assert model.parts.layers[first].mixers[0].kind.value in message
