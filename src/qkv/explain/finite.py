"""Refuse to explain numbers that are not numbers: the first NaN or infinity in a forward, named.

A model whose weights hold NaN (a run trained with a NaN loss, a corrupted file) still runs: every
number after the first NaN is NaN, and an explanation would print NaN weights, rank heads by NaN
and sort garbage. The explainer checks each traced forward here, in the order the model computed
it, and raises `NonFiniteError` (a `QkvError`) naming where the first non-finite number
appeared:

    layer 2, head 3: its query projection (q_proj) is not finite although its input is
    layer 1's attention heads are finite but the next layer's input holds NaN (its feed-forward)
    the embeddings hold NaN (the layers never saw a finite input)

Examples:
    >>> import torch
    >>> describe(torch.tensor([1.0, float("nan")]))
    'NaN'
"""

from __future__ import annotations

import torch

from qkv.errors import QkvError
from qkv.modules.writes import WeightsTrace


class NonFiniteError(QkvError):
    """The model computed NaN or infinity; the message names the first layer and head."""


def describe(t: torch.Tensor) -> str:
    """`"NaN"` if `t` holds a NaN, else `"infinity"`."""
    return "NaN" if torch.isnan(t).any() else "infinity"


def _finite(t: torch.Tensor | None) -> bool:
    # A sum holding NaN or ±infinity is not finite, so a finite sum clears `t` without
    # `isfinite(t)`'s temporaries (a float and two bools of t's size); only a sum that is not
    # finite — a non-finite entry, or finite ones overflowing — needs the entrywise check.
    if t is None or not t.is_floating_point():
        return True
    return bool(torch.isfinite(t.sum())) or bool(torch.isfinite(t).all())


PROJECTIONS = (("query", "query projection (q_proj)"), ("key", "key projection (k_proj)"),
               ("value", "value projection (v_proj)"))
"""The projected tensors of an attention trace, in the order a forward computes them."""


def check_layers(layer_traces, *, model: str = "the model", part: str = "",
                 output: torch.Tensor | None = None) -> None:
    """Walk `layer_traces` (one `LayerTrace` per layer, in order) and raise
    `NonFiniteError` at the first non-finite number, in the order the forward made it:

    1. the layer's input — every row (`key_input`/`value_input` hold them all, not only the
       traced rows' `query_input`): the embeddings for layer 0, else the previous layer;
    2. each head's projected queries, keys and values (q_proj, k_proj, v_proj told apart);
    3. its attention weights, then its output (weights · v);
    4. the layer's output: the heads' concatenation through `out_proj` (the residual the
       attention hands on) or, that being finite, the feed-forward.

    A layer that recorded its rows' weights alone (`trace_rows=Weights`, a `WeightsTrace`) is
    checked by them: a NaN there is named at that layer "or before" (where it started is not
    recorded; the whole trace names it).

    Args:
        layer_traces: the traces of one layer stack (`StackOutput.traces`).
        model: the model's name, for the message.
        part: `"encoder "`/`"decoder "` for a model with two stacks, else `""`.
        output: the stack's last hidden state (b, t, E), checked after the last layer.
    """
    previous = None  # the layer trace whose output the next input is: (index, trace)
    for layer, trace in enumerate(layer_traces):
        if trace is None:  # a layer the forward ran untraced (a one-layer trace: LayerRows)
            continue
        for kind, mh in (("self_attn", trace.self_attn), ("cross_attn", trace.cross_attn)):
            if mh is None:
                continue
            if isinstance(mh, WeightsTrace):  # its rows' weights alone (`trace_rows=Weights`)
                _check_weights(mh.weights, model=model, at=f"{part}layer {layer}")
                previous = (layer, trace, mh)
                continue
            inputs = (mh.query_input,) if kind == "cross_attn" else (
                mh.query_input, mh.key_input, mh.value_input)  # cross: keys are the encoder's
            for x in inputs:
                if not _finite(x):
                    raise NonFiniteError(_input_message(model, part, previous, x))
            _check_heads(mh.attention, model=model, at=f"{part}layer {layer}",
                         what="cross-attention" if kind == "cross_attn" else "attention")
            previous = (layer, trace, mh)
    if output is not None and not _finite(output):
        raise NonFiniteError(_input_message(model, part, previous, output, final=True))


def _check_heads(attention, *, model: str, at: str, what: str) -> None:
    """One attention call's projections, weights and output, each head named (b, h, ·, ·)."""
    cross = "cross-attention " if what == "cross-attention" else ""
    projected = dict(query=attention.query, key=attention.key, value=attention.value)
    steps = [*((projected[f], f"{cross}{name} is") for f, name in PROJECTIONS),
             (attention.weights, f"{what} weights are"), (attention.output, f"{what} output is")]
    for x, name in steps:
        if _finite(x):
            continue
        bad = ~torch.isfinite(x)  # (b, h, ·, ·)
        head = int(bad.flatten(2).any(-1).any(0).nonzero()[0]) if x.ndim >= 3 else 0
        raise NonFiniteError(
            f"{model} computes {describe(x)} at {at}, head {head}: its {name} not finite although "
            f"its input is; the model's weights hold NaN or infinity (e.g. trained with a NaN "
            f"loss), so there is nothing true to explain")


def _check_weights(weights: torch.Tensor, *, model: str, at: str) -> None:
    """A layer that kept only its rows' weights (b, h, r, s): where a non-finite number in them
    started (its input, a projection) was not recorded, so the message says at or before."""
    if _finite(weights):
        return
    head = int((~torch.isfinite(weights)).flatten(2).any(-1).any(0).nonzero()[0])
    raise NonFiniteError(
        f"{model} computes {describe(weights)} at {at} or before, head {head}: its attention "
        f"weights are not finite (only the weights were recorded there); the model's weights "
        f"hold NaN or infinity (e.g. trained with a NaN loss), so there is nothing true to explain")


def _input_message(model: str, part: str, previous, t: torch.Tensor, final: bool = False) -> str:
    if previous is None:
        where = f"the {part}embeddings hold {describe(t)}"
    else:
        layer, trace, mh = previous
        after = "its output" if final else "the next layer's input"
        # the heads are finite (checked); out_proj turns them into what the residual adds
        residual = trace.residual
        culprit = "its output projection (out_proj)" if residual is not None and \
            not _finite(residual) else "its feed-forward" if residual is not None else \
            "its feed-forward or output projection"
        where = (f"{part}layer {layer}'s attention heads are finite but {after} holds "
                 f"{describe(t)} ({culprit})")
    return (f"{model} computes a non-finite number: {where}; the model's weights hold NaN or "
            f"infinity, so there is nothing true to explain")


def check_parameters(model, *, name: str = "the model") -> None:
    """`NonFiniteError` naming the first parameter of `model` that holds NaN/inf.

    For outputs that carry no trace to point into (a translation: NaN logits would decode to
    plausible-looking garbage), a broken model is refused before it runs.

    Examples:
        >>> check_parameters(torch.nn.Linear(2, 2))
    """
    for pname, p in model.named_parameters():
        if not _finite(p.detach()):
            raise NonFiniteError(f"{name}'s weights hold {describe(p.detach())} ({pname}): the "
                                 f"model was saved broken (e.g. trained with a NaN loss); its "
                                 f"output would mean nothing")
