"""Padding-free inference for an encoder: the fast path behind ``BertModel.embed``.

A padded batch (b, t_max, E) spends work on padding in every linear map and feed-forward.
Here the real tokens of a batch are *packed* into one (N, E) matrix (N = Σ lengths), so the
projections, the feed-forward and the LayerNorms — nearly all the arithmetic — run on real
tokens only. Only attention needs the texts apart: the packed q/k/v are scattered into a
(b, t_max) grid, attended with the fused kernel and a key-padding mask, and gathered back::

    packed x (N, E) ─► qkv = x W_qkvᵀ (N, 3E) ─► grid (3, b, t_max, E) ─► SDPA ─► (N, E)
                        one GEMM call instead of three

The layers' own weights are used (no copy of the model); the math is exactly
``TransformerLayer``'s post-norm forward, and ``tests/models/test_bert.py`` checks the two agree.
What it saves is measured in ``benchmarks/encode.py`` (``--ablation`` times the padded forward
on the same sorted batches): most on short lists, whose batches of 32 span wide lengths; little
on long lists sorted by length, where padding is a small share of the tokens and the GEMMs —
the same in every implementation — take most of the time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F

from qkv.attention import scaled_dot_product_attention
from qkv.modules import TransformerLayer


@dataclass(frozen=True)
class Packing:
    """Where a batch's real tokens sit. b texts, N = Σ lengths tokens, t_max the longest.

    Fields:
        b, t_max: the number of texts and the longest one's length.
        lengths: (b,) tokens per text.
        index: (N,) each real token's row in the flattened (b · t_max) grid.
        text, position: (N,) each real token's text and its position in it.
        key_bias: (b, 1, 1, t_max) float, 0 for real keys and −inf for padding (built once per
            batch rather than converted from a bool mask in every layer); None if unpadded.
        pool: (b, N) the mean-pooling matrix: row i is 1/len_i over text i's tokens.
    """

    b: int
    t_max: int
    lengths: torch.Tensor
    index: torch.Tensor
    text: torch.Tensor
    position: torch.Tensor
    key_bias: torch.Tensor | None
    pool: torch.Tensor

    @classmethod
    def of(cls, lengths: list[int], dtype: torch.dtype, device=None) -> "Packing":
        b, t_max = len(lengths), max(lengths)
        lens = torch.tensor(lengths, dtype=torch.long, device=device)
        real = torch.arange(t_max, device=device) < lens[:, None]  # (b, t_max)
        text, position = real.nonzero(as_tuple=True)  # (N,) each, row-major: texts in order
        key_bias = None
        if min(lengths) < t_max:
            key_bias = torch.zeros(b, 1, 1, t_max, dtype=dtype, device=device)
            key_bias.masked_fill_(~real[:, None, None, :], float("-inf"))
        pool = (text == torch.arange(b, device=device)[:, None]).to(dtype)  # (b, N)
        pool /= lens[:, None].to(dtype)
        return cls(b, t_max, lens, text * t_max + position, text, position, key_bias, pool)


class PackedEncoder:
    """Runs a post-norm encoder (``BertModel``) on packed real tokens.

    Example:
        >>> enc = PackedEncoder(model)                             # doctest: +SKIP
        >>> enc.mean_pooled([[101, 7592, 102], [101, 102]]).shape  # doctest: +SKIP
        torch.Size([2, 384])
    """

    def __init__(self, model):
        self.model = model
        # The three projections as one (3E, E) matrix: one GEMM call instead of three.
        self.qkv = [
            (torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]),  # (3E, E)
             torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]))  # (3E,)
            for a in (layer.self_attn for layer in model.layers)
        ]

    @torch.inference_mode()
    def hidden(self, ids: Sequence[Sequence[int]]) -> tuple[torch.Tensor, Packing]:
        """Token ids of b texts → the last layer's output for their N real tokens.

        Returns:
            ``(x, packing)``: x (N, E), the texts' tokens one after another.
        """
        E = self.model.config.hidden_size
        p = Packing.of([len(s) for s in ids], self.model.embeddings.word.weight.dtype)
        x = self._embed(ids, p)  # (N, E)
        # One grid for all layers: each layer overwrites the real rows, the padded rows stay
        # 0 (they must be finite: 0 · NaN would leak through the masked softmax). q, k and v
        # each get their own (b·t_max, E) plane, so that a head's rows are E apart, as in a
        # padded batch, not 3E (measured: the attention kernel is slower on the wider stride).
        grid = x.new_zeros(3, p.b * p.t_max, E)
        for layer, (w_qkv, b_qkv) in zip(self.model.layers, self.qkv):
            x = self._layer(layer, w_qkv, b_qkv, x, p, grid)
        return x, p

    @torch.inference_mode()
    def mean_pooled(self, ids: Sequence[Sequence[int]]) -> torch.Tensor:
        """(b, E): each text's mean last-layer vector over its tokens (specials included, as
        sentence-transformers does)."""
        x, p = self.hidden(ids)
        return p.pool @ x  # (b, N) @ (N, E)

    def _embed(self, ids, p: Packing) -> torch.Tensor:
        emb = self.model.embeddings
        flat = torch.tensor([i for s in ids for i in s], dtype=torch.long)  # (N,)
        # Hugging Face's order of the sums (word + type, then position): same rounding.
        x = emb.word(flat) + emb.token_type.weight[0]
        return emb.norm(x + emb.position.weight[p.position])  # (N, E)

    @staticmethod
    def _layer(layer: TransformerLayer, w_qkv, b_qkv, x, p: Packing, grid) -> torch.Tensor:
        """One post-norm layer on packed tokens: x (N, E) → (N, E)."""
        attn, ff = layer.self_attn, layer.feed_forward
        E, h, d = x.shape[-1], attn.num_heads, attn.head_dim
        # 1) project all three at once, then lay the tokens out in the (b, t_max) grid
        qkv = F.linear(x, w_qkv, b_qkv).view(-1, 3, E).transpose(0, 1)  # (3, N, E)
        grid.index_copy_(1, p.index, qkv)  # (3, b·t_max, E)
        q, k, v = grid.view(3, p.b, p.t_max, h, d).transpose(2, 3).unbind(0)  # (b, h, t_max, d)
        # 2) attend per text; padded keys are masked, padded query rows are never gathered
        heads = scaled_dot_product_attention(q, k, v, attn_mask=p.key_bias, backend="fused")
        heads = heads.transpose(1, 2)[p.text, p.position].reshape(-1, E)  # (N, E)
        # 3) the post-norm residual blocks, as TransformerLayer computes them
        x = layer.norm1(x + attn.out_proj(heads))
        return layer.norm3(x + ff(x))
