"""The residual stream by component: what each upstream part wrote into a layer's input.

For a traced forward, the vector entering layer ℓ at position i is the sum of

    embed.token      what each embedding table wrote (:mod:`.embed`): the token's row, and
    embed.position   the position's and the segment's where the model adds them, through the
    embed.type       embedding's norm where it has one (``embed``: hidden_states[0] whole where
                     the tables are not found or do not rebuild it)
    L{l}.H{h}        head h of an earlier layer l: its output o^{l,h}_i through W_O^h  (E,)
    L{l}.ffn         the feed-forward of an earlier layer l
    L{l}.{kind}      the whole branch of an earlier hybrid layer's mixer that qkv's attention
                     does not run (``L0.gated_deltanet``, ``L2.mamba2``): x + mix − x, one
                     component (its effective map is per head, but its output projection and
                     gated norm mix the heads); a feed-forward-only layer (Nemotron-H) has only
                     its ``ffn``
    bias             what no upstream part writes: output-projection biases, norm offsets β

Pre-norm layers (GPT-2, Llama) add their parts:

```text
x_{l+1} = x_l + Σ_h o^{l,h} W_O^h + b_O + ffn_l,     ffn_l = x_{l+1} − (x_l + attn_l)
```

with `x_l + attn_l` the residual the forward recorded (`LayerTrace.residual`) and the heads'
outputs those it recorded (`MultiHeadTrace.heads`). Post-norm layers (BERT, MiniLM) normalise
each sum; each norm is frozen at the scale that forward computed (`norms`), so every
component c is carried through as (c − mean(c)) · γ/σ and β joins `bias`:

```text
y_l     = norm1(x_l + attn_l)        (recorded: LayerTrace.residual)
x_{l+1} = norm3(y_l + ff(y_l))       (y_l + ff(y_l): recorded in LayerTrace.ffn_sum by a
                                      transformers layer; qkv's own runs ff on y_l)
```

A norm on a branch (OLMo 2, Gemma 2, OLMo hybrid: `ResidualForm.BRANCH_NORM`) is frozen the
same way, at the branch it read (the heads' writes rebuilt), so each head's write is carried
through it; a scaled layer (MiniMax, Granite: `ResidualForm.SCALED`) multiplies each part by
its factor, through n₁ (n₃) frozen first where it takes its residual after the norm (MiniMax):

```text
branch_norm   x_{l+1} = x_l + p₁(Σ_h o^{l,h} W_O^h + b_O) + ffn_l,   ffn_l = x_{l+1} − y_l
scaled        y_l = α₁·n₁(x_l) + β₁·(Σ_h o^{l,h} W_O^h + b_O),   x_{l+1} = α₃·n₃(y_l) + ffn_l
```

(y_l recorded in `LayerTrace.residual`; a hybrid mixer's branch is y_l − (its residual part),
one component, as above). A layer whose attention reads n₁([x; e]), e what entered layer 0,
and adds its output only through its other parts (Zamba2's hybrid layer: x + mamba(n(x +
W·ff(attn(n₁([x; e])))))) writes as one component, x_{l+1} − x_l: no head's write enters the
stream linearly.

Every step is per token, so the stream is built for the positions asked only (a 16k-token
document is split by positions in chunks). `stream` checks that the components sum to the
recorded hidden state (to the forward's rounding) and raises otherwise.

Examples:
    >>> import qkv, torch
    >>> from qkv.explain.contributions.base import run
    >>> lm = qkv.load("lm")
    >>> ids = torch.tensor([lm.tokenizer.encode("the cat sat").ids])
    >>> st = stream(lm, run(lm, ids, torch.tensor([0])), 2, torch.arange(ids.shape[1]))
    >>> st.names[:3], st.parts.shape[0] == len(st.names)
    (('embed.token', 'L0.H0', 'L0.H1'), True)
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Protocol

import torch

from qkv.errors import QkvError
from qkv.explain.circuits import embed
from qkv.explain.circuits.parts import parts_of
from qkv.explain.circuits.norms import linearise, rebuilds
from qkv.explain.contributions.base import check_layers, out_bias
from qkv.explain.mixers import gate
from qkv.explain.wording import ArgumentError
from qkv.models.protocol import MixerKind, ResidualForm

BIAS = "bias"
#: The softmax kinds whose scores `score_attribution` splits.
SPLIT_KINDS = (MixerKind.SOFTMAX, MixerKind.MLA, MixerKind.SPARSE)
#: The forms whose branches `stream` carries through a frozen norm or a factor.
BRANCHED = (ResidualForm.BRANCH_NORM, ResidualForm.SCALED)


def head_name(layer: int, head: int) -> str:
    return f"L{layer}.H{head}"


def ffn_name(layer: int) -> str:
    return f"L{layer}.ffn"


def names(model, layer: int, embedding: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """The components of layer `layer`'s input, in order: the embedding's (`embedding`, as
    `embed.split` gave them; default `embed.names`), each earlier layer's heads and
    feed-forward, `bias` last (C names)."""
    out = list(embed.names(model) if embedding is None else embedding)
    for ell in range(layer):
        attn = model.layers[ell].self_attn
        if parts_of(model).layers[ell].reads_embeddings:  # Zamba2's hybrid layer: one component
            out.append(mixer_name(model, ell))
            continue
        mixed = [head_name(ell, h) for h in range(attn.num_heads)] if attn is not None else \
            [mixer_name(model, ell)] if parts_of(model).layers[ell].mixers else []
        out += mixed + [ffn_name(ell)]
    return (*out, BIAS)


def mixer_name(model, layer: int) -> str:
    """`L{l}.{kind}`: the branch of a layer whose mixer qkv's attention does not run."""
    return f"L{layer}." + "+".join(m.kind.value for m in parts_of(model).layers[layer].mixers)


@dataclass(frozen=True)
class Stream:
    """Layer `layer`'s input at `positions` (n,), split: `parts` (C, n, E) float64 with
    one row per name of `names` (`bias` last); `parts.sum(0)` is `recorded` (n, E), the
    hidden state the forward recorded, to within `error` (max abs)."""

    layer: int
    positions: torch.Tensor
    names: tuple[str, ...]
    parts: torch.Tensor
    recorded: torch.Tensor

    @property
    def error(self) -> float:
        """max |Σ parts − recorded| (read when asked: `stream` checked it is rounding)."""
        if not self.parts.numel():
            return 0.0
        return float((self.parts.sum(0) - self.recorded.double()).abs().max())


def out_weight(attn) -> torch.Tensor:
    """(h, dv, E) W_O per head, from the output projection (native or transformers)."""
    w = attn.out_proj.weight  # (E, h·dv)
    return w.view(w.shape[0], attn.num_heads, -1).permute(1, 2, 0)


def check(model, upto: int | None = None) -> None:
    """QkvError naming what `stream` cannot read in `model`: in every layer (`upto` None), or
    in the layers before `upto` — the ones the input of layer `upto` is made of — and, of layer
    `upto` itself, whether its attention reads that input as x + attn's layers do (remembered
    per model, its layers and `upto` once passed: it reads the layers' kinds, not their weights)."""
    key = (upto, tuple(map(id, model.layers)))
    passed = _PASSED.get(model)
    if passed is not None and key in passed:
        return
    _check(model, upto)
    _PASSED.setdefault(model, set()).add(key)


# The (`upto`, its layers) each model passed `check` for (an attribution checks before it splits,
# then `stream` does).
_PASSED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _check(model, upto: int | None) -> None:
    check_layers(model, "circuits", hybrid=True)
    for i, layer in enumerate(model.layers[: None if upto is None else upto + 1]):
        attn = layer.self_attn
        writes = i != upto  # its heads' writes and its output are read (not the query layer's)
        branched = parts_of(model).layers[i].residual in BRANCHED
        if parts_of(model).layers[i].reads_embeddings:  # n₁([x; e]) read; its write one component
            continue
        if branched:  # its attention reads n₁(x) (or x: norm1 None); its branches are carried
            if writes and attn is not None and attn.out_proj is None:
                raise QkvError(f"{model.name}: layer {i}'s output projection was not found; the heads' "
                               f"writes into the residual stream cannot be read")
            continue
        if attn is None:  # a hybrid's own mixer (one component) or a feed-forward-only layer
            if parts_of(model).layers[i].mixers and not (layer.norm_first and layer.sequential_residual):
                raise QkvError(f"{model.name}: layer {i} ({mixer_name(model, i)}) does not form x + mix "
                               f"before its feed-forward ({layer.residual_note or 'its own forward'}); "
                               f"its residual stream cannot be split by component")
            continue
        if writes and attn.out_proj is None and not _gated(layer):
            raise QkvError(f"{model.name}: layer {i}'s output projection was not found; the heads' "
                           f"writes into the residual stream cannot be read")
        if layer.norm_first and not layer.sequential_residual:
            how = layer.residual_note or "its own forward"  # what it forms instead, in words
            raise QkvError(f"{model.name}: layer {i} ({type(layer).__name__}) does not form "
                           f"x + attn before its feed-forward ({how}); its residual stream cannot "
                           f"be split by component")
        if writes and not layer.norm_first and layer.norm3 is None:
            raise QkvError(f"{model.name}: layer {i} is post-norm and no norm after its "
                           f"feed-forward was found; its residual stream cannot be split by "
                           f"component")


def check_query_layer(model, layer: int) -> MixerKind | None:
    """The kind of the layer's softmax-kind mixer (softmax; MLA: content + RoPE parts of latents;
    sparse: MLA over an indexer's keys), None for a layer without one; ArgumentError naming a
    kind whose scores are not split by component (differential: two maps) — one line, before
    any projection is read."""
    kinds = [m.kind for m in parts_of(model).layers[layer].mixers if m.kind.softmax]
    if not kinds or kinds[0] in SPLIT_KINDS:
        return kinds[0] if kinds else None
    raise ArgumentError("layer", "{name} {value} of {model} mixes its tokens by {kind}: its scores "
                        "are not split by component yet (its step by step: qkv.explain.mixers."
                        "mixer({kind!r}).read)", value=layer, model=model.name, kind=kinds[0].value)


def _gated(layer) -> bool:
    """Whether a pre-norm layer that forms x + attn gates its heads' outputs after the weights
    (Qwen3-Next, 3.5: `mixers.gate`), so its heads' writes are read through the gate."""
    attn = layer.self_attn  # a transformers layer's (qkv's own always has its out_proj)
    return layer.norm_first and layer.sequential_residual and gate.output_gate(attn) is not None


def _heads(fwd, ell: int, attn, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """((h, n, E) each head's write o^{l,h}_i W_O^h at the positions, (E,) the output bias);
    a gated head's o is its gated output (`gate.OutputGate.writes`)."""
    trace = fwd.traces[ell].self_attn
    if attn.out_proj is None:  # `check` let only a gated layer through
        g = gate.output_gate(attn)
        return g.writes(trace.key_input[0, positions], trace.heads[0, positions]), g.out_bias().double()
    return _plain_heads(fwd, ell, attn, positions), out_bias(attn).double()


def _plain_heads(fwd, ell: int, attn, positions: torch.Tensor) -> torch.Tensor:
    """(h, n, E) each head's write o^{l,h}_i W_O^h at the positions."""
    o = fwd.traces[ell].self_attn.heads[0, positions].double()  # (n, h·dv)
    o = o.view(o.shape[0], attn.num_heads, -1).transpose(0, 1)  # (h, n, dv)
    w, _ = linear64(attn.out_proj)  # (E, h·dv) float64, converted once
    return torch.bmm(o, w.view(w.shape[0], attn.num_heads, -1).permute(1, 2, 0))  # (h, n, E)


# A projection's rows in float64, kept per module while its weights stay the same (the weight's
# version counter moves on any in-place change): they do not depend on the text, and each
# attribution would otherwise convert them again. Kept only while small (KEEP_FLOAT64_BYTES a
# copy): on the shipped models (E ≤ 384, a W_O of ≤ 1.2 MB) a conversion is a sizeable share of a
# ~1 ms forward, while on a billion-parameter model one layer's (2048, 2048) conversion is ~5 ms
# against seconds of forward — and keeping every earlier layer's copy held +449 MiB on a 1.1B
# Llama (layer 11, 32 tokens) and +1,073 MiB on a 3B one (layer 14), for the model's lifetime.
KEEP_FLOAT64_BYTES = 8 << 20
_CONVERTED: "weakref.WeakKeyDictionary[torch.nn.Module, dict]" = weakref.WeakKeyDictionary()


class LinearMap(Protocol):
    """What `linear64` reads of a projection: `nn.Linear`'s `weight` (out, in) and `bias` (out,)
    or None — qkv's own projections, and the transformers adapter's `Projection` views."""

    weight: torch.Tensor
    bias: torch.Tensor | None


def linear64(proj: LinearMap, take: slice = slice(None)) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(W[take] (·, E), b[take] (·,) or None) of the linear map `proj` in float64, once per
    weights version where the copy is small (`KEEP_FLOAT64_BYTES`), else for this call."""
    weight, bias = proj.weight, proj.bias
    if weight[take].numel() * 8 > KEEP_FLOAT64_BYTES:  # large: converted for this call only
        return weight[take].detach().double(), None if bias is None else bias[take].detach().double()
    version = (weight._version, weight.data_ptr(), weight.dtype,
               None if bias is None else (bias._version, bias.data_ptr()))
    kept = _CONVERTED.setdefault(proj, {})
    where = (take.start, take.stop, take.step)
    if where not in kept or kept[where][0] != version:  # new, or the weights changed since
        kept[where] = (version, weight[take].detach().double(),
                       None if bias is None else bias[take].detach().double())
    return kept[where][1:]


def _ffn_sum(lay, trace, residual: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """(n, E) what a post-norm layer's `norm3` read, y + ff(y): recorded by the forward
    (`LayerTrace.ffn_sum`: a transformers layer), else qkv's own `feed_forward` run on the
    y the forward made."""
    if trace.ffn_sum is not None:
        return trace.ffn_sum[0, positions]
    return residual + lay.feed_forward(residual)


def _own_mixer(parts, fwd, ell: int, positions: torch.Tensor) -> torch.Tensor:
    """(2, n, E) the mixer's branch and the feed-forward's of a pre-norm layer qkv's attention
    does not run, from the recorded states (x + mix: `LayerTrace.residual`); (1, n, E) the
    feed-forward alone for a layer without a mixer."""
    before = fwd.hidden_states[ell][0, positions].double()  # (n, E)
    after = fwd.hidden_states[ell + 1][0, positions].double()  # (n, E)
    if not parts.mixers:  # a LayerParts
        return (after - before)[None]
    residual = fwd.traces[ell].residual[0, positions].double()  # (n, E) x + mix, as the forward made it
    return torch.stack([residual - before, after - residual])


def _branched(model, fwd, ell: int, positions: torch.Tensor, parts: torch.Tensor,
              bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(parts (C + 2, n, E), bias (n, E)): the components `parts` (C, n, E) and `bias` of a
    `branch_norm` or `scaled` layer's input carried to its output — its heads' writes (or its
    mixer's branch) and its feed-forward's appended."""
    lp, attn = parts_of(model).layers[ell], model.layers[ell].self_attn
    dtype = fwd.hidden_states[ell].dtype
    x = fwd.hidden_states[ell][0, positions]  # (n, E)
    y = fwd.traces[ell].residual[0, positions].double()  # (n, E) as the forward formed it
    after = fwd.hidden_states[ell + 1][0, positions].double()  # (n, E)
    scales = lp.scales

    def frozen(norm, at, parts, bias):  # norm frozen at `at` (n, E), carried on every part
        lin = linearise(norm, at)
        return lin.apply(parts), lin.apply(bias) + lin.shift

    if scales is not None:
        if scales.normed:  # MiniMax: the residual is n₁(x)
            parts, bias = frozen(lp.norms.mixer, x, parts, bias)
        parts, bias = scales.mixer_residual * parts, scales.mixer_residual * bias
    if attn is None:  # the mixer's branch, one component: y − what the residual carries
        parts = torch.cat([parts, (y - parts.sum(0) - bias)[None]])
    else:
        heads, b_out = _heads(fwd, ell, attn, positions)  # (h, n, E), (E,)
        b_out = b_out.expand_as(bias)  # (n, E)
        if scales is not None:
            heads, b_out = scales.mixer * heads, scales.mixer * b_out
        else:  # p₁ frozen at the branch it read: the heads' writes and b_O, rebuilt
            heads, b_out = frozen(lp.norms.post_mixer, (heads.sum(0) + b_out).to(dtype), heads, b_out)
        parts, bias = torch.cat([parts, heads]), bias + b_out
    if scales is not None:
        if scales.normed:  # the feed-forward's residual is n₃(y)
            parts, bias = frozen(lp.norms.feed_forward, y.to(dtype), parts, bias)
        parts, bias = scales.feed_forward_residual * parts, scales.feed_forward_residual * bias
    ffn = after - parts.sum(0) - bias  # (n, E): β₃·f(n₃(y)), or p₃(f(n₃(y)))
    return torch.cat([parts, ffn[None]]), bias


@torch.no_grad()
def stream(model, fwd, layer: int, positions: torch.Tensor) -> Stream:
    """The input of layer `layer` (0 … L; L: the last layer's output, before any final norm)
    at `positions`, split by component, from `fwd` (a
    `Forward` with the residuals and heads recorded)."""
    check(model, layer)
    positions = torch.as_tensor(positions).long()
    first = fwd.hidden_states[0][0, positions]  # (n, E)
    embedding, parts, bias = embed.split(model, fwd.ids[0], first, positions)  # (P, n, E), (n, E)
    for ell in range(layer):
        lay = model.layers[ell]
        attn = lay.self_attn
        if parts_of(model).layers[ell].reads_embeddings:  # the whole layer's write, out − x
            after, before = fwd.hidden_states[ell + 1][0, positions], fwd.hidden_states[ell][0, positions]
            parts = torch.cat([parts, (after.double() - before.double())[None]])
            continue
        if parts_of(model).layers[ell].residual in BRANCHED:
            parts, bias = _branched(model, fwd, ell, positions, parts, bias)
            continue
        if attn is None:
            parts = torch.cat([parts, _own_mixer(parts_of(model).layers[ell], fwd, ell, positions)])
            continue
        heads, b_out = _heads(fwd, ell, attn, positions)  # (h, n, E), (E,)
        residual = fwd.traces[ell].residual[0, positions]  # (n, E) as the forward made it
        after = fwd.hidden_states[ell + 1][0, positions]  # (n, E)
        if lay.norm_first:  # x + attn + ffn, the ffn read off the recorded states
            ffn = (after.double() - residual.double())[None]  # (1, n, E)
            parts = torch.cat([parts, heads, ffn])
            bias = bias + b_out
        else:  # post-norm: norm1 then norm3, each frozen at the forward's own scale
            parts = torch.cat([parts, heads])
            bias = bias + b_out
            summed = parts.sum(0) + bias  # (n, E): x + attn, rebuilt
            lin = linearise(lay.norm1, summed.to(residual.dtype))
            parts, bias = lin.apply(parts), lin.apply(bias) + lin.shift
            summed = _ffn_sum(lay, fwd.traces[ell], residual, positions)  # (n, E): y + ff(y)
            lin = linearise(lay.norm3, summed)
            parts = torch.cat([parts, (summed.double() - residual.double())[None]])
            parts, bias = lin.apply(parts), lin.apply(bias) + lin.shift
    parts = torch.cat([parts, bias[None]])  # (C, n, E)
    want = fwd.hidden_states[layer][0, positions]
    total = parts.sum(0)
    if not rebuilds(total, want):
        raise QkvError(f"{model.name}: the components of layer {layer}'s input do not sum to the "
                       f"forward's (max diff {float((total - want.double()).abs().max()):.3g})")
    return Stream(layer, positions, names(model, layer, embedding), parts, want)


__all__ = ["BIAS", "BRANCHED", "Stream", "check", "check_query_layer", "ffn_name", "head_name", "mixer_name", "names", "out_weight",
           "stream"]
