"""``qkv explain TEXT --model translate``: where each generated French word looked in the English.

The model translates TEXT greedily; then one teacher-forced forward pass over its own output
records every cross-attention weight (:meth:`TranslationModel.trace`). French position j is the
decoder position that *produces* French token j (its input is token j−1), so row j of a head's
(t, s) map is where that head looked while the model chose token j::

                English (keys, from the encoder's memory)
                the   red   apple  is   [EOS]
    la          ■                                  ← producing "la"
    pomme             ·     ■
    rouge             ■
    est                            ■
    [EOS]                               ■

Without ``--layer/--head``: for every French token, the English token each head attends to most,
checked against the grammar's gold alignment when TEXT is a sentence of the grammar. With
``--token``: that French token's top English tokens per head. With ``--layer L --head H``: the
arithmetic — the decoder's query against the encoder's keys and values — redone in float64 by
:func:`qkv.explain.steps.head_steps` and compared with the forward's own numbers.
"""

from __future__ import annotations

import math
import shlex
import sys
from dataclasses import dataclass

import torch

from qkv.errors import QkvError
from qkv.explain.select import Units, choose
from qkv.models.translation import TranslationTrace
from qkv.translate.checkpoint import Checkpoint, load_checkpoint
from qkv.translate.decode import greedy_decode
from qkv.translate.grammar import make_pair
from qkv.translate.vocab import BOS_ID, EOS, EOS_ID, normalize_en

GOLD_MARK = "✓"


@dataclass(frozen=True)
class CrossAttention:
    """One sentence's translation and every cross-attention weight of the forward that scored it.

    Fields:
        english: the s English tokens, ending with [EOS] (the keys).
        french: the t generated French tokens, ending with [EOS] (the queries).
        translation: the French sentence.
        weights: (L, H, t, s) cross-attention weights, exactly as the forward computed them.
        gold: per French token (not [EOS]), the gold English token indices; None when TEXT is
            not a sentence of the grammar or the model's French differs from the grammar's.
        gold_note: why ``gold`` is None (or None).
        trace: the full :class:`TranslationTrace` (queries, keys, values, scores… per layer).
    """

    english: list[str]
    french: list[str]
    translation: str
    weights: torch.Tensor
    gold: list[tuple[int, ...]] | None
    gold_note: str | None
    trace: TranslationTrace

    @property
    def argmax(self) -> torch.Tensor:
        """(L, H, t): the English index each head attends to most, per French position."""
        return self.weights.argmax(-1)

    def is_gold(self, j: int, i: int) -> bool | None:
        if self.gold is None or j >= len(self.gold):
            return None
        return i in self.gold[j]

    def alignment(self) -> torch.Tensor | None:
        """(L, H) correct counts over the French tokens (not [EOS]); None without gold."""
        if self.gold is None:
            return None
        n = len(self.gold)
        gold = torch.zeros(n, len(self.english), dtype=torch.bool)
        for j, srcs in enumerate(self.gold):
            gold[j, list(srcs)] = True
        return gold[torch.arange(n), self.argmax[..., :n]].sum(-1)  # (L, H)


@torch.no_grad()
def cross_attention(ckpt: Checkpoint, text: str) -> CrossAttention:
    """Translate ``text`` and trace the forward pass over the translation (see the module doc)."""
    model, vocab = ckpt.model, ckpt.vocab
    src = torch.tensor([vocab.encode_en(text)])  # (1, s); QkvError for empty text / unknown words
    generated = greedy_decode(model, src)[0].tolist()
    ids = generated[: generated.index(EOS_ID) + 1] if EOS_ID in generated else generated
    tgt_in = torch.tensor([[BOS_ID] + ids[:-1]])  # (1, t): position j reads token j−1
    _, trace = model.trace(src, tgt_in)
    weights = torch.stack([layer.cross_attn.attention.weights[0] for layer in trace.decoder])  # (L, H, t, s)
    english = vocab.en_tokens(src[0].tolist()) + [EOS]
    french_words = vocab.fr_tokens(ids)
    french = french_words + ([EOS] if ids and ids[-1] == EOS_ID else [])
    gold, note = _gold(text, french_words)
    return CrossAttention(english, french, vocab.decode_fr(ids), weights, gold, note, trace)


def _gold(text: str, french: list[str]) -> tuple[list[tuple[int, ...]] | None, str | None]:
    try:
        pair = make_pair(normalize_en(text))
    except ValueError as e:
        return None, f"no gold alignment: the text is not a sentence of the grammar ({e})"
    if list(pair.fr_tokens) != french:
        return None, (f"no gold alignment: the model's French differs from the grammar's "
                      f"({pair.fr!r})")
    return list(pair.alignment), None


# -- the command --------------------------------------------------------------------------------
def explain_translation(args) -> int:
    """``qkv explain`` for a translation model; ``args`` as the explain command parses them."""
    if getattr(args, "to", None) is not None or getattr(args, "no_projection", False):
        raise QkvError("--to and --no-projection are for self-attention models; a translation "
                       "model's cross-attention is shown per French token (--token, --layer, --head)")
    top = getattr(args, "top", 3)
    if top < 1:
        raise QkvError(f"--top must be at least 1, got {top}")
    if args.head is not None and args.layer is None:
        raise QkvError(f"--head {args.head} needs --layer (heads are counted within a layer)")
    if args.png:
        from qkv.explain.plots import check_writable

        check_writable(args.png)
    ckpt = load_checkpoint(args.model)
    _check_layer_head(ckpt, args.layer, args.head)
    ca = cross_attention(ckpt, args.text)
    units = Units(labels=ca.french, groups=[(j,) for j in range(len(ca.french))],
                  special=[t == EOS for t in ca.french], words=False, num_tokens=len(ca.french))
    chosen = None
    if args.token is not None or args.head is not None:
        choice = choose(args.token, units, option="--token")
        if choice.note:
            print(f"qkv: note: {choice.note}", file=sys.stderr)
        chosen = choice.unit
    name = _model_name(ckpt)
    if args.head is not None:
        return _steps(ckpt, ca, args, chosen, name)
    if args.png:
        _overview_png(ca, args.png, name, args.layer)
    if args.json:
        _print_json(overview_json(ca, model=name, text=args.text, token=chosen, top=top,
                                  layer=args.layer))
    else:
        render_overview(ca, model=name, token=chosen, top=top, layer=args.layer,
                        model_arg=shlex.quote(str(args.model)))
    if args.png:
        print(f"wrote {args.png}", file=sys.stderr)
    return 0


def _model_name(ckpt: Checkpoint) -> str:
    from qkv.translate.checkpoint import default_model_dir

    shipped = ckpt.directory.resolve() == default_model_dir().resolve()
    return "translate (shipped)" if shipped else str(ckpt.directory)


def _check_layer_head(ckpt: Checkpoint, layer: int | None, head: int | None) -> None:
    L, H = ckpt.model.config.decoder_layers, ckpt.model.config.num_heads
    if layer is not None and not 0 <= layer < L:
        raise QkvError(f"--layer {layer} is out of range: the decoder has {L} layers (0–{L - 1})")
    if head is not None and not 0 <= head < H:
        raise QkvError(f"--head {head} is out of range: each layer has {H} heads (0–{H - 1})")


def _print_json(obj) -> None:
    import json

    json.dump(obj, sys.stdout, ensure_ascii=False, allow_nan=False)
    sys.stdout.write("\n")


def _layers(ca: CrossAttention, layer: int | None) -> list[int]:
    return list(range(ca.weights.shape[0])) if layer is None else [layer]


def _top(ca: CrossAttention, layer: int, head: int, j: int, k: int) -> list[tuple[int, float]]:
    w = ca.weights[layer, head, j]
    values, index = w.topk(min(k, w.numel()))
    return [(int(i), float(v)) for v, i in zip(values, index)]


# -- overview -------------------------------------------------------------------------------------
def overview_json(ca: CrossAttention, *, model: str, text: str, token: int | None, top: int,
                  layer: int | None) -> dict:
    """Every cross-attention weight (``weights[l][h][j][i]``) and the per-head summaries."""
    layers = _layers(ca, layer)
    counts = ca.alignment()
    heads = []
    for l in layers:
        for h in range(ca.weights.shape[1]):
            entry = {"layer": l, "head": h, "argmax": ca.argmax[l, h].tolist()}
            if counts is not None:
                entry["aligned"] = int(counts[l, h])
                entry["alignment_accuracy"] = int(counts[l, h]) / len(ca.gold)
            if token is not None:
                entry["top"] = [{"index": i, "token": ca.english[i], "weight": w,
                                 "gold": ca.is_gold(token, i)} for i, w in _top(ca, l, h, token, top)]
            heads.append(entry)
    return {
        "model": model, "text": text, "english": ca.english, "french": ca.french,
        "translation": ca.translation, "layers": layers, "num_heads": ca.weights.shape[1],
        "weights": ca.weights[layers].tolist(), "gold": [list(g) for g in ca.gold] if ca.gold else None,
        "gold_note": ca.gold_note, "token": token, "heads": heads,
    }


def render_overview(ca: CrossAttention, *, model: str, token: int | None, top: int,
                    layer: int | None, model_arg: str = "translate", file=None) -> None:
    from rich import box
    from rich.table import Table
    from rich.text import Text

    from qkv.explain.render import HIGHLIGHT, console, head_name, number

    out = console(file)
    L, H = ca.weights.shape[:2]
    out.print(Text(f"model: {model} · decoder: {L} layers × {H} cross-attention heads"))
    out.print(Text("English: " + " ".join(f"{i}:{t}" for i, t in enumerate(ca.english))))
    out.print(Text("French:  " + " ".join(f"{j}:{t}" for j, t in enumerate(ca.french))
                   + f"   ({ca.translation})"))
    if ca.gold_note:
        out.print(Text(ca.gold_note))
    counts = ca.alignment()
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    table.add_column("head", no_wrap=True)
    if token is not None:
        out.print(Text(f"French token {token} {ca.french[token]!r}: the English tokens each head "
                       f"attends to most while producing it"
                       + (f" ({GOLD_MARK} = gold: {', '.join(ca.english[i] for i in ca.gold[token])})"
                          if ca.is_gold(token, 0) is not None else "")))
        table.add_column(f"attends most to (top {top})", no_wrap=True)
        for l in _layers(ca, layer):
            for h in range(H):
                cells = [f"{ca.english[i]}{GOLD_MARK if ca.is_gold(token, i) else ''} {number(w, 3)}"
                         for i, w in _top(ca, l, h, token, top)]
                hit = ca.is_gold(token, int(ca.argmax[l, h, token]))
                table.add_row(head_name(l, h), " · ".join(cells), style=HIGHLIGHT if hit else None)
        out.print(table)
        return
    out.print(Text("for each French token (column), the English token each head attends to most "
                   "while producing it" + (f"; {GOLD_MARK} = in the gold alignment" if counts is not None else "")))
    for j, t in enumerate(ca.french):
        table.add_column(t, no_wrap=True)
    if counts is not None:
        table.add_column("aligned", justify="right", no_wrap=True)
    for l in _layers(ca, layer):
        for h in range(H):
            cells = []
            for j in range(len(ca.french)):
                i = int(ca.argmax[l, h, j])
                cells.append(ca.english[i] + (GOLD_MARK if ca.is_gold(j, i) else ""))
            if counts is not None:
                cells.append(f"{int(counts[l, h])}/{len(ca.gold)}")
            best = counts is not None and int(counts[l, h]) == len(ca.gold)
            table.add_row(head_name(l, h), *cells, style=HIGHLIGHT if best else None)
    out.print(table)
    if counts is not None:
        flat = int(counts.argmax())
        l, h = divmod(flat, H)
        out.print(Text(f"best aligned head on this sentence: {head_name(l, h)} "
                       f"({int(counts[l, h])}/{len(ca.gold)} French tokens on a gold English token); "
                       f"every head over the whole test split: qkv evaluate --model {model_arg}"))


def _overview_png(ca: CrossAttention, path: str, model: str, layer: int | None) -> None:
    import matplotlib.pyplot as plt

    from qkv.explain.plots import save_atomic

    layers = _layers(ca, layer)
    H = ca.weights.shape[1]
    t, s = ca.weights.shape[2:]
    cell = 0.32
    fig, axes = plt.subplots(len(layers), H, squeeze=False,
                             figsize=(H * (cell * s + 1.2), len(layers) * (cell * t + 1.2)))
    for r, l in enumerate(layers):
        for h in range(H):
            _draw_map(axes[r][h], ca, l, h, labels=True, annotate=False)
            axes[r][h].set_title(f"L{l} H{h}", fontsize=8)
    fig.suptitle(f"{model}: cross-attention, French (rows) → English (columns); "
                 f"red boxes: gold alignment", fontsize=10)
    fig.tight_layout()
    save_atomic(fig, path)


def _draw_map(ax, ca: CrossAttention, layer: int, head: int, *, labels: bool, annotate: bool):
    from matplotlib.patches import Rectangle

    w = ca.weights[layer, head].double()  # (t, s)
    im = ax.imshow(w.numpy(), cmap="viridis", vmin=0.0, vmax=1.0)
    ax.set_xticks(range(len(ca.english)), ca.english if labels else [], rotation=90, fontsize=7)
    ax.set_yticks(range(len(ca.french)), ca.french if labels else [], fontsize=7)
    for j, srcs in enumerate(ca.gold or []):
        for i in srcs:
            ax.add_patch(Rectangle((i - 0.5, j - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=1.2))
    if annotate:
        for j in range(w.shape[0]):
            for i in range(w.shape[1]):
                v = float(w[j, i])
                if v >= 0.005:
                    label = f"{v:.2f}"  # "0.37" → ".37"; anything that rounds to 1.00 → "1"
                    label = "1" if label.startswith("1") else label[1:]
                    ax.text(i, j, label, ha="center", va="center", fontsize=6,
                            color="white" if v < 0.5 else "black")
    return im


def _head_png(ca: CrossAttention, path: str, model: str, layer: int, head: int) -> None:
    import matplotlib.pyplot as plt

    from qkv.explain.plots import save_atomic

    t, s = ca.weights.shape[2:]
    fig, ax = plt.subplots(figsize=(max(4.0, 0.42 * s + 2.2), max(3.5, 0.42 * t + 1.5)))
    im = _draw_map(ax, ca, layer, head, labels=True, annotate=True)
    ax.set_xlabel("English (keys: the encoder's output)")
    ax.set_ylabel("French (queries: the decoder producing this token)")
    ax.set_title(f"{model}: layer {layer}, head {head} cross-attention"
                 + ("; red boxes: gold alignment" if ca.gold else ""), fontsize=9)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="weight")
    save_atomic(fig, path)


# -- step by step ---------------------------------------------------------------------------------
def _steps(ckpt: Checkpoint, ca: CrossAttention, args, j: int, model: str) -> int:
    from qkv.explain.steps import head_steps

    layer, head = args.layer, args.head
    module = ckpt.model.decoder[layer].cross_attn
    st = head_steps(module, ca.trace.decoder[layer].cross_attn, layer=layer, head=head, row=j,
                    tokens=ca.english)
    if args.png:
        _head_png(ca, args.png, model, layer, head)
    if args.json:
        _print_json(steps_json(st, ca, j, model=model, text=args.text,
                               norm_first=ckpt.model.config.norm_first))
    else:
        render_steps(st, ca, j, model=model, norm_first=ckpt.model.config.norm_first)
    if args.png:
        print(f"wrote {args.png}", file=sys.stderr)
    return 0


def _x_source(ca: CrossAttention, j: int, layer: int, norm_first: bool) -> str:
    previous = "[BOS]" if j == 0 else repr(ca.french[j - 1])
    where = ("norm2 of the vector after the layer's self-attention (pre-norm)" if norm_first else
             "the vector after the layer's self-attention block (post-norm: its norm1 output)")
    return (f"the decoder's vector at French position {j} in layer {layer}: {where}; position {j} "
            f"reads {previous} and produces {ca.french[j]!r}")


def _finite(v: float):
    return v if math.isfinite(v) else ("-inf" if v < 0 else "inf" if v > 0 else "nan")


def steps_json(st, ca: CrossAttention, j: int, *, model: str, text: str, norm_first: bool) -> dict:
    """The float64 recomputation of one head for French token ``j``, every number in full."""

    def numbers(t: torch.Tensor):
        return [_finite(v) for v in t.tolist()] if t.ndim == 1 else [numbers(r) for r in t]

    return {
        "model": model, "text": text, "kind": "cross-attention", "english": ca.english,
        "french": ca.french, "translation": ca.translation, "layer": st.layer, "head": st.head,
        "french_index": j, "french_token": ca.french[j], "x_source": _x_source(ca, j, st.layer, norm_first),
        "gold": list(ca.gold[j]) if ca.gold and j < len(ca.gold) else None,
        "head_dim": st.head_dim, "scale": st.scale, "x": numbers(st.x), "query": numbers(st.query),
        "memory": numbers(ca.trace.decoder[st.layer].cross_attn.key_input[0].double()),
        "keys": numbers(st.keys), "values": numbers(st.values), "scores": numbers(st.scores),
        "scaled": numbers(st.scaled), "mask": numbers(st.mask), "weights": numbers(st.weights),
        "weights_sum": float(st.weights.sum()), "output": numbers(st.output),
        "model_output": numbers(st.model_output), "model_weights": ca.weights[st.layer, st.head, j].tolist(),
        "max_abs_diff": st.max_abs_diff, "stage_max_abs_diff": st.diffs,
    }


def render_steps(st, ca: CrossAttention, j: int, *, model: str, norm_first: bool, file=None) -> None:
    from rich import box
    from rich.table import Table
    from rich.text import Text

    from qkv.explain.render import HIGHLIGHT, console, number, vector

    out = console(file)
    d = st.head_dim
    out.print(Text(f"model: {model} · decoder layer {st.layer}, cross-attention head {st.head} · "
                   f"French token {j} {ca.french[j]!r} of {ca.translation!r} · head dim d = {d}"))
    E = st.x.numel()
    out.print(Text(f"1) x = {_x_source(ca, j, st.layer, norm_first)}\n   x = {vector(st.x)}"))
    out.print(Text(f"2) q = x·W_Q + b_Q   (W_Q: {E}×{d}, this head's slice of the cross-attention's "
                   f"query projection)\n   q = {vector(st.query)}"))
    out.print(Text(f"3) for every English token i, m_i = the encoder's output (the memory): "
                   f"k_i = m_i·W_K + b_K, v_i = m_i·W_V + b_V; score q·k_i, scaled by "
                   f"{number(st.scale, 6)} (= 1/√{d}), softmax"))
    gold = ca.gold[j] if ca.gold and j < len(ca.gold) else None
    masked = bool((st.mask != 0).any())
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    cols = [("i", "right"), ("English", "left")] + ([("gold", "left")] if gold is not None else []) + \
           [(f"k_i ({d})", "left"), ("q·k_i", "right"), (f"/√{d}", "right")] + \
           ([("mask", "right")] if masked else []) + \
           [("weight", "right"), (f"v_i ({st.values.shape[-1]})", "left")]
    for name, justify in cols:
        table.add_column(name, justify=justify, no_wrap=True)
    best = int(st.weights.argmax())
    for i in range(st.keys.shape[0]):
        cells = [str(i), ca.english[i]] + ([GOLD_MARK if i in gold else ""] if gold is not None else [])
        cells += [vector(st.keys[i], head=2, tail=1, digits=3), number(float(st.scores[i]), 3),
                  number(float(st.scaled[i]), 4)]
        cells += [number(float(st.mask[i]), 1)] if masked else []
        cells += [number(float(st.weights[i]), 4), vector(st.values[i], head=2, tail=1, digits=3)]
        table.add_row(*cells, style=HIGHLIGHT if i == best else None)
    out.print(table)
    out.print(Text(f"   sum of the weights = {float(st.weights.sum()):.6f}; most weight on "
                   f"{ca.english[best]!r}" + (f" ({'in' if best in gold else 'not in'} the gold "
                                              f"alignment)" if gold is not None else "")))
    out.print(Text(f"4) output = Σ_i w_i v_i = {vector(st.output)}"))
    out.print(Text(f"   the model's own head output (from its forward) = {vector(st.model_output)}"))
    diffs = ", ".join(f"{k} {v:.1e}" for k, v in st.diffs.items() if k != "output")
    out.print(Text(f"   max |difference| = {st.max_abs_diff:.1e}  (recomputed in float64 vs the "
                   f"forward's float32; other stages: {diffs})"))
