"""What a transformers layer handed its kernel, read from the call itself.

transformers' linear-attention and state-space layers (Gated DeltaNet, KDA, Mamba-2) compute
their token mixing in one module-level function (`torch_chunk_gated_delta_rule`,
`chunk_kimi_delta_attention`, `mamba2_chunk_scan`) that the layer's `forward` looks up in
its modeling file. Recording that call gives the exact q, k, v, decays and gates the forward
used — after its projections, short convolution and activations, whatever the architecture
does before — so the explanations never rebuild "something similar" from the weights.

The function is replaced in the modeling module for the duration of one call and restored in a
`finally` (`qkv.hf.kernels.replaced`): not safe while another thread runs the same architecture.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from qkv.errors import QkvError


@dataclass(frozen=True)
class KernelCall:
    """One call of a layer's kernel: its arguments by name, what it returned, and the function
    called (the modeling file's own, to run again on other arguments; None: not recorded)."""

    arguments: dict[str, Any]
    result: Any
    function: Callable | None = None


def kernel_call(module: torch.nn.Module, kernel: str, hidden_states: torch.Tensor, **kwargs) -> KernelCall:
    """Run `module(hidden_states, **kwargs)` once and return its one call of the function `kernel`.

    Raises:
        QkvError: the forward did not call it exactly once (see `kernel_calls`).
    """
    calls = kernel_calls(module, kernel, hidden_states, **kwargs)
    if len(calls) != 1:
        raise QkvError(f"{type(module).__name__} called {kernel} {len(calls)} times in one forward, not once")
    return calls[0]


def causal_call(module: torch.nn.Module, kernel: str, hidden_states: torch.Tensor,
                position_embeddings) -> KernelCall:
    """Run a softmax attention `module` on one text (b = 1) under a causal mask, with the
    `position_embeddings` its model hands it, and return its one call of `kernel`.

    Raises:
        QkvError: a batch of more than one text, or not exactly one call (see `kernel_calls`).
    """
    return kernel_call(module, kernel, hidden_states, position_embeddings=position_embeddings,
                       attention_mask=causal_mask(hidden_states))


def causal_mask(hidden_states: torch.Tensor) -> torch.Tensor:
    """(1, 1, t, t) the additive causal mask transformers hands an attention layer for one text
    `hidden_states` (1, t, hidden): 0 on and below the diagonal, the dtype's lowest above.

    Raises:
        QkvError: a batch of more than one text.
    """
    b, t, _ = hidden_states.shape
    if b != 1:
        raise QkvError(f"one text at a time: the batch holds {b}")
    low = torch.finfo(hidden_states.dtype).min
    return torch.full((t, t), low, dtype=hidden_states.dtype, device=hidden_states.device).triu(1)[None, None]


def kernel_calls(module: torch.nn.Module, kernel: str, hidden_states: torch.Tensor,
                 **kwargs) -> list[KernelCall]:
    """Run `module(hidden_states, **kwargs)` once and return its calls of the function `kernel`, in
    order.

    Args:
        module: a transformers mixer (its class defined in a `modeling_*.py` file).
        kernel: the name of the module-level function its forward calls (e.g.
            `"mamba2_chunk_scan"`).
        hidden_states: (b, t, hidden) the layer's input, after its norm.

    Returns:
        Each call's arguments (positional ones named by the function's signature) and result.

    Raises:
        QkvError: the modeling file has no such function.
    """
    # imported here: importing qkv.hf registers qkv with transformers (seconds), which only a
    # transformers layer's reader needs
    from qkv.hf.kernels import modeling_function, replaced

    original = modeling_function(module, kernel)
    if original is None:
        raise QkvError(f"{type(module).__name__}'s modeling file has no function {kernel!r}")
    names = list(inspect.signature(original).parameters)
    calls: list[KernelCall] = []

    def recording(*args, **kw):
        result = original(*args, **kw)
        calls.append(KernelCall({**dict(zip(names, args)), **kw}, result, original))
        return result

    with replaced(module, kernel, recording), torch.no_grad():
        module(hidden_states, **kwargs)
    return calls
