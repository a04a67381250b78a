"""Step by step: one head, one token, the seeds' arithmetic with the model's real numbers.

For the token at position i, layer L, head H (head dim d):

```text
x       = the vector that entered the layer's attention       (E,)
q       = x · W_Q + b_Q                                       (d,)
k_j     = x_j · W_K + b_K,   v_j = x_j · W_V + b_V            (s, d)
score_j = q · k_j                                              (s,)
scaled_j = score_j / √d     (+ the forward's mask, if any)     (s,)
w       = softmax(scaled)   — sums to 1                        (s,)
output  = Σ_j w_j v_j                                          (d,)
```

Here W_Q is head H's slice of the layer's query projection, written the way the seeds write it
(`x · W`, so W is (E, d) = `q_proj.weight[H·d:(H+1)·d].T`). The arithmetic is redone
**explicitly in float64** from the weights and the traced inputs, then compared with the
tensors the model's own forward recorded; `max_abs_diff` is the largest difference between
the recomputed output and the model's head output.

[`explain_head`][qkv.explain.steps.explain_head] is the entry point for a model and a text;
[`head_steps`][qkv.explain.steps.head_steps] does the arithmetic for any traced attention — a
[`MultiHeadAttention`][qkv.modules.MultiHeadAttention] or a transformers module read by
`qkv.hf.projections` (`HFAttention`), self- or cross-attention
([`qkv.explain.cross_attention_head`][qkv.explain.cross_attention_head]: q from the decoder's x,
each k_j and v_j from the encoder's memory, `key_input`).
"""

from __future__ import annotations

from typing import ClassVar

from dataclasses import dataclass, replace

import torch

from qkv.attention.softcap import soft_cap
from qkv.explain.finite import NonFiniteError
from qkv.explain.forward import (
    Traced, check_layer_head, check_text, device_of, encode, model_name, stops_at_layer, trace,
)
from qkv.explain.jsonable import numbers
from qkv.explain.select import choose_in
from qkv.explain.wording import Message
from qkv.modules.multihead import head_norm, norm_width
from qkv.modules.norms import norm_kind
from qkv.modules.stack import LayerRows
from qkv.modules.writes import Weights


@dataclass(frozen=True)
class OneHead:
    """What names one head's answer for one token of a text: the fields every per-head result
    starts with (`HeadSteps` here, the score attributions of `qkv.explain.circuits`)."""

    model: str
    text: str
    tokens: list[str]
    layer: int
    head: int
    token_index: int


@dataclass(frozen=True)
class HeadSteps(OneHead):
    """Every number of one head's attention for one token, recomputed in float64.

    Shapes: x (E,); query (d,); keys (s, d); values (s, dv); scores, scaled, mask, weights (s,);
    output, model_output (dv,). `mask` is what the forward added to `scaled`
    (`AttentionTrace.additive()`: 0, −inf for keys it excluded — padding, causal structure —
    or an ALiBi bias). `diffs` holds, per stage, the max absolute difference between the
    float64 recomputation and the forward's own (float32) tensors.

    Fields set by [`explain_head`][qkv.explain.steps.explain_head] (defaults from a bare
    [`head_steps`][qkv.explain.steps.head_steps]):
        x_is_layer_input: whether `x` is the vector entering the layer (post-norm) rather than
            its normalised form (pre-norm); None when not known.
        word, word_tokens: with `words=True`, the word chosen and its token positions (the
            arithmetic is for the last); None and () otherwise.
        notes: how an ambiguous `token` was resolved (which occurrence, which word piece).
        qk_transform: what happens to q and the k_j after the projection, in the model's order
            (Qwen3's per-head RMSNorm then RoPE's rotation; HunYuan's rotation then norm), in
            words; "" when nothing does.
        projection: "" when q, k_j and v_j were recomputed as x·W + b; otherwise why they could
            not be (a model whose projections qkv cannot read as matrices): then they are the
            ones the forward's kernel read, and the arithmetic from the scores on is recomputed.
        softcap: the logit soft-cap c applied to the scaled scores (c·tanh(z/c)), or None.
        sink: the head's sink logit (a share of the softmax's denominator with no value), or None.
    """

    kind: ClassVar[str] = "steps"  # its row in qkv.explain.kinds.KINDS

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
    x_is_layer_input: bool | None = None
    word: str | None = None
    word_tokens: tuple[int, ...] = ()
    notes: tuple[Message, ...] = ()
    qk_transform: str = ""
    projection: str = ""
    softcap: float | None = None
    sink: float | None = None

    @property
    def max_abs_diff(self) -> float:
        return self.diffs["output"]

    def to_dict(self) -> dict:
        """Every number in full (what `qkv explain … --layer L --head H --json` prints);
        −inf as `qkv.explain.jsonable` says."""
        return {"kind": self.kind,
            "model": self.model,
            "text": self.text,
            "tokens": self.tokens,
            "layer": self.layer,
            "head": self.head,
            "token_index": self.token_index,
            "token": self.tokens[self.token_index],
            "head_dim": self.head_dim,
            "scale": self.scale,
            "x": numbers(self.x),
            "query": numbers(self.query),
            "keys": numbers(self.keys),
            "values": numbers(self.values),
            "scores": numbers(self.scores),
            "scaled": numbers(self.scaled),
            "mask": numbers(self.mask),
            "weights": numbers(self.weights),
            "weights_sum": float(self.weights.sum()),
            "output": numbers(self.output),
            "model_output": numbers(self.model_output),
            "max_abs_diff": self.max_abs_diff,
            "stage_max_abs_diff": self.diffs,
            "notes": [str(n) for n in self.notes],
            "word": self.word,
            "word_tokens": list(self.word_tokens),
            "projection": self.projection,
            "softcap": self.softcap,
            "sink": self.sink,
        }


def head_slice(module, head: int) -> tuple[slice, slice]:
    """Rows of q_proj and of k_proj/v_proj that belong to query head `head` (GQA-aware)."""
    d = module.head_dim
    kv_head = head // (module.num_heads // module.num_kv_heads)
    return slice(head * d, (head + 1) * d), slice(kv_head * d, (kv_head + 1) * d)


def _project(x: torch.Tensor, linear, rows: slice) -> torch.Tensor:
    """x · W + b for the output features `rows` of `linear` — in float64."""
    w = linear.weight[rows].double()  # (d, E): nn.Linear stores W transposed
    b = linear.bias[rows].double() if linear.bias is not None else 0.0
    return x.double() @ w.T + b


def _softmax(scaled: torch.Tensor, sink: float | None = None) -> torch.Tensor:
    """exp(z_j − max z) / Σ exp(z_k − max z), written out; −inf entries get weight 0. A sink
    logit adds exp(sink − max) to the denominator and takes no weight of its own."""
    top = scaled.max() if sink is None else torch.maximum(scaled.max(), scaled.new_tensor(sink))
    e = torch.exp(scaled - top)
    extra = 0.0 if sink is None else torch.exp(scaled.new_tensor(sink) - top)
    return e / (e.sum() + extra)


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    both_inf = torch.isinf(a) & torch.isinf(b) & (a.sign() == b.sign())
    return float((a - b).masked_fill(both_inf, 0.0).abs().max()) if a.numel() else 0.0


@torch.no_grad()
def head_steps(module, layer_trace, *, layer: int, head: int, row: int, tokens: list[str],
               model: str, text: str) -> HeadSteps:
    """Recompute head `head` of `module` for traced row `row`, and compare with the trace.

    Args:
        module: the layer's [`MultiHeadAttention`][qkv.modules.MultiHeadAttention] or
            `HFAttention` (its weights are used).
        layer_trace: the `MultiHeadTrace` the forward recorded
            for this layer (queries for the traced rows from `query_input`, keys/values for
            every position from `key_input`/`value_input`: a cross-attention's memory).
        row: index into the traced rows (0 when one token was traced).
        tokens: the s key tokens.
        model, text: what was run, for the record.

    Examples:
        >>> import qkv
        >>> mha = qkv.MultiHeadAttention(8, 2)
        >>> tr = mha(torch.randn(1, 3, 8), trace_rows=torch.tensor([2])).trace
        >>> st = head_steps(mha, tr, layer=0, head=1, row=0, tokens=["a", "b", "c"],
        ...                 model="MultiHeadAttention(8, 2)", text="a b c")
        >>> st.keys.shape, round(float(st.weights.sum()), 12), st.max_abs_diff < 1e-6
        (torch.Size([3, 4]), 1.0, True)
    """
    att = layer_trace.attention
    position = int(layer_trace.rows[row])
    x = layer_trace.query_input[0, row].double()  # (E,)
    # 1) project: the query of this token, a key and a value for every token
    query, keys, values, transform = _project_head(module, layer_trace, head=head, row=row)
    # 2) compare: one dot product per key, then the 1/√d scaling
    scores = keys @ query  # (s,)
    scaled = scores * att.scale  # (s,)
    softcap = att.softcap
    capped = scaled if softcap is None else soft_cap(scaled, softcap)  # Gemma 2's cap
    # 3) the forward's own mask and bias (padding, causal, ALiBi), as it added them, not re-derived
    mask = att.additive()[0, head, row].double()  # (s,)
    # 4) softmax: positive weights that sum to 1 (less than 1 with a sink: gpt-oss)
    sink = None if att.sinks is None else float(att.sinks[head])
    weights = _softmax(capped + mask, sink)  # (s,)
    # 5) the weighted sum of the values
    output = weights @ values  # (dv,)

    model_output = att.output[0, head, row]
    recomputed = {"query": query, "keys": keys, "values": values, "scores": scores,
                  "weights": weights, "output": output}
    return HeadSteps(model=model, text=text, tokens=tokens, layer=layer, head=head,
                     token_index=position, head_dim=module.head_dim, scale=float(att.scale), x=x,
                     query=query, keys=keys, values=values, scores=scores, scaled=scaled,
                     mask=mask, weights=weights, output=output,
                     model_output=model_output.double(),
                     diffs=_stage_diffs(recomputed, att, head=head, row=row),
                     qk_transform=", then ".join(transform), projection=module.projection_note,
                     softcap=softcap, sink=sink)


def _project_head(module, layer_trace, *, head: int,
                  row: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[str]]:
    """Step 1 of [`head_steps`][qkv.explain.steps.head_steps]: head `head`'s query for traced row
    `row`, its keys and values for every position, in float64, and what transformed q and the k_j
    after the projection, in words.

    Returns:
        query (d,), keys (s, d), values (s, dv), and the transforms (normalisation, RoPE) in order.
    """
    att = layer_trace.attention
    if module.projection_note:  # projections qkv cannot read as matrices: what the kernel read
        return (att.query[0, head, row].double(), att.key[0, head].double(),
                att.value[0, head].double(), [])
    q_rows, kv_rows = head_slice(module, head)
    position = int(layer_trace.rows[row])
    x = layer_trace.query_input[0, row].double()  # (E,)
    xs_k = layer_trace.key_input[0].double()  # (s, kdim)
    xs_v = layer_trace.value_input[0].double()  # (s, vdim)
    d = module.head_dim
    # OLMo 2 normalises the whole projection, every head's features together: then every
    # head is projected; otherwise (Qwen3's per-head norm, or none) this head's rows only
    whole = module.q_norm is not None and norm_width(module.q_norm) != d
    query = _project(x, module.q_proj, slice(None) if whole else q_rows)[None]  # (1, d) or (1, h·d)
    keys = _project(xs_k, module.k_proj, slice(None) if whole else kv_rows)  # (s, d) or (s, h_kv·d)
    values = _project(xs_v, module.v_proj, kv_rows)  # (s, dv)
    positions = (torch.tensor([position], device=x.device), torch.arange(keys.shape[0], device=x.device))
    transform = []
    # the model's own order: Qwen3 normalises q and the k_j, then rotates them; HunYuan rotates first
    for stage in ("rotation", "norm") if module.norm_after_rotation else ("norm", "rotation"):
        if stage == "norm" and module.q_norm is not None:
            query, keys = head_norm(module.q_norm, query, d), head_norm(module.k_norm, keys, d)
            transform.append(f"normalised {'across the heads together' if whole else 'per head'} "
                             f"({norm_kind(module.q_norm).name})")  # what it does, whatever its class
        elif stage == "rotation" and layer_trace.position_step is not None:
            # RoPE rotates queries and keys by their positions before the dot product
            query, keys = (_rotated(layer_trace.position_step, v, at, d)
                           for v, at in zip((query, keys), positions))
            transform.append(f"rotated by RoPE (q by its position {position}, each k_j by j)")
    if whole:
        query, keys = query[:, q_rows], keys[:, kv_rows]  # (1, d), (s, d)
    return query[0], keys, values, transform


def _rotated(step, v: torch.Tensor, positions: torch.Tensor, d: int) -> torch.Tensor:
    """v (n, m·d) at positions (n,) — m heads side by side (m = 1: one head) — with each head
    turned by the position step."""
    n, m = v.shape[0], v.shape[-1] // d
    return step(v.reshape(n * m, d), positions.repeat_interleave(m)).view(n, m * d)


def _stage_diffs(recomputed: dict[str, torch.Tensor], att, *, head: int,
                 row: int) -> dict[str, float]:
    """Per stage, the max absolute difference between the float64 recomputation and the tensors
    the forward recorded (`att`, an `AttentionTrace`) for head `head`, traced row `row`."""
    recorded = {"query": att.query[0, head, row], "keys": att.key[0, head],
                "values": att.value[0, head], "scores": att.scores[0, head, row],
                "weights": att.weights[0, head, row], "output": att.output[0, head, row]}
    return {stage: _max_diff(recomputed[stage], recorded[stage]) for stage in recorded}


def explain_head(model, text: str, *, token: str | None = None, layer: int, head: int,
                 words: bool = False) -> HeadSteps:
    """One head's arithmetic for one token of `text`, step by step (see the module doc).

    With `words=True` a word of several tokens is explained at its last token (`word` and
    `word_tokens` say so). Only that token's rows are traced.

    Args:
        model: a self-attention model from [`qkv.load`][qkv.load].
        token: a word, `"word@N"` or an index (see [`qkv.explain.explain`][qkv.explain.explain]);
            None: the last word.
        layer, head: counting from 0.

    Raises:
        ArgumentError: `token` not in the text, `layer`/`head` out of range.
        QkvError: an empty text.

    Examples:
        >>> import qkv
        >>> model = qkv.load("minilm")
        >>> st = explain_head(model, "The dog found some pizza next to the baby and ate it",
        ...                   token="it", layer=3, head=1)
        >>> st.tokens[int(st.weights.argmax())], round(float(st.weights.max()), 2)
        ('pizza', 0.75)
        >>> st.keys.shape, st.max_abs_diff < 1e-5       # (s, d): one key per token
        (torch.Size([14, 32]), True)
    """
    return explain_heads(model, text, token=token, heads=[(layer, head)], words=words)[0]


def explain_heads(model, text: str, *, token: str | None = None,
                  heads: list[tuple[int, int]], words: bool = False) -> list[HeadSteps]:
    """[`explain_head`][qkv.explain.steps.explain_head] of one token for each `(layer, head)` in
    `heads`, from one forward: the forward records that token's rows in every layer, and each head
    is read off the same record (a page that shows every head of a token needs one forward, not
    L·H).

    Examples:
        >>> import qkv
        >>> model = qkv.load("minilm")
        >>> both = explain_heads(model, "the cat sat", token="cat", heads=[(0, 0), (3, 1)])
        >>> [(st.layer, st.head) for st in both]
        [(0, 0), (3, 1)]
        >>> both[1].to_dict() == explain_head(model, "the cat sat", token="cat", layer=3, head=1).to_dict()
        True
    """
    check_text(text)
    for layer, head in heads:
        check_layer_head(model, layer, head)
    encoding = encode(model, text)
    units, choice = choose_in(token, encoding, text, words=words, role="token")
    group = units.groups[choice.unit]
    position = group[-1]
    traced = _trace_row(model, text, torch.tensor([position], device=device_of(model)),
                        [layer for layer, _ in heads], words=words, encoding=encoding)
    out = []
    for layer, head in heads:
        layer_trace = traced.traces[layer].self_attn
        st = head_steps(model.layers[layer].self_attn, layer_trace, layer=layer, head=head, row=0,
                        tokens=traced.tokens, model=model_name(model), text=text)
        entering = traced.hidden_states[layer][0, position]
        out.append(replace(st, x_is_layer_input=torch.equal(entering, layer_trace.query_input[0, 0]),
                           word=units.labels[choice.unit] if words else None,
                           word_tokens=tuple(group) if words else (),
                           notes=(choice.note,) if choice.note else ()))
    return out


def _trace_row(model, text: str, rows: torch.Tensor, layers: list[int], *, words: bool,
               encoding) -> Traced:
    """The forward `explain_heads` reads: `rows` traced in every layer up to the last of
    `layers`, which stops after its attention (`attention_only`: its feed-forward, the largest
    transient of a layer, never runs; `hidden_states` end with what entered it).

    The earlier layers trace the row too, so one head's numbers are the same whichever heads
    are asked with it (a traced row runs the reference path, whose rounding its later layers
    then read). When only the last layer's record is read (`explain_head`), the earlier layers
    keep the row's weights alone (`Weights`: the same reference path, the same numbers), not
    their inputs, keys, values, heads and residual — O(t · E) numbers a layer (GPT-2 shape,
    layer 6, 512 tokens: 125 → 63 MiB above the weights). This needs `LayerRows.at` to hand
    `earlier`'s `Weights` to those layers as it hands a `Writes`; where it does not, they get
    `rows` (a `Weights` is truthy) and keep their whole record: the same numbers, the old peak.
    A non-finite number is named by the whole trace, run again.
    """
    last = max(layers)
    if not stops_at_layer(model, last):
        return trace(model, text, rows, words=words, encoding=encoding, last_layer=last)
    earlier = Weights(rows) if set(layers) == {last} else True
    try:
        return trace(model, text, LayerRows(last, rows, earlier=earlier, attention_only=True),
                     words=words, encoding=encoding)
    except NonFiniteError:
        trace(model, text, rows, words=words, encoding=encoding, last_layer=last)  # names where it starts
        raise
