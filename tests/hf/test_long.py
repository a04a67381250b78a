"""A 16k-token sliding-window model through attn_implementation="qkv": the window reaches qkv as
structure and every layer runs blockwise (O(N · window) scores; eager/sdpa would draw and fill
(N × N) = 256M entries per head)."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")  # the qkv[hf] extra
import torch  # noqa: E402

import qkv.attention.functional as functional  # noqa: E402
from archs import DECODERS, build, twins  # noqa: E402


N = 16384


def test_16k_sliding_window_runs_blockwise(monkeypatch):
    chosen = []
    real = functional.choose_backend
    monkeypatch.setattr(functional, "choose_backend",
                        lambda *a, **k: chosen.append((a[2], real(*a, **k))) or chosen[-1][1])
    model = build(DECODERS, "mistral")
    model.config.sliding_window = 64
    _, _, ours = twins(model)
    ids = torch.randint(0, 99, (1, N), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = ours(input_ids=ids, logits_to_keep=4).logits
    assert torch.isfinite(logits).all()
    assert [backend for _, backend in chosen] == ["blockwise"] * model.config.num_hidden_layers
    assert all(m.window[0] == 63 and m.causal and m.dense is None for m, _ in chosen), chosen
