"""Changing a forward through the forward: :class:`HeadEdit` replaces chosen heads' outputs.

A head's output o^h (t, d) is what it hands to the output projection (``out_proj`` mixes the
concatenated heads). A :class:`HeadEdit`, passed down as ``head_edits={layer: HeadEdit}`` by a
model's forward (→ :class:`~qkv.modules.TransformerStack` → each layer → its
:class:`~qkv.modules.MultiHeadAttention`), replaces o^h in the copies of the batch it names,
just before the heads are concatenated::

    heads (b, h, t, d) ─► where[b, h] ? value : heads ─► concat ─► out_proj

Zero ablation is ``value = 0``; mean ablation a head's mean over positions; activation patching
another run's head outputs. Nothing hooks a module: the forward takes the edit as an argument.

    >>> edit = HeadEdit(where=torch.tensor([[False, True]]), value=torch.zeros(()))
    >>> edit.apply(torch.ones(1, 2, 3, 4)).sum(dim=(2, 3)).tolist()   # head 1 zeroed
    [[12.0, 0.0]]
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class HeadEdit:
    """Replace some heads' outputs in one attention call.

    Fields:
        where: (b, h) bool — True: that copy's head gets ``value``.
        value: the replacement, broadcastable to (b, t, h, d) (the layout of ``out_proj``'s
            input split into heads): a scalar 0, (b, 1, h, d) means, (b, t, h, d) another run.
    """

    where: torch.Tensor
    value: torch.Tensor

    def apply(self, heads: torch.Tensor) -> torch.Tensor:
        """heads (b, h, t, d) → the same with the chosen heads replaced."""
        b, h, t, d = heads.shape
        if self.where.shape != (b, h):
            raise ValueError(f"HeadEdit.where must be (batch, heads) = ({b}, {h}), "
                             f"got {tuple(self.where.shape)}")
        value = self.value.to(heads.dtype).expand(b, t, h, d).transpose(1, 2)  # (b, h, t, d)
        return torch.where(self.where.view(b, h, 1, 1), value, heads)
