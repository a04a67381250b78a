"""Refuse to explain numbers that are not numbers: the first NaN or infinity in a forward, named.

A model whose weights hold NaN (a run trained with a NaN loss, a corrupted file) still runs: every
number after the first NaN is NaN, and an explanation would print NaN weights, rank heads by NaN
and sort garbage. The explainer checks each traced forward here, in the order the model computed
it, and raises :class:`NonFiniteError` (a ``QkvError``) naming where the first non-finite number
appeared:

    layer 2, head 3: the attention weights are NaN (the layer's input was finite)
    layer 1, after its attention weights: the layer's output holds NaN (feed-forward or out_proj)
    the embeddings hold NaN (the layers never saw a finite input)

Example:
    >>> import torch
    >>> describe(torch.tensor([1.0, float("nan")]))
    'NaN'
"""

from __future__ import annotations

import torch

from qkv.errors import QkvError


class NonFiniteError(QkvError):
    """The model computed NaN or infinity; the message names the first layer and head."""


def describe(t: torch.Tensor) -> str:
    """``"NaN"`` if ``t`` holds a NaN, else ``"infinity"``."""
    return "NaN" if torch.isnan(t).any() else "infinity"


def _finite(t: torch.Tensor | None) -> bool:
    return t is None or not t.is_floating_point() or bool(torch.isfinite(t).all())


def check_layers(layer_traces, *, model: str = "the model", part: str = "",
                 output: torch.Tensor | None = None) -> None:
    """Walk ``layer_traces`` (one ``LayerTrace`` per layer, in order) and raise
    :class:`NonFiniteError` at the first non-finite input or attention weight.

    Args:
        layer_traces: the traces of one layer stack (``StackOutput.traces``).
        model: the model's name, for the message.
        part: ``"encoder "``/``"decoder "`` for a model with two stacks, else ``""``.
        output: the stack's last hidden state (b, t, E), checked after the last layer.
    """
    previous = None  # the layer whose output the next input is
    for layer, trace in enumerate(layer_traces):
        for kind in ("self_attn", "cross_attn"):
            mh = getattr(trace, kind, None)
            if mh is None:
                continue
            if not _finite(mh.query_input):
                raise NonFiniteError(_input_message(model, part, previous, mh.query_input))
            weights = mh.attention.weights  # (b, h, r, s)
            if not _finite(weights):
                bad = ~torch.isfinite(weights)  # (b, h, r, s)
                head = int(bad.flatten(2).any(-1).any(0).nonzero()[0])
                what = "cross-attention" if kind == "cross_attn" else "attention"
                raise NonFiniteError(
                    f"{model} computes {describe(weights)} at {part}layer {layer}, head {head}: its "
                    f"{what} weights are not finite although their input is; the model's weights "
                    f"hold NaN or infinity (e.g. trained with a NaN loss), so there is nothing "
                    f"true to explain")
            previous = layer
    if output is not None and not _finite(output):
        raise NonFiniteError(_input_message(model, part, previous, output, final=True))


def _input_message(model: str, part: str, previous: int | None, t: torch.Tensor,
                   final: bool = False) -> str:
    if previous is None:
        where = f"the {part}embeddings hold {describe(t)}"
    else:
        after = "its output" if final else "the next layer's input"
        where = (f"{part}layer {previous}'s attention weights are finite but {after} holds "
                 f"{describe(t)} (its feed-forward or output projection)")
    return (f"{model} computes a non-finite number: {where}; the model's weights hold NaN or "
            f"infinity, so there is nothing true to explain")


def check_parameters(model, *, name: str = "the model") -> None:
    """:class:`NonFiniteError` naming the first parameter of ``model`` that holds NaN/inf.

    For outputs that carry no trace to point into (a translation: NaN logits would decode to
    plausible-looking garbage), a broken model is refused before it runs.

    Example:
        >>> check_parameters(torch.nn.Linear(2, 2))
    """
    for pname, p in model.named_parameters():
        if not _finite(p.detach()):
            raise NonFiniteError(f"{name}'s weights hold {describe(p.detach())} ({pname}): the "
                                 f"model was saved broken (e.g. trained with a NaN loss); its "
                                 f"output would mean nothing")
