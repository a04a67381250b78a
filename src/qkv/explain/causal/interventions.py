"""Interventions on attention heads: ablation ([`ablate`][qkv.explain.causal.interventions.ablate])
and activation patching ([`patch`][qkv.explain.causal.interventions.patch]) — does the model *use* a
head, whatever its attention looks like?

A head's output is o^{ℓ,h} (t, d): its share of the attention block before the output projection
mixes the heads (`out_proj`'s input, columns h·d … (h+1)·d). Intervening on it:

* `mode="zero"`: o^{ℓ,h} = 0 — equal to zeroing that head's slice of the output projection's
  input (transformers: `o_proj`/`attention.output.dense`'s input columns h·d … (h+1)·d);
* `mode="mean"`: o^{ℓ,h}_i = mean_j o^{ℓ,h}_j, the head's clean output averaged over the
  text's positions (the head still says "something typical", but nothing about this token);
* patching: o^{ℓ,h} taken from another run of the same length.

Every intervention goes through the forward's own argument `interventions=`
(`Interventions`, the one mechanism value zeroing uses too);
nothing here hooks a module. Heads are `(layer, head)` pairs, counted from 0.

Examples:
    >>> import qkv
    >>> lm = qkv.load("lm")
    >>> ids = lm.tokenizer.encode("the cat sat on the mat and the cat sat").ids
    >>> clean, cut = ablate(lm, ids, heads=[]), ablate(lm, ids, heads=[(1, 0), (1, 1)])
    >>> clean.logits.shape, bool((clean.logits - cut.logits).abs().max() > 0)
    (torch.Size([11, 258]), True)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, ClassVar, Iterable, Sequence

import torch

from qkv.explain import forward
from qkv.explain.contributions.grad import is_decoder
from qkv.explain.finite import NonFiniteError
from qkv.explain.mixer_maps import check_softmax_everywhere
from qkv.explain.wording import ArgumentError
from qkv.modules.intervention import Interventions

MODES = ("zero", "mean")

Head = tuple[int, int]


# -- arguments -------------------------------------------------------------------------------------
def check_heads(model, heads) -> tuple[Head, ...]:
    """`heads` as a tuple of (layer, head) pairs; ArgumentError naming `heads` otherwise."""
    n_layers, n_heads = forward.num_layers(model), forward.num_heads(model)
    if isinstance(heads, (str, bytes, torch.Tensor)) or not isinstance(heads, Iterable):
        raise ArgumentError("heads", "{name} must be a list of (layer, head) pairs ([] for none), "
                            "got {value!r}", value=heads)
    out = []
    for pair in heads:
        ok = isinstance(pair, Sequence) and len(pair) == 2 and all(
            isinstance(x, int) and not isinstance(x, bool) for x in pair)
        if not ok:
            raise ArgumentError("heads", "{name} must be (layer, head) pairs of whole numbers, got "
                                "{value!r}", value=pair)
        layer, head = pair
        if not (0 <= layer < n_layers and 0 <= head < n_heads):
            raise ArgumentError("heads", "{name} has ({layer}, {head}), which {model} does not "
                                "have: layers 0–{last_layer}, heads 0–{last_head}", layer=layer,
                                head=head, model=forward.model_name(model),
                                last_layer=n_layers - 1, last_head=n_heads - 1)
        out.append((layer, head))
    return tuple(dict.fromkeys(out))


def check_mode(mode: str, length: int) -> None:
    """ArgumentError for an unknown `mode`, or `"mean"` over a one-token text."""
    if mode not in MODES:
        raise ArgumentError("mode", "unknown {name} {value!r}; known: {known}", value=mode,
                            known=", ".join(MODES))
    if mode == "mean" and length < 2:
        raise ArgumentError("mode", "{name} 'mean' replaces a head's output by its mean over the "
                            "text's positions; a {t}-token text has nothing to average (give a "
                            "longer text or mode='zero')", t=length)


def as_ids(model, text_or_ids, *, role: str = "text_or_ids") -> torch.Tensor:
    """(1, t) token ids from a text or ids ((t,), (1, t) or a list); ArgumentError otherwise."""
    if isinstance(text_or_ids, str):
        return torch.tensor([forward.encode(model, text_or_ids).ids], dtype=torch.long)
    if isinstance(text_or_ids, (bytes, bytearray)):
        raise ArgumentError(role, "{name} must be a text (str) or token ids, got bytes: decode "
                            "them first (data.decode('utf-8'))")
    try:
        ids = torch.as_tensor(text_or_ids)
    except (TypeError, ValueError, RuntimeError, OverflowError):
        raise ArgumentError(role, "{name} must be a text or one sequence of token ids, got "
                            "{value}", value=_shown(text_or_ids)) from None
    if ids.ndim == 1:
        ids = ids.unsqueeze(0)
    if ids.ndim != 2 or ids.shape[0] != 1 or ids.shape[1] == 0 or ids.is_floating_point() \
            or ids.is_complex() or ids.dtype == torch.bool:
        raise ArgumentError(role, "{name} must be a text or one sequence of token ids (whole "
                            "numbers), got {dtype} of shape {shape}", dtype=ids.dtype,
                            shape=tuple(ids.shape))
    return ids.long()


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# -- the forward with heads replaced ---------------------------------------------------------------
def run(model, ids: torch.Tensor, edits: Interventions | None = None):
    """The model's own forward on `ids` (b, t) with `edits`; its output."""
    return model(ids, torch.ones_like(ids), interventions=edits)


def head_outputs(model, ids: torch.Tensor) -> list[torch.Tensor]:
    """Every layer's head outputs (b, t, h, d) on `ids` (b, t), as the traced forward recorded
    them (`out_proj`'s input, split into heads)."""
    check_softmax_everywhere(model, "replacing heads' outputs")
    out = model(ids, torch.ones_like(ids), trace_rows=slice(None))
    return [tr.self_attn.attention.output.transpose(1, 2) for tr in out.traces]  # (b, t, h, d)


def output_of(model, out) -> torch.Tensor:
    """(b, t, V) logits of a decoder, (b, t, E) last hidden state of an encoder."""
    return out.logits if is_decoder(model) else out.last_hidden_state


def edits_for(heads: Sequence[Head], value_of: Callable[[int], torch.Tensor | None]) -> Interventions:
    """`heads` replaced in every copy of a batch; `value_of(layer)` gives that layer's
    replacement (b, t, h, d) or broadcastable, None for zero."""
    def value(layer: int, head: int):
        new = value_of(layer)
        return None if new is None else new[:, :, head]  # (b, t, d) or (b, 1, d)

    return Interventions(heads={(layer, head): value(layer, head) for layer, head in heads})


def mean_values(outputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each layer's head outputs averaged over positions: (b, 1, h, d) — mean ablation's value."""
    return [o.mean(dim=1, keepdim=True) for o in outputs]


# -- ablate ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Ablation:
    """The model's output with some heads removed — what
    [`ablate`][qkv.explain.causal.interventions.ablate] returns.

    Attributes:
        model: the model's name.
        tokens: the text's tokens.
        ids: (t,).
        heads: the (layer, head) pairs ablated.
        mode: `"zero"` or `"mean"`.
        logits: (t, V) a decoder's next-token logits, else None.
        hidden: (t, E) an encoder's last hidden state, else None.
    """

    model: str
    tokens: list[str]
    ids: torch.Tensor
    heads: tuple[Head, ...]
    mode: str
    logits: torch.Tensor | None = None
    hidden: torch.Tensor | None = None

    kind: ClassVar[str] = "ablation"  # what to_dict() says it is

    def to_dict(self) -> dict:
        out = {"kind": self.kind, "model": self.model, "tokens": self.tokens,
               "ids": self.ids.tolist(), "heads": [list(h) for h in self.heads], "mode": self.mode}
        if self.logits is not None:
            out["logits"] = self.logits.tolist()
        if self.hidden is not None:
            out["hidden"] = self.hidden.tolist()
        return out


def ablate(model, text_or_ids, *, heads, mode: str = "zero") -> Ablation:
    """Run `model` on a text with `heads` removed (see the module docstring for the modes).

    Args:
        text_or_ids: a text (tokenised by the model's tokenizer) or token ids (t,) / (1, t).
        heads: (layer, head) pairs; `[]` runs the model as it is.
        mode: `"zero"` or `"mean"`.

    Raises:
        ArgumentError: a head the model does not have, an unknown mode, mean over one token.
    """
    pairs = check_heads(model, heads)
    ids = as_ids(model, text_or_ids)
    check_mode(mode, ids.shape[1])
    with torch.no_grad():
        if mode == "mean" and pairs:
            means = mean_values(head_outputs(model, ids))
            edits = edits_for(pairs, lambda layer: means[layer])
        else:
            edits = edits_for(pairs, lambda layer: None)
        out = output_of(model, run(model, ids, edits))[0]
    tokens = _tokens(model, ids)
    decoder = is_decoder(model)
    return Ablation(model=forward.model_name(model), tokens=tokens, ids=ids[0], heads=pairs,
                    mode=mode, logits=out if decoder else None, hidden=None if decoder else out)


def _tokens(model, ids: torch.Tensor) -> list[str]:
    return [model.tokenizer.id_to_token(int(i)) for i in ids[0]]


# -- patch ----------------------------------------------------------------------------------------
def next_token_loss(output: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """(b,) a decoder's mean next-token cross-entropy over the text (logits (b, t, V), ids (b, t))."""
    return torch.nn.functional.cross_entropy(output[:, :-1].transpose(1, 2).double(),
                                             ids[:, 1:], reduction="none").mean(-1)


@dataclass(frozen=True)
class Patching:
    """Activation patching of head outputs — what [`patch`][qkv.explain.causal.interventions.patch]
    returns.

    A metric m is measured on the clean run, the corrupted run, and the corrupted run with the
    `heads`' outputs taken from the clean run; the recovered fraction is

        (m_patched − m_corrupted) / (m_clean − m_corrupted)

    1: those heads carry everything the corruption took away; 0: nothing.

    Attributes:
        model: the model's name.
        heads: the (layer, head) pairs patched.
        metric: what m is in words.
        clean: m on the clean run.
        corrupted: m on the corrupted run.
        patched: m on the corrupted run with the heads patched.
        recovered: the fraction (None when clean and corrupted give the same m).
    """

    model: str
    heads: tuple[Head, ...]
    metric: str
    clean: float
    corrupted: float
    patched: float
    recovered: float | None

    kind: ClassVar[str] = "patching"  # what to_dict() says it is

    def to_dict(self) -> dict:
        return {"kind": self.kind, "model": self.model, "heads": [list(h) for h in self.heads],
                "metric": self.metric, "clean": self.clean, "corrupted": self.corrupted,
                "patched": self.patched, "recovered": self.recovered}


def patch(model, clean, corrupted, *, heads, metric: Callable | None = None) -> Patching:
    """Patch `heads`' outputs from the clean run into the corrupted one (equal lengths).

    Args:
        clean, corrupted: texts or token ids of the same number of tokens.
        heads: (layer, head) pairs.
        metric: `(output (1, t, ·), ids (1, t)) -> float` on the model's output (logits or last
            hidden state) and the *clean* ids; default: a decoder's next-token loss on the clean
            text, an encoder's cosine of the last token's final vector to the clean run's.

    Raises:
        ArgumentError: texts of different lengths, a head the model does not have.
    """
    pairs = check_heads(model, heads)
    a, b = as_ids(model, clean, role="clean"), as_ids(model, corrupted, role="corrupted")
    if a.shape != b.shape:
        raise ArgumentError("corrupted", "{name} has {n} tokens and clean {m}; patching copies "
                            "head outputs position by position, so they must be equally long",
                            n=b.shape[1], m=a.shape[1])
    if metric is None and is_decoder(model) and a.shape[1] < 2:
        raise ArgumentError("clean", "{name} has 1 token: the default metric, the next-token "
                            "loss, has no next token to score in it (nothing to measure); give "
                            "texts of at least 2 tokens, or a metric")
    with torch.no_grad():
        clean_heads = head_outputs(model, a)
        y_clean = output_of(model, run(model, a))
        if metric is None:
            metric, what = _default_metric(model, y_clean)
        else:
            # the caller's callable, not a model: a lambda or a function has a name, a partial none
            what = getattr(metric, "__name__", "the given metric")
        y_corrupt = output_of(model, run(model, b))
        edits = edits_for(pairs, lambda layer: clean_heads[layer])
        y_patched = output_of(model, run(model, b, edits))
    m_clean, m_corrupt, m_patch = (float(metric(y, a)) for y in (y_clean, y_corrupt, y_patched))
    for run_name, m in (("clean", m_clean), ("corrupted", m_corrupt), ("patched", m_patch)):
        if not math.isfinite(m):
            raise NonFiniteError(f"{what} is {m} on the {run_name} run of {forward.model_name(model)}: "
                                 f"no fraction recovered can be read from it")
    gap = m_clean - m_corrupt
    return Patching(model=forward.model_name(model), heads=pairs, metric=what, clean=m_clean,
                    corrupted=m_corrupt, patched=m_patch,
                    recovered=(m_patch - m_corrupt) / gap if gap != 0 else None)


def _default_metric(model, y_clean: torch.Tensor):
    if is_decoder(model):
        return (lambda y, ids: next_token_loss(y, ids)[0]), "next-token loss on the clean text"
    ref = y_clean[0, -1]
    return ((lambda y, ids: torch.cosine_similarity(y[0, -1].double(), ref.double(), dim=0)),
            "cosine of the last token's final vector to the clean run's")
