"""Step by step: one head, one token, the seeds' arithmetic with the model's real numbers.

For the token at position i, layer L, head H (head dim d)::

    x       = the vector that entered the layer's attention       (E,)
    q       = x · W_Q + b_Q                                       (d,)
    k_j     = x_j · W_K + b_K,   v_j = x_j · W_V + b_V            (s, d)
    score_j = q · k_j                                              (s,)
    scaled_j = score_j / √d     (+ the forward's mask, if any)     (s,)
    w       = softmax(scaled)   — sums to 1                        (s,)
    output  = Σ_j w_j v_j                                          (d,)

Here W_Q is head H's slice of the layer's query projection, written the way the seeds write it
(``x · W``, so W is (E, d) = ``q_proj.weight[H·d:(H+1)·d].T``). The arithmetic is redone
**explicitly in float64** from the weights and the traced inputs, then compared with the
tensors the model's own forward recorded; ``max_abs_diff`` is the largest difference between
the recomputed output and the model's head output.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class HeadSteps:
    """Every number of one head's attention for one token, recomputed in float64.

    Shapes: x (E,); query (d,); keys (s, d); values (s, dv); scores, scaled, mask, weights (s,);
    output, model_output (dv,). ``mask`` is what the forward added to ``scaled`` (0 or −inf
    for padding/causal structure). ``diffs`` holds, per stage, the max absolute difference
    between the float64 recomputation and the forward's own (float32) tensors.
    """

    tokens: list[str]
    layer: int
    head: int
    token_index: int
    head_dim: int
    scale: float
    x: torch.Tensor
    query: torch.Tensor
    keys: torch.Tensor
    values: torch.Tensor
    scores: torch.Tensor
    scaled: torch.Tensor
    mask: torch.Tensor
    weights: torch.Tensor
    output: torch.Tensor
    model_output: torch.Tensor
    diffs: dict[str, float]

    @property
    def max_abs_diff(self) -> float:
        return self.diffs["output"]


def head_slice(module, head: int) -> tuple[slice, slice]:
    """Rows of q_proj and of k_proj/v_proj that belong to query head ``head`` (GQA-aware)."""
    d = module.head_dim
    kv_head = head // (module.num_heads // module.num_kv_heads)
    return slice(head * d, (head + 1) * d), slice(kv_head * d, (kv_head + 1) * d)


def _project(x: torch.Tensor, linear, rows: slice) -> torch.Tensor:
    """x · W + b for the output features ``rows`` of ``linear`` — in float64."""
    w = linear.weight[rows].double()  # (d, E): nn.Linear stores W transposed
    b = linear.bias[rows].double() if linear.bias is not None else 0.0
    return x.double() @ w.T + b


def _softmax(scaled: torch.Tensor) -> torch.Tensor:
    """exp(z_j − max z) / Σ exp(z_k − max z), written out; −inf entries get weight 0."""
    top = scaled.max()
    e = torch.exp(scaled - top)
    return e / e.sum()


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    both_inf = torch.isinf(a) & torch.isinf(b) & (a.sign() == b.sign())
    return float((a - b).masked_fill(both_inf, 0.0).abs().max()) if a.numel() else 0.0


@torch.no_grad()
def head_steps(module, layer_trace, *, layer: int, head: int, row: int, tokens: list[str]) -> HeadSteps:
    """Recompute head ``head`` of ``module`` for traced row ``row``, and compare with the trace.

    Args:
        module: the layer's :class:`~qkv.modules.MultiHeadAttention` (its weights are used).
        layer_trace: the :class:`~qkv.modules.multihead.MultiHeadTrace` the forward recorded
            for this layer (queries for the traced rows, keys/values for every position).
        row: index into the traced rows (0 when one token was traced).

    Example:
        >>> import qkv
        >>> mha = qkv.MultiHeadAttention(8, 2)
        >>> _, _, tr = mha(torch.randn(1, 3, 8), trace_rows=torch.tensor([2]))
        >>> st = head_steps(mha, tr, layer=0, head=1, row=0, tokens=["a", "b", "c"])
        >>> round(float(st.weights.sum()), 12), st.max_abs_diff < 1e-6
        (1.0, True)
    """
    att = layer_trace.attention
    q_rows, kv_rows = head_slice(module, head)
    position = int(layer_trace.rows[row])
    x = layer_trace.query_input[0, row].double()  # (E,)
    xs_k = layer_trace.key_input[0].double()  # (s, kdim)
    xs_v = layer_trace.value_input[0].double()  # (s, vdim)

    # 1) project: the query of this token, a key and a value for every token
    query = _project(x, module.q_proj, q_rows)  # (d,)
    keys = _project(xs_k, module.k_proj, kv_rows)  # (s, d)
    values = _project(xs_v, module.v_proj, kv_rows)  # (s, dv)
    if module.rotary is not None:
        # RoPE rotates queries and keys by their positions before the dot product.
        query = module.rotary(query[None, None, None], offset=position)[0, 0, 0]
        keys = module.rotary(keys[None, None])[0, 0]
    # 2) compare: one dot product per key, then the 1/√d scaling
    scores = keys @ query  # (s,)
    scaled = scores * att.scale  # (s,)
    # 3) the forward's own mask (padding, causal, ALiBi), read off its trace, not re-derived
    mask = (att.masked[0, head, row].double() - att.scaled[0, head, row].double())  # (s,)
    mask = mask.nan_to_num(nan=float("-inf"), neginf=float("-inf"))
    # 4) softmax: positive weights that sum to 1
    weights = _softmax(scaled + mask)  # (s,)
    # 5) the weighted sum of the values
    output = weights @ values  # (dv,)

    model_output = att.output[0, head, row]
    diffs = {
        "query": _max_diff(query, att.query[0, head, row]),
        "keys": _max_diff(keys, att.key[0, head]),
        "values": _max_diff(values, att.value[0, head]),
        "scores": _max_diff(scores, att.scores[0, head, row]),
        "weights": _max_diff(weights, att.weights[0, head, row]),
        "output": _max_diff(output, model_output),
    }
    return HeadSteps(tokens=tokens, layer=layer, head=head, token_index=position,
                     head_dim=module.head_dim, scale=float(att.scale), x=x, query=query,
                     keys=keys, values=values, scores=scores, scaled=scaled, mask=mask,
                     weights=weights, output=output, model_output=model_output.double(),
                     diffs=diffs)


def steps_json(st: HeadSteps, *, model: str, text: str) -> dict:
    """Every number in full, for ``--json`` (lists of floats; −inf as the string "-inf")."""

    def numbers(t: torch.Tensor):
        return [_finite(v) for v in t.tolist()] if t.ndim == 1 else [numbers(r) for r in t]

    return {
        "model": model,
        "text": text,
        "tokens": st.tokens,
        "layer": st.layer,
        "head": st.head,
        "token_index": st.token_index,
        "token": st.tokens[st.token_index],
        "head_dim": st.head_dim,
        "scale": st.scale,
        "x": numbers(st.x),
        "query": numbers(st.query),
        "keys": numbers(st.keys),
        "values": numbers(st.values),
        "scores": numbers(st.scores),
        "scaled": numbers(st.scaled),
        "mask": numbers(st.mask),
        "weights": numbers(st.weights),
        "weights_sum": float(st.weights.sum()),
        "output": numbers(st.output),
        "model_output": numbers(st.model_output),
        "max_abs_diff": st.max_abs_diff,
        "stage_max_abs_diff": st.diffs,
    }


def _finite(v: float):
    # JSON has no infinities; a masked key's −inf is spelled out so the file stays valid.
    return v if math.isfinite(v) else ("-inf" if v < 0 else "inf" if v > 0 else "nan")
