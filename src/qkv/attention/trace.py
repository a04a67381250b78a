"""The typed record of one attention call: every intermediate the seed documents name.

Dimension letters used throughout qkv:

    b  batch            h  heads (query heads; key/value heads are repeated to match)
    t  query length     s  key/value length
    d  query/key dim    dv value dim
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from qkv.attention.attention_mask import AttentionMask


@dataclass(frozen=True)
class AttentionTrace:
    """Every step of `softmax(q·kᵀ · scale + mask) · v`, as the forward computed it.

    Shapes (leading batch dims `...` as given, usually `(b, h)`):

    ========  ==============  ====================================================
    field     shape           meaning
    ========  ==============  ====================================================
    query     (..., t, d)     the queries q (one row per query token)
    key       (..., s, d)     the keys k_j, repeated per query head for GQA/MQA
    value     (..., s, dv)    the values v_j, repeated per query head for GQA/MQA
    scores    (..., t, s)     q·k_jᵀ, the raw dot products
    scaled    (..., t, s)     scores · scale (scale = 1/√d unless given)
    bias      (..., t, s)*    the score bias added to scaled (ALiBi), or None
    mask      (..., t, s)*    the mask as added to scaled: 0 (takes part), −inf (excluded),
                              or a float mask's values; None when nothing was masked
    masked    (..., t, s)     scaled + bias + mask: what the softmax read
    weights   (..., t, s)     softmax over s; each row sums to 1 (0 if fully masked)
    output    (..., t, dv)    weights · v, the attention output
    lse       (..., t)        log Σ_j exp(masked_j), −inf for a fully masked row
    ========  ==============  ====================================================

    With logit soft-capping (Gemma 2) `masked` is `softcap · tanh(scaled / softcap) + bias +
    mask`; with sink logits (gpt-oss, one per head) the softmax's denominator also holds
    `exp(sinks[h])`, so a row's weights sum to less than 1 and `lse` counts the sink. Both
    are None for plain attention (`softcap`, `sinks` (h,)).

    `*`: `bias` and `mask` keep the broadcastable shape they were given in (e.g. (t, s) or
    (b, 1, 1, s)); [`additive`][qkv.attention.trace.AttentionTrace.additive] expands their sum.
    `scale` is the float the scores were multiplied by. Intermediates are kept in the
    dtype the arithmetic was done in (fp32 for fp16/bf16 inputs); `output` has the
    inputs' dtype, exactly the tensor the forward passed on.

    Examples:
        >>> import torch, qkv
        >>> q, k, v = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4)
        >>> tr = qkv.attention_trace(q, k, v)
        >>> tr.weights.shape, bool(torch.allclose(tr.weights.sum(-1), torch.ones(1, 2, 3)))
        (torch.Size([1, 2, 3, 5]), True)
    """

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    scores: torch.Tensor
    scaled: torch.Tensor
    bias: torch.Tensor | None
    mask: torch.Tensor | None
    masked: torch.Tensor
    weights: torch.Tensor
    output: torch.Tensor
    lse: torch.Tensor
    scale: float
    softcap: float | None = None
    sinks: torch.Tensor | None = None

    _ROW_FIELDS = ("query", "scores", "scaled", "masked", "weights", "output")

    def select_rows(self, rows: torch.Tensor | slice | int) -> "AttentionTrace":
        """Keep only some query rows (keys and values are kept whole).

        A model explaining one token keeps `O(t)` numbers per head instead of `O(t·s)`.

        Args:
            rows: an index, a slice, or a 1-D LongTensor of query positions.
        """
        if isinstance(rows, int):
            rows = slice(rows, rows + 1)
        kept = {name: getattr(self, name)[..., rows, :] for name in self._ROW_FIELDS}
        kept["lse"] = self.lse[..., rows]
        for name in ("bias", "mask"):  # broadcast over rows when their row dim is 1
            x = getattr(self, name)
            kept[name] = x if x is None or x.shape[-2] == 1 else x[..., rows, :]
        return AttentionTrace(key=self.key, value=self.value, scale=self.scale,
                              softcap=self.softcap, sinks=self.sinks, **kept)

    def additive(self) -> torch.Tensor:
        """(..., t, s): everything the forward added to `scaled` — bias + mask, expanded.

        `masked` was computed as `(scaled + bias) + mask`; `scaled + additive()` equals it
        exactly when there is no bias or the mask is only 0/−inf, and to a rounding otherwise.
        """
        out = torch.zeros_like(self.scaled)
        for x in (self.bias, self.mask):
            if x is not None:
                out = out + x
        return out

    def detach(self) -> "AttentionTrace":
        """The same record with every tensor detached from autograd; the record itself where
        autograd tracks none of them (all under `torch.no_grad`: nothing to detach)."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        if not any(isinstance(x, torch.Tensor) and x.requires_grad for x in values.values()):
            return self
        return AttentionTrace(**{name: x.detach() if isinstance(x, torch.Tensor) else x
                                 for name, x in values.items()})


class LseRequest:
    """The type of `LSE` (`trace_rows=LSE`: record q, k, v and every row's lse, O(t) per
    head instead of some rows' weights; see `qkv.modules.lse_trace`)."""

    def __repr__(self) -> str:
        return "LSE"


#: ``trace_rows=LSE``: every attention call records an :class:`LseTrace`.
LSE = LseRequest()


@dataclass(frozen=True)
class LseTrace:
    """What one attention call needs to give any of its weights later, in O(t) numbers per head.

    Attributes:
        query: (b, h, t, d) the queries as the kernel read them (after positions, q norm).
        key: (b, h_kv, s, d) the keys, likewise; h_kv < h under GQA/MQA.
        value: (b, h_kv, s, dv) the values.
        lse: (b, h, t) each row's log-sum-exp of its masked, scaled scores (float32; −inf for a
            row with no key).
        mask: the [`AttentionMask`][qkv.attention.AttentionMask] the call used (a description).
        scale: the scale the scores were multiplied by, or None for 1/√d.
        softcap: the logit soft-cap applied after scaling (Gemma 2), or None.
    """

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    lse: torch.Tensor
    mask: AttentionMask
    scale: float | None = None
    softcap: float | None = None

    @property
    def enable_gqa(self) -> bool:
        return self.key.shape[-3] != self.query.shape[-3]
