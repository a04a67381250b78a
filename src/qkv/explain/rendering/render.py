"""Terminal output for `qkv explain`, `qkv heads` and `qkv softmax-demo` (rich tables;
plain text in a pipe).

Each `render_*` function prints one result of [`qkv.explain`][qkv.explain] to a rich `Console`; the
helpers at the top (`console`, `vector`, `weights_line`, `head_name`) are
shared with the cross-attention view (`qkv.explain.render_cross`). Every number shown is
read off the result — this module formats, it never computes attention. Notes that name
arguments are spelled with `names` (the CLI passes its flags; see `qkv.explain.wording`).
"""

from __future__ import annotations

import io
import math
import sys
from collections import Counter
from collections.abc import Mapping

import torch
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from qkv.explain.causal.ablation import NoProjection
from qkv.explain.contributions import Method, get_method
from qkv.explain.probes.find_heads import HeadRanking, ProbeResult
from qkv.explain.overview import CAUSAL, Overview, ranking
from qkv.explain.saturation import Saturation
from qkv.explain.select import WORD_RULE, Units
from qkv.explain.steps import HeadSteps
from qkv.explain.wording import ARGUMENTS, Message
from qkv.models.tokenizer import display_token

HIGHLIGHT = "bold yellow"
MARK = "*"


def console(file=None) -> Console:
    """A rich Console on stdout: colour in a terminal; plain, 120 columns wide in a pipe/file."""
    file = file if file is not None else sys.stdout
    tty = isinstance(file, io.IOBase) and file.isatty()
    return Console(file=file, width=None if tty else 120, no_color=not tty,
                   force_terminal=tty, highlight=False, soft_wrap=not tty)


def head_name(layer: int, head: int | None) -> str:
    """`L3 H1` — layers and heads count from 0; `L3` for a per-layer method's row."""
    return f"L{layer}" if head is None else f"L{layer} H{head}"


def number(v: float, digits: int = 4) -> str:
    """A fixed-point number; ±inf and nan spelled as Python does."""
    if not math.isfinite(v):
        return "-inf" if v < 0 else ("inf" if v > 0 else "nan")
    return f"{v:.{digits}f}"


def vector(v: torch.Tensor, *, head: int = 3, tail: int = 1, digits: int = 4) -> str:
    """`[0.1234, -0.5, 0.9, …, 0.3] (384)` — long vectors abbreviated, with their dimension.

    Examples:
        >>> vector(torch.arange(10.0), digits=1)
        '[0.0, 1.0, 2.0, …, 9.0] (10)'
    """
    values = v.double().flatten().tolist()
    if len(values) <= head + tail + 1:
        shown = [number(x, digits) for x in values]
    else:
        shown = [number(x, digits) for x in values[:head]] + ["…"] + \
                [number(x, digits) for x in values[len(values) - tail:]]
    return f"[{', '.join(shown)}] ({len(values)})"


def weights_line(pairs: list[tuple[str, float]], digits: int = 3) -> str:
    """`pizza 0.750 · ate 0.120` for (label, weight) pairs."""
    return " · ".join(f"{label} {number(w, digits)}" for label, w in pairs)


def units_line(units: Units, chosen: int | None = None) -> Text:
    """`0:[CLS] 1:the …` with the chosen unit emphasised."""
    out = Text()
    for i, label in enumerate(units.labels):
        if i:
            out.append(" ")
        out.append(f"{i}:{label}", style="bold reverse" if i == chosen else None)
    return out


def _header(out: Console, model: str, units: Units, unit: int | None, extra: str = "") -> None:
    out.print(Text(f"model: {model}{extra}"))
    out.print(Text(f"{units.kind}s: ").append_text(units_line(units, unit)))
    if units.words:
        out.print(Text(f"grouping: sub-word tokens grouped back into words ({WORD_RULE})"))


# -- overview ------------------------------------------------------------------------------------
def render_overview(out: Console, ov: Overview, *, names: Mapping[str, str] = ARGUMENTS) -> None:
    units = ov.units
    _header(out, ov.model, units, ov.unit, f" ({ov.num_layers} layers × {ov.num_heads} heads)")
    tokens = ", ".join(str(t) for t in units.groups[ov.unit])
    m = get_method(ov.method)
    out.print(Text(f"{m.row_heading} {units.kind} {ov.unit} {units.labels[ov.unit]!r}"
                   + (f" (tokens {tokens})" if units.words and len(units.groups[ov.unit]) > 1 else "")))
    if not m.raw:
        out.print(Text(f"method: {m.name} = {m.formula}"
                       + (f"; y = {ov.target}" if ov.target else "")))
    out.print(Text(f"ranked by: {ranking(ov.method)}"))
    if ov.causal:
        out.print(Text(CAUSAL))
    if ov.sink is not None:
        out.print(Text(ov.sink.spelled(names)))
    out.print(Text(f"{MARK} {ov.focus_reason.spelled(names)}"),
              style=HIGHLIGHT if ov.focus is not None else None)
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for name, justify in (("", "left"), ("rank", "right"), ("head", "left"), ("max", "right"),
                          ("entropy", "right"), (f"attends most to (top {len(ov.rows[0].top)})", "left")):
        table.add_column(name, justify=justify, no_wrap=True)
    for rank, row in enumerate(ov.rows, 1):
        lit = ov.highlighted(row)
        top = weights_line([(units.labels[i], w) for i, w in row.top])
        table.add_row(MARK if lit else "", str(rank), head_name(row.layer, row.head),
                      number(row.max_weight, 3), f"{row.entropy:.2f}", top,
                      style=HIGHLIGHT if lit else None)
    out.print(table)
    votes = Counter(units.labels[r.argmax] for r in ov.rows)
    summary = " · ".join(f"{label} {n}" for label, n in votes.most_common())
    rows = f"{len(ov.rows)} layers" if ov.per == "layer" else f"{len(ov.rows)} heads"
    out.print(Text(f"where the largest {m.value} lands ({rows}): {summary}"))


# -- step by step --------------------------------------------------------------------------------
def _x_source(st: HeadSteps) -> str:
    i, L, E = st.token_index, st.layer, st.x.numel()
    what = "the layer turns into q" if st.projection else "projected into q"
    if st.x_is_layer_input is False:
        return (f"the layer's normalised input at token {i} (norm1(hidden_states[{L}][{i}]), "
                f"pre-norm), the {E} numbers {what}")
    return f"the vector entering layer {L} at token {i} (hidden_states[{L}][{i}]), the {E} numbers {what}"


def render_steps(out: Console, st: HeadSteps, *, names: Mapping[str, str] = ARGUMENTS) -> None:
    d, i, tok = st.head_dim, st.token_index, display_token(st.tokens[st.token_index])
    out.print(Text(f"model: {st.model} · layer {st.layer}, head {st.head} · token {i} {tok!r} of "
                   f"{len(st.tokens)} · head dim d = {d}"))
    if len(st.word_tokens) > 1:
        pieces = ", ".join(display_token(st.tokens[j]) for j in st.word_tokens)
        note = Message("{word!r} is {n} tokens ({pieces}); the arithmetic is shown for its last "
                       "token, {i} (pick another with {token} INDEX, without {words})",
                       word=st.word, n=len(st.word_tokens), pieces=pieces, i=i)
        out.print(Text(note.spelled(names)))
    E = st.x.numel()
    out.print(Text(f"1) x = {_x_source(st)}\n   x = {vector(st.x)}"))
    then = f"; q and every k_j then {st.qk_transform}" if st.qk_transform else ""
    if st.projection:  # the projections are not matrices qkv can read: say so, start from q
        out.print(Text(f"2) q = the query the attention kernel read (not recomputed): "
                       f"{st.projection}\n   q = {vector(st.query)}"))
        kv = "k_j and v_j as the kernel read them"
    else:
        out.print(Text(f"2) q = x·W_Q + b_Q   (W_Q: {E}×{d}, this head's slice of the query "
                       f"projection){then}\n   q = {vector(st.query)}"))
        kv = "k_j = x_j·W_K + b_K and v_j = x_j·W_V + b_V"
    scale = f"{number(st.scale, 6)} (= 1/√{d})" if abs(st.scale * d ** 0.5 - 1) < 1e-6 else \
        f"{number(st.scale, 6)} (the model's scale, not 1/√{d})"
    cap = f", soft-capped to {number(st.softcap, 4)}·tanh(·/{number(st.softcap, 4)})" if st.softcap else ""
    sink = (f", softmax with this head's sink logit {number(st.sink, 4)} in the denominator "
            f"(it takes weight and hands on no value)") if st.sink is not None else ", softmax"
    out.print(Text(f"3) for every token j: {kv}; score q·k_j, scaled by {scale}{cap}{sink}"))
    masked = bool((st.mask != 0).any())
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    cols = [("j", "right"), ("token", "left"), (f"k_j ({d})", "left"), ("q·k_j", "right"),
            (f"/√{d}", "right")] + ([("mask", "right")] if masked else []) + \
           [("weight", "right"), (f"v_j ({st.values.shape[-1]})", "left")]
    for name, justify in cols:
        table.add_column(name, justify=justify, no_wrap=True)
    top = int(st.weights.argmax())
    for j in range(st.keys.shape[0]):
        cells = [str(j), display_token(st.tokens[j]), vector(st.keys[j], head=2, tail=1, digits=3),
                 number(float(st.scores[j]), 3), number(float(st.scaled[j]), 4)]
        cells += [number(float(st.mask[j]), 1)] if masked else []
        cells += [number(float(st.weights[j]), 4), vector(st.values[j], head=2, tail=1, digits=3)]
        table.add_row(*cells, style=HIGHLIGHT if j == top else None)
    out.print(table)
    out.print(Text(f"   sum of the weights = {float(st.weights.sum()):.6f}"))
    out.print(Text(f"4) output = Σ_j w_j v_j = {vector(st.output)}"))
    out.print(Text(f"   the model's own head output (from its forward) = {vector(st.model_output)}"))
    diffs = ", ".join(f"{k} {v:.1e}" for k, v in st.diffs.items() if k != "output")
    out.print(Text(f"   max |difference| = {st.max_abs_diff:.1e}  (recomputed in float64 vs the "
                   f"forward's float32; other stages: {diffs})"))


# -- heads ---------------------------------------------------------------------------------------
def render_pair(out: Console, ranking: HeadRanking, *, top: int) -> None:
    """The `top` heads of the ranking (the rest are counted)."""
    units, source, target, ranked = ranking.units, ranking.source, ranking.target, ranking.heads
    _header(out, ranking.model, units, source)
    m = get_method(ranking.method)
    what = _value(m)
    rows = "every layer" if ranking.per == "layer" else "every layer and head"
    out.print(Text(f"{what} from {units.labels[source]!r} ({units.kind} {source}) to "
                   f"{units.labels[target]!r} ({units.kind} {target}), {rows}, "
                   f"largest first"))
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for name, justify in (("rank", "right"), ("head" if ranking.per == "head" else "layer", "left"),
                          (m.value, "right")):
        table.add_column(name, justify=justify)
    for rank, h in enumerate(ranked[:top], 1):
        table.add_row(str(rank), head_name(h.layer, h.head), number(h.weight, 4))
    out.print(table)
    if len(ranked) > top:
        kind = "heads" if ranking.per == "head" else "layers"
        out.print(Text(f"… {len(ranked) - top} more {kind} (--top {len(ranked)} or --json for all)"))


def _value(m: Method) -> str:
    """What a ranked number is, in words: `weight`, or e.g. `alti share`."""
    return m.value if m.raw else f"{m.name} {m.value}"


def render_probe(out: Console, result: ProbeResult, *, top: int) -> None:
    """The `top` heads by accuracy, chance, and the held-out check of the best one."""
    n = len(result.items)
    out.print(Text(f"model: {result.model} · coref probe: {n} sentences, each a pronoun and its labelled "
                   f"referent with decoy words between them"))
    per_head = result.per == "head"
    m = get_method(result.method)
    unit, largest = ("head" if per_head else "layer"), _value(m)
    out.print(Text(f"a {unit} is right when its largest {largest} from the pronoun, over the words "
                   "of the sentence other than the pronoun itself ([CLS]/[SEP] are not words), is "
                   "on the referent"))
    out.print(Text(f"chance (a word picked at random): {result.chance:.2f}"))
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for name, justify in (("rank", "right"), (unit, "left"), ("accuracy", "right"),
                          ("correct", "right")):
        table.add_column(name, justify=justify)
    ranked = result.ranked()
    for rank, (layer, head, acc, correct) in enumerate(ranked[:top], 1):
        table.add_row(str(rank), head_name(layer, head if per_head else None), f"{acc:.2f}",
                      f"{correct}/{n}")
    out.print(table)
    if len(ranked) > top:
        out.print(Text(f"… {len(ranked) - top} more {unit}s (--top {len(ranked)} or --json for all)"))
    (layer, head), even, odd = result.held_out()
    out.print(Text(f"held out: the best {unit} on the even-numbered sentences, "
                   f"{head_name(layer, head if per_head else None)} "
                   f"({even:.2f} there), scores {odd:.2f} on the odd-numbered ones"))
    if not m.raw and result.parked is not None:
        out.print(Text(f"on [CLS]/[SEP]/punctuation (the pronoun's row, mean over sentences and "
                       f"{unit}s): weight {float(result.parked_weight.mean()):.2f} → "
                       f"{result.method} {float(result.parked.mean()):.2f}"))


# -- ablation ------------------------------------------------------------------------------------
def render_ablation(out: Console, result: NoProjection) -> None:
    layers, tokens, width = result.layers, result.tokens, result.width
    out.print(Text(f"model: {result.model} · tokens: " + " ".join(f"{i}:{t}" for i, t in enumerate(tokens))))
    out.print(Text(f"--no-projection: q = k = v = x (the vectors entering each layer), scale "
                   f"1/√{width}, beside the learned W_Q, W_K, W_V. Figure: how often a token's "
                   f"largest weight is on itself."))
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for name in ("layer", "no projection", "learned heads", "‖x‖ min–max"):
        table.add_column(name, justify="right", no_wrap=True)
    t = len(tokens)
    for s in layers:
        h = s.learned_self.shape[0]
        table.add_row(str(s.layer), f"{int(s.plain_self.sum())}/{t} ({s.plain_rate:.0%})",
                      f"{int(s.learned_self.sum())}/{h * t} ({s.learned_rate:.0%})",
                      f"{float(s.norms.min()):.1f}–{float(s.norms.max()):.1f}")
    out.print(table)
    for s in layers:
        elsewhere = [f"{i}:{tokens[i]}→{j}:{tokens[j]} (‖x‖ {float(s.norms[i]):.1f} < "
                     f"{float(s.norms[j]):.1f})"
                     for i, j in enumerate(s.plain_target.tolist()) if not s.plain_self[i]]
        if elsewhere:
            out.print(Text(f"without projection, layer {s.layer}: " + ", ".join(elsewhere)))
    total = sum(int(s.plain_self.sum()) for s in layers)
    learned = sum(int(s.learned_self.sum()) for s in layers)
    cells = sum(s.learned_self.numel() for s in layers)
    out.print(Text(f"overall: without projections {total}/{t * len(layers)} "
                   f"({total / (t * len(layers)):.0%}) of tokens attend most to themselves; with "
                   f"the learned projections {learned}/{cells} ({learned / cells:.0%}) of "
                   f"(head, token) pairs do."))
    out.print(Text("why: token i scores itself ‖x_i‖² and token j ‖x_i‖‖x_j‖cos θ; a token "
                   "attends elsewhere when another vector is long enough in its direction "
                   "(‖x_j‖ cos θ > ‖x_i‖), so the claim depends on the norms."))


# -- why divide by √d_k --------------------------------------------------------------------------
def render_saturation(out: Console, rows: list[Saturation], *, keys: int, trials: int, seed: int) -> None:
    out.print(Text(f"q, k with independent N(0, 1) entries; {keys} keys per query; mean over "
                   f"{trials} queries (seed {seed})"))
    out.print(Text("max weight: the largest softmax weight (1/keys = uniform, 1 = saturated); "
                   "gradient: ‖∂softmax/∂scores‖ (near 0 = nothing left to learn from)"))
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for name in ("d", "std q·k", "std q·k/√d", "max weight raw", "max weight /√d",
                 "gradient raw", "gradient /√d"):
        table.add_column(name, justify="right")
    for r in rows:
        table.add_row(str(r.d), f"{r.score_std:.2f}", f"{r.scaled_std:.2f}",
                      f"{r.max_weight_raw:.3f}", f"{r.max_weight_scaled:.3f}",
                      f"{r.grad_raw:.3f}", f"{r.grad_scaled:.3f}")
    out.print(table)
