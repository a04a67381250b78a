"""Changing a forward from the outside, as an argument: `Interventions`.

The one way to ablate a head, zero value vectors or patch an activation from another run. A
model's `forward(..., interventions=Interventions(...))` hands it to its
[`TransformerStack`][qkv.modules.TransformerStack], which gives each layer its `AttentionEdit` and
replaces what enters a layer; nothing hooks a module by its attribute name:

```text
x ─► [inputs[ℓ] replaces x] ─► layer ℓ:  q, k, v = proj(x)
                                         v ← v · values[ℓ]            (zero chosen keys' values)
                                         o_h = attend(q_h, k_h, v_h)  (b, t, d) per head
                                         o_h ← heads[(ℓ, h)]          (replace, None = zero)
                                         out = out_proj(concat_h o_h)
```

Shapes (b batch, t query length, s key length, E width, h heads, h_kv key/value heads, d head dim):

- `heads[(layer, head)]`: None (the head's output o_h is zeroed), a tensor broadcastable to
  (b, t, d) that replaces o_h — e.g. `other_trace.attention.output[:, head]` from a clean run —
  or a function (b, t, d) → (b, t, d) of o_h (e.g. `lambda o: o * keep[:, None, None]` ablates
  the head in the batch copies where `keep` (b,) is 0: every head's ablation in one batched
  forward).
  This is the per-head output *before* the output projection: zeroing it equals zeroing that
  head's d columns of `out_proj`'s input.
- `values[layer]`: a multiplier broadcastable to (b, h_kv, s) — (b, s) is read as (b, 1, s) —
  applied to the value vectors before attending (0 = key j hands over nothing but still takes its
  share of the softmax; value zeroing, Mohebbi et al. 2023).
- `inputs[layer]`: a tensor broadcastable to (b, t, E) that replaces what enters the layer (an
  activation patched from another run's `hidden_states[layer]`), or a function (b, t, E) →
  (b, t, E) of what would have entered it (e.g. `lambda x: x[-1:].expand_as(x)`: every batch
  row gets the last row's input).

Only self-attention is edited; a layer's cross-attention runs unchanged.

Examples:
    >>> import torch
    >>> from qkv.modules import TransformerLayer, TransformerStack
    >>> stack = TransformerStack([TransformerLayer.build(16, 4, 32) for _ in range(2)]).eval()
    >>> x = torch.randn(1, 5, 16)
    >>> edited = stack(x, interventions=Interventions(heads={(1, 2): None})).last_hidden_state
    >>> bool((edited - stack(x).last_hidden_state).abs().max() > 0)   # layer 1 without head 2
    True
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

import torch

#: What replaces one head's output o_h (b, t, d): None (zero), a tensor, or a function of o_h.
HeadReplacement = torch.Tensor | Callable[[torch.Tensor], torch.Tensor] | None


@dataclass(frozen=True)
class AttentionEdit:
    """What to change in one self-attention call (one layer's share of `Interventions`).

    Attributes:
        heads: head → None (zero its output), a replacement broadcastable to (b, t, d), or a
            function (b, t, d) → (b, t, d) of the head's output.
        values: None, or a multiplier broadcastable to (b, h_kv, s) for the value vectors.
    """

    heads: Mapping[int, HeadReplacement] = field(default_factory=dict)
    values: torch.Tensor | None = None

    def check(self, num_heads: int) -> None:
        """ValueError naming a head that the attention does not have."""
        for head in self.heads:
            if not (isinstance(head, int) and 0 <= head < num_heads):
                raise ValueError(f"interventions: head {head!r} is out of range (0…{num_heads - 1})")

    def edit_values(self, v: torch.Tensor) -> torch.Tensor:
        """v (b, h_kv, s, d) with `values` applied (a new tensor; a KV cache keeps the old)."""
        if self.values is None:
            return v
        keep = self.values.to(v.dtype)
        keep = keep[:, None] if keep.ndim == 2 else keep  # (b, s) → (b, 1, s)
        return v * keep[..., None]  # (b, h_kv, s, d)

    def edit_heads(self, heads: torch.Tensor) -> torch.Tensor:
        """heads (b, h, t, d) with the chosen heads' outputs replaced or zeroed."""
        if not self.heads:
            return heads
        heads = heads.clone()
        for head, new in self.heads.items():
            if callable(new):
                new = new(heads[:, head])  # (b, t, d)
            heads[:, head] = 0 if new is None else new.to(heads.dtype)  # (b, t, d)
        return heads


@dataclass(frozen=True)
class Interventions:
    """Edits to one forward: heads replaced or zeroed, value vectors zeroed, inputs patched.

    Fields (keys are layer indices, heads are `(layer, head)`; shapes in the module docstring):
        heads: (layer, head) → None (zero the head's output), its replacement (b, t, d), or a
            function of its output.
        values: layer → multiplier (b, s) or (b, h_kv, s) for that layer's value vectors.
        inputs: layer → replacement (b, t, E) for what enters the layer, or a function of it.

    Examples:
        >>> keep = torch.ones(1, 5); keep[0, 2] = 0            # zero token 2's value vectors
        >>> iv = Interventions(values={0: keep}, heads={(1, 0): None})
        >>> iv.attention(1).heads
        {0: None}
    """

    heads: Mapping[tuple[int, int], HeadReplacement] = field(default_factory=dict)
    values: Mapping[int, torch.Tensor] = field(default_factory=dict)
    inputs: Mapping[int, torch.Tensor | Callable[[torch.Tensor], torch.Tensor]] = field(default_factory=dict)

    def check(self, num_layers: int) -> None:
        """ValueError naming a layer that the stack does not have."""
        layers = [key[0] if isinstance(key, tuple) else key for key in self.heads]
        for layer in [*layers, *self.values, *self.inputs]:
            if not (isinstance(layer, int) and 0 <= layer < num_layers):
                raise ValueError(f"interventions: layer {layer!r} is out of range (0…{num_layers - 1})")

    def attention(self, layer: int) -> AttentionEdit | None:
        """Layer `layer`'s `AttentionEdit`, or None when it changes nothing there."""
        heads = {h: new for (ell, h), new in self.heads.items() if ell == layer}
        values = self.values.get(layer)
        return AttentionEdit(heads, values) if heads or values is not None else None

    def input(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """What enters layer `layer` (b, t, E): `x`, or its patch."""
        patch = self.inputs.get(layer)
        if patch is None:
            return x
        new = patch(x) if callable(patch) else patch.to(x.dtype)
        return new.expand_as(x)
