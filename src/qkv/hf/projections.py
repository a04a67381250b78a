"""A transformers attention module's query, key and value projections as matrices — one table.

What `explain_head` multiplies x by (`x · W_Q + b_Q`, then the norm, then the position step)
is read here, the same way for every architecture: `LAYOUTS` lists how attention modules
hold their projections, by the names of their children:

```text
q_proj, k_proj, v_proj          three Linear maps         Llama, Mistral, Qwen, Gemma, OLMo, Phi …
query, key, value               three Linear maps         BERT, RoBERTa, ELECTRA
q_lin, k_lin, v_lin             three Linear maps         DistilBERT
c_attn                          [q | k | v], Conv1D       GPT-2 (weight stored (in, out))
qkv_proj, Wqkv                  [q | k | v]               Phi-3, ModernBERT, MPT
query_key_value                 per head [q_h | k_h | v_h] GPT-NeoX
q, k, v                         three Linear maps         T5 (self- and cross-attention)
```

and the per-head norms (`NORMS`: Qwen3 per head, OLMo 2 over the whole projection —
`qkv.modules.multihead.head_norm` tells them apart by their width —, Persimmon's LayerNorms,
HunYuan's after the rotation: the order is the one that rebuilds the forward). The
position step is the model's own: the `(cos, sin)` transformers hands the attention module as
`position_embeddings`, applied to the first features of each head (`Rotation`; GPT-NeoX
and Phi rotate part of each head) in the layout the forward shows (`STYLES`). ALiBi and learned
absolute positions need no step: they are in x or in the score bias.

No entry is trusted by its name: `read` rebuilds q, k and v from the module's input with
the layout, the norms and the position step, and keeps it only where they equal the q, k and v
the attention kernel received in the same forward (else the reason, by name).

Examples:
    >>> import torch
    >>> from torch import nn
    >>> m = nn.Module(); m.c_attn = nn.Linear(8, 24)          # any module holding c_attn
    >>> [layout.name for layout in LAYOUTS if layout.fits(m)]
    ['c_attn']
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from qkv.modules.multihead import head_norm
from qkv.modules.positional import RotaryEmbedding
from qkv.rounding import close  # the tolerance, shared with the norms' reading


@dataclass(frozen=True)
class Projection:
    """An `nn.Linear`-like view of a linear map: `weight` (out, in), `bias` (out,) or None;
    `y = x · weightᵀ + bias`."""

    weight: torch.Tensor
    bias: torch.Tensor | None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, self.weight.to(x.dtype),
                                    None if self.bias is None else self.bias.to(x.dtype))

    def rows(self, index) -> "Projection":
        """The output features `index` (a slice or an index tensor)."""
        return Projection(self.weight[index], None if self.bias is None else self.bias[index])


def as_projection(m: nn.Module) -> Projection | None:
    """`m` as a `Projection` if it is an `nn.Linear` or GPT-2's `Conv1D` (weight
    stored (in, out): transposed here), else None."""
    from transformers.pytorch_utils import Conv1D  # qkv.hf runs with transformers loaded

    if isinstance(m, nn.Linear):
        return Projection(m.weight, m.bias)
    if isinstance(m, Conv1D):
        return Projection(m.weight.T, m.bias)
    return None


@dataclass(frozen=True)
class Sizes:
    """heads h, kv_heads h_kv, head_dim d, value_dim dv of one attention call."""

    heads: int
    kv_heads: int
    head_dim: int
    value_dim: int


def _separate(module: nn.Module, names: tuple[str, ...], sz: Sizes):
    return tuple(as_projection(getattr(module, n)) for n in names)


def _stacked(module: nn.Module, names: tuple[str, ...], sz: Sizes):
    """[q | k | v] along the output features: (h·d + h_kv·d + h_kv·dv, E)."""
    whole = as_projection(getattr(module, names[0]))
    if whole is None:
        return None, None, None
    q, k = sz.heads * sz.head_dim, sz.kv_heads * sz.head_dim
    return whole.rows(slice(0, q)), whole.rows(slice(q, q + k)), whole.rows(slice(q + k, None))


def _per_head(module: nn.Module, names: tuple[str, ...], sz: Sizes):
    """[q_h | k_h | v_h] for each head h in turn (GPT-NeoX's `view(b, t, h, 3·d)`)."""
    whole = as_projection(getattr(module, names[0]))
    if whole is None or sz.heads != sz.kv_heads or sz.head_dim != sz.value_dim:
        return None, None, None
    d, h = sz.head_dim, sz.heads
    feature = torch.arange(3 * h * d, device=whole.weight.device).view(h, 3, d)  # (h, q|k|v, d)
    return tuple(whole.rows(feature[:, part].reshape(-1)) for part in range(3))


@dataclass(frozen=True)
class Layout:
    """One way an attention module holds its projections: its children's names and a reader
    `(module, names, sizes) → (W_Q, W_K, W_V)` as `Projection`s (None: not linear)."""

    name: str
    names: tuple[str, ...]
    read: Callable

    def fits(self, module: nn.Module) -> bool:
        return all(isinstance(getattr(module, n, None), nn.Module) for n in self.names)


LAYOUTS = (
    Layout("q_proj, k_proj, v_proj", ("q_proj", "k_proj", "v_proj"), _separate),
    Layout("query, key, value", ("query", "key", "value"), _separate),
    Layout("q_lin, k_lin, v_lin", ("q_lin", "k_lin", "v_lin"), _separate),
    Layout("c_attn", ("c_attn",), _stacked),
    Layout("qkv_proj", ("qkv_proj",), _stacked),
    Layout("Wqkv", ("Wqkv",), _stacked),
    Layout("query_key_value", ("query_key_value",), _per_head),
    Layout("q, k, v", ("q", "k", "v"), _separate),
)

#: The per-head (or whole-projection) q/k norms, before or after the position step (the order
#: is read off the forward, not off the name: `Parts.norm_after_rotation`).
NORMS = (("q_norm", "k_norm"),  # Qwen3 (per head), OLMo 2 (the whole projection)
         ("q_layernorm", "k_layernorm"),  # Persimmon: a LayerNorm per head
         ("query_layernorm", "key_layernorm"))  # HunYuan: per head, after the rotation


#: How a model lays its RoPE angles over a head's features (the position step's styles, tried in
#: this order against the forward): ``"half"`` — feature i turns with i + r/2, cos given for the
#: r features (Llama, GPT-NeoX, Phi: rotate_half); ``"halves"`` — the same pairing, cos given once
#: per pair (gpt-oss: r/2 angles); ``"pairs"`` — features 2i and 2i + 1 turn together (Cohere).
STYLES = ("half", "halves", "pairs")
#: The style of a rotation by the architecture's own function (its modelling file's
#: ``apply_rotary_pos_emb(q, k, cos, sin)``): whatever layout it has (interleaved, partial …).
OWN = "own"


def own_rotation(module: nn.Module) -> Callable | None:
    """The rotary function of the file that defines `module`'s class — transformers' modelling
    files each define `apply_rotary_pos_emb(q, k, cos, sin)` and call it on the projected q, k
    with the angles the module is handed — or None where the file has none."""
    import sys

    found = vars(sys.modules.get(type(module).__module__, object)).get("apply_rotary_pos_emb")
    return found if callable(found) else None


@dataclass(frozen=True)
class Rotation:
    """The position step transformers handed an attention call: `(cos, sin)` (b, s, ·) for
    every position, turning the first r features of each head (the others pass as they are) in
    one of the `STYLES`. A `MultiHeadTrace`'s
    `position_step`."""

    cos: torch.Tensor
    sin: torch.Tensor
    style: str = "half"
    apply: Callable | None = None  # style OWN: the architecture's apply_rotary_pos_emb

    def __call__(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """One head's x (n, d) at positions (n,) of the first sequence → rotated (n, d)."""
        cos, sin = self._tables()
        index = positions.to(cos.device)
        if self.style == OWN:  # as the module calls it: (1, 1, n, d) with angles (1, n, ·)
            x4 = x[None, None]
            return self.apply(x4, x4, cos[:1, index], sin[:1, index])[0][0, 0]
        return self._rotate(x, cos[0, index], sin[0, index])  # cos (n, ·)

    def heads(self, x: torch.Tensor) -> torch.Tensor:
        """x (b, h, t, d) at positions 0 … t − 1 → rotated, as the forward rotated them."""
        cos, sin = self._tables()
        t = x.shape[-2]
        if self.style == OWN:
            return self.apply(x, x, cos[:, :t], sin[:, :t])[0]
        return self._rotate(x, cos[:, None, :t], sin[:, None, :t])

    def _tables(self) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin as (b, s, ·) whether they came as (s, ·), (b, s, ·) or (b, 1, s, ·)."""
        return tuple(c.reshape(-1, *c.shape[-2:]) for c in (self.cos, self.sin))

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # in the wider of x's and the angles' dtypes, then x's (OLMo 2 keeps float32 angles for a
        # bfloat16 model and rounds the rotated q once)
        cos, sin = cos.to(x.device), sin.to(x.device)
        if self.style == "halves":  # one angle per pair (i, i + r/2): the rotate-half layout
            cos, sin = torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)
        r = cos.shape[-1]
        part = x[..., :r]
        if self.style == "pairs":  # (x_2i, x_2i+1) → (x_2i cos − x_2i+1 sin, x_2i+1 cos + x_2i sin)
            turned = torch.stack([-part[..., 1::2], part[..., ::2]], dim=-1).flatten(-2)
            turned = part * cos + turned * sin
        else:
            turned = RotaryEmbedding.rotate(part, cos, sin)
        return torch.cat([turned.to(x.dtype), x[..., r:]], dim=-1)


@dataclass(frozen=True)
class Parts:
    """What `read` found for one attention module: its layout's name, the three
    projections (full width: every head), the q/k norms (or None) and the style in which the
    forward's position step rotates q and k (`STYLES`; None: NoPE layers, or models whose
    positions are in x or in a score bias); `q_scale`: the constant a module multiplies its
    queries by before the kernel (OPT: 1/√d, the kernel then told 1), already in `q_proj`;
    `norm_after_rotation`: the order of the two steps — the q/k norms then the position step
    (False: Qwen3, OLMo 2, Persimmon) or the rotation then the norms (True: HunYuan)."""

    layout: str
    q_proj: Projection
    k_proj: Projection
    v_proj: Projection
    q_norm: nn.Module | None
    k_norm: nn.Module | None
    rotation: str | None
    q_scale: float = 1.0
    rotate: Callable | None = None  # rotation OWN: the architecture's own function
    norm_after_rotation: bool = False


def _heads(y: torch.Tensor, n: int) -> torch.Tensor:
    """(b, t, n·d) → (b, n, t, d)."""
    return y.unflatten(-1, (n, -1)).transpose(1, 2)


def read(module: nn.Module, sizes: Sizes, x: torch.Tensor,
         cos_sin: tuple[torch.Tensor, torch.Tensor] | None, query: torch.Tensor, key: torch.Tensor,
         value: torch.Tensor, *, memory: torch.Tensor | None = None) -> Parts | str:
    """The module's `Parts`, checked against one forward, or why none (in words).

    Args:
        x: (b, t, E) what the module received (its `hidden_states`).
        memory: (b, s, E) what a cross-attention projects its keys and values from (the
            encoder's output, its `key_value_states`); None: x itself (self-attention).
        cos_sin: the `position_embeddings` it received, or None.
        query, key, value: (b, h, t, d), (b, h_kv, s, d), (b, h_kv, s, dv) as the kernel read them.
    """
    kv_input = x if memory is None else memory  # (b, s, E)
    fits = [layout for layout in LAYOUTS if layout.fits(module)]
    if not fits:
        return (f"{type(module).__name__} holds none of the projection layouts qkv reads "
                f"({'; '.join(layout.name for layout in LAYOUTS)})")
    q_norm, k_norm = _qk_norms(module)
    orders = (False, True) if q_norm is not None else (False,)  # norm_after_rotation
    own = own_rotation(module)
    tried = (*STYLES, *((OWN,) if own is not None else ()), None) if cos_sin is not None else (None,)
    with torch.no_grad():
        for layout, (wq, wk, wv), q, k in _projected(module, fits, sizes, x, kv_input, value):
            for after, style in ((after, style) for after in orders for style in tried):
                turn = None if style is None else Rotation(*cos_sin, style, own if style == OWN else None)
                try:
                    rq, rk = _transformed(q, k, q_norm, k_norm, turn, after, sizes)
                except (RuntimeError, TypeError, ValueError):  # the angles do not fit this style
                    continue
                if not close(rk, key):
                    continue
                found = dict(rotation=style, rotate=turn.apply if turn is not None else None,
                             norm_after_rotation=after)
                if close(rq, query):
                    return Parts(layout.name, wq, wk, wv, q_norm, k_norm, **found)
                # OPT multiplies q by the scale itself and calls the kernel with 1: still a linear
                # map, W_Q and b_Q times that constant (found by least squares, then checked)
                if rq.shape != query.shape:  # q_proj makes more than q (Qwen3-Next's gate)
                    continue
                c = float((rq * query).sum() / (rq * rq).sum().clamp_min(torch.finfo(rq.dtype).tiny))
                if q_norm is None and close(rq * c, query):
                    scaled = Projection(wq.weight * c, None if wq.bias is None else wq.bias * c)
                    return Parts(layout.name, scaled, wk, wv, q_norm, k_norm, q_scale=c, **found)
    return (f"{type(module).__name__}'s {' / '.join(layout.name for layout in fits)} with "
            f"{'its q/k norms (before or after the rotation), ' if q_norm is not None else ''}"
            f"{'the angles it is handed (as RoPE in any of ' + ', '.join(STYLES) + ' layouts, or none)' if cos_sin is not None else 'no position step'}"
            f" do not give the q, k and v its attention kernel read")


def _transformed(q: torch.Tensor, k: torch.Tensor, q_norm: nn.Module | None, k_norm: nn.Module | None,
                 turn: Rotation | None, after: bool, sizes: Sizes) -> tuple[torch.Tensor, torch.Tensor]:
    """q (b, t, h·d), k (b, s, h_kv·d) as projected → (b, h, t, d), (b, h_kv, s, d): normalised
    (`head_norm`: per head or over the whole projection) and rotated by `turn`, the norms first
    or (`after`) last."""
    d = sizes.head_dim

    def normed(y: torch.Tensor, norm: nn.Module | None, n: int) -> torch.Tensor:  # (b, n, t, d)
        flat = y.transpose(1, 2).flatten(-2)  # (b, t, n·d)
        return y if norm is None else _heads(head_norm(norm, flat, d), n)

    q, k = _heads(q, sizes.heads), _heads(k, sizes.kv_heads)  # (b, h, t, d), (b, h_kv, s, d)
    if not after:
        q, k = normed(q, q_norm, sizes.heads), normed(k, k_norm, sizes.kv_heads)
    if turn is not None:
        q, k = turn.heads(q), turn.heads(k)
    if after:
        q, k = normed(q, q_norm, sizes.heads), normed(k, k_norm, sizes.kv_heads)
    return q, k


def _qk_norms(module: nn.Module) -> tuple[nn.Module | None, nn.Module | None]:
    """The module's (q norm, k norm), by `NORMS`' names, or (None, None)."""
    for names in NORMS:
        norms = tuple(getattr(module, n, None) for n in names)
        if all(isinstance(n, nn.Module) for n in norms):
            return norms
    return None, None


def _projected(module, fits, sizes, x, kv_input, value):
    """Each layout of `fits` that rebuilds the kernel's `value` (b, h_kv, s, dv): (layout, its
    (W_Q, W_K, W_V), q = x·W_Q (b, t, h·d), k = memory·W_K (b, s, h_kv·d)), in `fits`' order."""
    for layout in fits:
        wq, wk, wv = layout.read(module, layout.names, sizes)
        if wq is None or wk is None or wv is None:
            continue
        try:
            q, k, v = wq(x), wk(kv_input), wv(kv_input)  # (b, t, ·), (b, s, ·), (b, s, ·)
        except RuntimeError:  # not of this width
            continue
        if not close(_heads(v, sizes.kv_heads), value):
            continue
        if q.shape[-1] == 2 * sizes.heads * sizes.head_dim:  # each head's d query rows, then d gate rows
            d = sizes.head_dim
            wq = wq.rows((torch.arange(sizes.heads)[:, None] * 2 * d + torch.arange(d)).flatten())
            q = wq(x)  # (b, t, h·d): Qwen3-Next / 3.5, the gate read by explain/mixers/gate.py
        yield layout, (wq, wk, wv), q, k


__all__ = ["LAYOUTS", "Layout", "NORMS", "OWN", "Parts", "Projection", "Rotation", "STYLES", "Sizes",
           "as_projection", "own_rotation", "read"]
