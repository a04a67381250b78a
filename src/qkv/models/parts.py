"""The [`ModelParts`][qkv.models.protocol.ModelParts] of qkv's own models, read off their modules.

Every native family is built from [`TransformerLayer`][qkv.modules.transformer.TransformerLayer]s
(the parallel-residual subclass for GPT-NeoX), so one function names a layer's parts and each model
says only its tables and read-out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
from torch import nn

from qkv.models.protocol import (
    Embeddings, LayerNorms, LayerParts, Mixer, MixerKind, ModelParts, ResidualForm, Unembedding,
)


def layer_parts(layer) -> LayerParts:
    """A [`TransformerLayer`][qkv.modules.transformer.TransformerLayer]'s parts: its self-attention
    (qkv's softmax attention), norm1 / norm3 / norm2, its feed-forward; pre- or post-norm, or
    parallel where its own forward says it does not form x + attn (`residual_note`)."""
    if layer.sequential_residual:
        form = ResidualForm.PRE_NORM if layer.norm_first else ResidualForm.POST_NORM
    else:
        form = ResidualForm.PARALLEL
    return LayerParts(mixers=(Mixer(MixerKind.SOFTMAX, layer.self_attn, layer.self_attn),),
                      norms=LayerNorms(layer.norm1, layer.norm3, layer.norm2),
                      feed_forward=layer.feed_forward, residual=form,
                      residual_note=layer.residual_note)


def model_parts(layers: Iterable, tables: Mapping[str, nn.Module], *, norm: nn.Module | None = None,
                offset: int = 0, head: torch.Tensor | None = None,
                final_norm: nn.Module | None = None) -> ModelParts:
    """A native model's [`ModelParts`][qkv.models.parts.ModelParts]: `tables` (`"token"`,
    `"position"`, `"type"`), the embedding norm, the position offset; `head` (V, E) the output
    matrix of a model with next-token logits after `final_norm`."""
    read_out = None if head is None else Unembedding(head, None, final_norm)
    return ModelParts(embeddings=Embeddings(dict(tables), position_offset=offset, norm=norm),
                      layers=tuple(layer_parts(layer) for layer in layers), unembedding=read_out)


__all__ = ["layer_parts", "model_parts"]
