"""Terminal output for an encoder-decoder's cross-attention (`qkv explain TEXT --model
translate`, or a transformers encoder-decoder directory): rich tables, plain text in a pipe. Every number is read off the results of
[`qkv.explain.cross`][qkv.explain.cross]; this module formats, it never computes attention.
"""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from qkv.explain.cross import GOLD_MARK, CrossAttention, CrossHeadSteps
from qkv.explain.rendering.render import HIGHLIGHT, head_name, number, vector
from qkv.models.tokenizer import display_token


def render_cross_overview(out: Console, ca: CrossAttention, *, model_arg: str = "translate") -> None:
    """Each head's most-attended source token per target token, or with `ca.token` that
    token's top source tokens per head. `model_arg`: how to name the model in a command."""
    L, H = ca.weights.shape[:2]
    out.print(Text(f"model: {ca.model} · decoder: {L} layers × {H} cross-attention heads"))
    out.print(Text("source: " + " ".join(f"{i}:{t}" for i, t in enumerate(ca.source))))
    out.print(Text("target: " + " ".join(f"{j}:{t}" for j, t in enumerate(ca.target))
                   + f"   ({ca.translation})"))
    if ca.gold_note:
        out.print(Text(ca.gold_note))
    counts = ca.alignment()
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    table.add_column("head", no_wrap=True)
    token = ca.token
    if token is not None:
        out.print(Text(f"target token {token} {display_token(ca.target[token])!r}: the source tokens each head "
                       f"attends to most while producing it"
                       + (f" ({GOLD_MARK} = gold: {', '.join(display_token(ca.source[i]) for i in ca.gold[token])})"
                          if ca.is_gold(token, 0) is not None else "")))
        table.add_column(f"attends most to (top {ca.top})", no_wrap=True)
        for l in ca.layers:
            for h in range(H):
                cells = [f"{display_token(ca.source[i])}{GOLD_MARK if ca.is_gold(token, i) else ''} {number(w, 3)}"
                         for i, w in ca.top_weights(l, h, token)]
                hit = ca.is_gold(token, int(ca.argmax[l, h, token]))
                table.add_row(head_name(l, h), " · ".join(cells), style=HIGHLIGHT if hit else None)
        out.print(table)
        return
    out.print(Text("for each target token (column), the source token each head attends to most "
                   "while producing it" + (f"; {GOLD_MARK} = in the gold alignment" if counts is not None else "")))
    for t in ca.target:
        table.add_column(t, no_wrap=True)
    if counts is not None:
        table.add_column("aligned", justify="right", no_wrap=True)
    for l in ca.layers:
        for h in range(H):
            cells = []
            for j in range(len(ca.target)):
                i = int(ca.argmax[l, h, j])
                cells.append(ca.source[i] + (GOLD_MARK if ca.is_gold(j, i) else ""))
            if counts is not None:
                cells.append(f"{int(counts[l, h])}/{len(ca.gold)}")
            best = counts is not None and int(counts[l, h]) == len(ca.gold)
            table.add_row(head_name(l, h), *cells, style=HIGHLIGHT if best else None)
    out.print(table)
    if counts is not None:
        flat = int(counts.argmax())
        l, h = divmod(flat, H)
        out.print(Text(f"best aligned head on this sentence: {head_name(l, h)} "
                       f"({int(counts[l, h])}/{len(ca.gold)} target words on a gold source token); "
                       f"every head over the whole test split: qkv evaluate --model {model_arg}"))


def render_cross_steps(out: Console, cs: CrossHeadSteps) -> None:
    """One head's arithmetic for one target token, step by step, beside the forward's numbers."""
    st, ca, j = cs.steps, cs.attention, cs.target_index
    d = st.head_dim
    out.print(Text(f"model: {ca.model} · decoder layer {st.layer}, cross-attention head {st.head} · "
                   f"target token {j} {ca.target[j]!r} of {ca.translation!r} · head dim d = {d}"))
    E = st.x.numel()
    out.print(Text(f"1) x = {cs.x_source}\n   x = {vector(st.x)}"))
    if st.projection:  # projections qkv could not read as matrices: the kernel's q, k, v
        out.print(Text(f"2) {st.projection}\n   q = {vector(st.query)}"))
    else:
        out.print(Text(f"2) q = x·W_Q + b_Q   (W_Q: {E}×{d}, this head's slice of the "
                       f"cross-attention's query projection)\n   q = {vector(st.query)}"))
    root = abs(st.scale * d ** 0.5 - 1) < 1e-6  # T5 leaves 1/√d out (its scale is 1)
    scale = f"{number(st.scale, 6)} (= 1/√{d})" if root else \
        f"{number(st.scale, 6)} (the model's scale, not 1/√{d})"
    scaled = f"/√{d}" if root else f"×{number(st.scale, 4)}"
    out.print(Text(f"3) for every source token i, m_i = the encoder's output (the memory): "
                   f"k_i = m_i·W_K + b_K, v_i = m_i·W_V + b_V; score q·k_i, scaled by {scale}, "
                   f"softmax"))
    gold = cs.gold
    masked = bool((st.mask != 0).any())
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    cols = [("i", "right"), ("source", "left")] + ([("gold", "left")] if gold is not None else []) + \
           [(f"k_i ({d})", "left"), ("q·k_i", "right"), (scaled, "right")] + \
           ([("mask", "right")] if masked else []) + \
           [("weight", "right"), (f"v_i ({st.values.shape[-1]})", "left")]
    for name, justify in cols:
        table.add_column(name, justify=justify, no_wrap=True)
    best = int(st.weights.argmax())
    for i in range(st.keys.shape[0]):
        cells = [str(i), ca.source[i]] + ([GOLD_MARK if i in gold else ""] if gold is not None else [])
        cells += [vector(st.keys[i], head=2, tail=1, digits=3), number(float(st.scores[i]), 3),
                  number(float(st.scaled[i]), 4)]
        cells += [number(float(st.mask[i]), 1)] if masked else []
        cells += [number(float(st.weights[i]), 4), vector(st.values[i], head=2, tail=1, digits=3)]
        table.add_row(*cells, style=HIGHLIGHT if i == best else None)
    out.print(table)
    out.print(Text(f"   sum of the weights = {float(st.weights.sum()):.6f}; most weight on "
                   f"{ca.source[best]!r}" + (f" ({'in' if best in gold else 'not in'} the gold "
                                              f"alignment)" if gold is not None else "")))
    out.print(Text(f"4) output = Σ_i w_i v_i = {vector(st.output)}"))
    out.print(Text(f"   the model's own head output (from its forward) = {vector(st.model_output)}"))
    diffs = ", ".join(f"{k} {v:.1e}" for k, v in st.diffs.items() if k != "output")
    out.print(Text(f"   max |difference| = {st.max_abs_diff:.1e}  (recomputed in float64 vs the "
                   f"forward's float32; other stages: {diffs})"))
