"""Which [`MixerKind`][qkv.models.protocol.MixerKind] a transformers module is, read off what it
holds.

Softmax-kind mixers are found by what reaches qkv's attention function (the adapter lists the
calls): `indices=` handed with the call (an indexer's top-k keys) makes it `sparse`, two
calls of one module in one forward `differential`, a latent kv rank in the config (the size
MLA's low-rank kv projection is built with) `mla`, else `softmax`.

The others run transformers' own code and are recognised by the state they carry — the names
come from their papers' reference code, which transformers keeps so checkpoints load:

========================  ===========================================================================
`mamba2`                a per-head decay `A_log` (h,) and a skip `D` beside a causal convolution
                          (Mamba-2: Bamba, Nemotron-H, Falcon-H1, Granite 4, Zamba2)
`mamba1`                the same with `A_log` per channel and state (d, n): Mamba-1 (Jamba)
`gated_deltanet`        `A_log` and a per-head `dt_bias`, no skip, beside a convolution
                          (Qwen3-Next / 3.5, OLMo hybrid)
`kda`                   `A_log` with a per-channel `dt_bias` (a decay per key channel: Kimi)
`lightning`             a per-head decay `slope_rate` held as a buffer (MiniMax)
`short_conv`            a depthwise causal `Conv1d` between linear maps, no state (LFM2)
========================  ===========================================================================

A softmax layer's output gate (a `q_proj` making each head's query and gate side by side:
Qwen3-Next / 3.5) is found here too (`output_gate`), once, as the adapter builds the layer's
attention (`HFAttention.output_gate`).

A kind added later is recognised by a function of its own, `register_recogniser(kind,
recognises)`, asked before the table above (a taken kind raises).
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from qkv.models.protocol import MixerKind, OutputGate

#: config fields that give a latent (low-rank) kv projection: multi-head latent attention
LATENT_KV = ("kv_lora_rank",)


def _named(module: nn.Module, name: str):
    """The parameter or buffer `name` held by `module` or one of its children that is not a
    module of its own kind (Kimi keeps `A_log` in a gate child), or None."""
    for full, value in (*module.named_parameters(), *module.named_buffers()):
        if full == name or full.endswith("." + name):
            return value
    return None


def _convolves(module: nn.Module) -> bool:
    """Whether a depthwise 1-D convolution (one filter per channel) is a direct child."""
    return any(isinstance(c, nn.Conv1d) and c.groups == c.in_channels > 1 for c in module.children())


#: the names of kinds registered after the table of the module doc → whether a module is one (by
#: what it holds)
RECOGNISERS: dict[str, Callable[[nn.Module], bool]] = {}


def register_recogniser(kind: MixerKind, recognises: Callable[[nn.Module], bool]) -> None:
    """Make `stateful_kind` answer `kind` for the modules `recognises(module)` is true of (asked
    of every module of a layer, outermost first: true of the mixer itself, not of what holds it).
    A kind already recognised raises."""
    if not isinstance(kind, MixerKind) or kind.softmax:
        raise ValueError(f"a recogniser is for a non-softmax MixerKind, got {kind!r}")
    if kind.value in RECOGNISERS:
        raise ValueError(f"mixer kind {kind.value!r} already has a recogniser")
    RECOGNISERS[kind.value] = recognises


def stateful_kind(module: nn.Module) -> MixerKind | None:
    """The kind of a non-softmax token mixer, or None when `module` is not one (see the
    module doc); a module holding one (a decoder layer) is not one itself."""
    for kind, recognises in RECOGNISERS.items():
        if recognises(module):
            return MixerKind(kind)
    own = dict(module.named_parameters(recurse=False)) | dict(module.named_buffers(recurse=False))
    if "slope_rate" in own:
        return MixerKind.LIGHTNING
    if not _convolves(module):
        return None
    a_log, dt_bias = _named(module, "A_log"), _named(module, "dt_bias")
    if a_log is None:
        linears = sum(isinstance(c, nn.Linear) for c in module.children())
        return MixerKind.SHORT_CONV if linears >= 2 else None
    if "D" in own:  # Mamba-1 keeps a decay per channel and state, Mamba-2 one per head
        return MixerKind.MAMBA1 if a_log.dim() == 2 else MixerKind.MAMBA2
    if dt_bias is not None and dt_bias.numel() > a_log.numel():
        return MixerKind.KDA
    return MixerKind.GATED_DELTANET


def softmax_kind(config, *, calls: int, indexed: bool) -> MixerKind:
    """The kind of a module that called qkv's attention `calls` times in one forward,
    `indexed` when an indexer's keys came with the call."""
    if indexed:
        return MixerKind.SPARSE
    if calls > 1:
        return MixerKind.DIFFERENTIAL
    if any(isinstance(getattr(config, k, None), int) for k in LATENT_KV):
        return MixerKind.MLA
    return MixerKind.SOFTMAX


def output_gate(module: nn.Module, *, heads: int, head_dim: int) -> OutputGate | None:
    """The [`OutputGate`][qkv.models.protocol.OutputGate] of a softmax attention `module` with
    `heads` heads of width `head_dim`, or None: its `q_proj` is not a Linear twice the heads'
    width beside an `o_proj` Linear reading h·d channels (transformers' `Qwen3NextAttention`,
    `Qwen3_5Attention` and their kin make query and gate in one projection)."""
    children = dict(module.named_children())
    q, o = children.get("q_proj"), children.get("o_proj")
    if not (isinstance(q, nn.Linear) and isinstance(o, nn.Linear)):
        return None
    if q.out_features != 2 * heads * head_dim or o.in_features != heads * head_dim:
        return None
    return OutputGate(q_proj=q, o_proj=o, heads=heads, head_dim=head_dim)


__all__ = ["LATENT_KV", "RECOGNISERS", "output_gate", "register_recogniser", "softmax_kind", "stateful_kind"]
