"""Exact explanations of the token mixers of 2026's hybrid models, one file per mixer.

Linear and state-space layers (Gated DeltaNet, KDA, lightning, Mamba-1 and -2, LFM2's gated short
convolution) have no softmax map, but each is linear in its values: o = M·v for one (t × t)
matrix M per head, causal, signed, rows not normalised. `read(module, hidden_states)` runs the
transformers layer once and returns a record (an `EffectiveAttention`,
`qkv.explain.mixers.linear`) whose `matrix(head)` is that M and `row(head, query)` one row in
O(t · state). Softmax variants (MLA, differential, sparse indexed attention, the gated output)
return their own step-by-step records; a softmax layer's output gate (Qwen3-Next, Qwen3.5) is
`qkv.explain.mixers.gate`, a step of that layer rather than a mixer of its own.

`MIXERS` is the registry, keyed by the model protocol's `MixerKind` name; callers look a
kind up there (`mixer`) and never compare kind names themselves.

Examples:
    >>> mixer("mamba2").effective
    True
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from qkv.errors import QkvError
from qkv.explain.mixers import differential, gated_deltanet, kda, lightning, mamba1, mamba2, mla, short_conv, sparse
from qkv.explain.mixers.linear import EffectiveAttention  # noqa: F401  (what every effective record derives from)
from qkv.models.protocol import MixerKind


@dataclass(frozen=True)
class Mixer:
    """One kind of token mixer: how its record is read from a transformers layer."""

    kind: str
    read: Callable[..., Any]  # (module, hidden_states, …) → the kind's record
    effective: bool           # the record is an EffectiveAttention (o = M·v), not a softmax map
    summary: str
    # a softmax variant whose map is a signed combination of its softmax maps, o = M·v (differential
    # attention: A₁ − λ·A₂): (module, hidden_states, **the layer's call) → a record with `heads`,
    # `values`, `matrix` and `output`, read from qkv's own attention (a model from qkv.load)
    traced: Callable[..., Any] | None = None


MIXERS: dict[str, Mixer] = {}


def register_mixer(entry: Mixer) -> Mixer:
    """Add the explanation of a mixer kind (a [`MixerKind`][qkv.models.protocol.MixerKind] name,
    registered first); a taken name raises (no silent replacement)."""
    MixerKind(entry.kind)  # ValueError naming the known kinds
    if entry.kind in MIXERS:
        raise ValueError(f"mixer kind {entry.kind!r} is already registered")
    MIXERS[entry.kind] = entry
    return entry


def mixer(kind: str) -> Mixer:
    """The registered `Mixer` of `kind`; QkvError naming the known kinds otherwise."""
    try:
        return MIXERS[kind]
    except KeyError:
        raise QkvError(f"no explanation for mixer kind {kind!r}; known: {', '.join(sorted(MIXERS))}") from None


for _entry in (
    Mixer("gated_deltanet", gated_deltanet.read, True, "the gated delta rule, one decay per head"),
    Mixer("kda", kda.read, True, "the gated delta rule, one decay per key channel"),
    Mixer("lightning", lightning.read, True, "linear attention with a fixed decay per head"),
    Mixer("mamba2", mamba2.read, True, "Mamba-2's SSD: C·(Π exp ΔA)·B·Δ plus the D skip, a decay per head"),
    Mixer("mamba1", mamba1.read, True, "Mamba-1's selective scan (Jamba): the same per channel, a decay per state"),
    Mixer("short_conv", short_conv.read, True, "a causal band: C·(w ∗ B·x), one mixer per channel"),
    Mixer("mla", mla.read, False, "latent q and kv; a score = content part + RoPE part"),
    Mixer("sparse", sparse.read, False, "an indexer keeps the top-k keys of each query for the softmax"),
    Mixer("differential", differential.read, False, "two softmax maps, the second × λ subtracted",
          traced=differential.read_traced),
):
    register_mixer(_entry)
