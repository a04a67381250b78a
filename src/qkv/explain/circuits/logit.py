"""What a head writes: a next-token logit as the sum of every component's direct contribution.

At position i the model's logit for token w is `norm_f(x_i) · W_U[w] + b_U[w]` with x_i the
last layer's output. Split x_i by component (`residual`) and freeze the final norm at the
scale this forward computed (`norms`):

```text
logit_w = Σ_c norm_f(x_{i,c}) · W_U[w]  (+ β·W_U[w] + b_U[w] in ``bias``)
```

Each head's part norm_f(o^{l,h}_i W_O^h) · W_Uᵀ over the whole vocabulary says which tokens its
output promotes on this input (its OV circuit here). Models with next-token logits only.

Examples:
    >>> import qkv
    >>> lm = qkv.load("lm")
    >>> a = logit_attribution(lm, "baka bela dima fona baka bela dima", token=7, target="fona")
    >>> abs(float(a.contributions.sum()) - a.logit) <= a.bound
    True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from qkv.errors import QkvError
from qkv.explain.circuits.norms import linearise, rebuilds
from qkv.explain.circuits.residual import stream
from qkv.explain.contributions.base import run
from qkv.explain.forward import check_model as check_protocol
from qkv.explain.forward import encode, model_name
from qkv.explain.jsonable import numbers
from qkv.explain.select import choose_in
from qkv.explain.wording import ArgumentError
from qkv.models.protocol import Unembedding

#: How many tokens each head's promoted list holds.
PROMOTED = 5


def check_decoder(model) -> None:
    """QkvError naming a model without next-token logits."""
    check_protocol(model)
    if not model.capabilities.next_token:
        raise QkvError(f"{model_name(model)} has no next-token logits; logit attribution reads "
                       f"a language model's")


def unembedding(model, last: torch.Tensor, logits: torch.Tensor) -> Unembedding:
    """The model's read-out (`model.parts.unembedding`: final norm, output matrix, scale),
    checked: it turns `last` (n, E), the last layer's output, into the forward's `logits`
    (n, V). QkvError naming the model where it has none, it does not, or it soft-caps (a
    soft-capped logit is no sum of parts)."""
    check_decoder(model)
    u = model.parts.unembedding
    if u is None:
        raise QkvError(f"{model_name(model)}: no final norm and output matrix turn the last "
                       f"layer's output into its logits (model.parts.unembedding is None)")
    if u.softcap is not None:
        raise QkvError(f"{model_name(model)} soft-caps its logits (c·tanh(z/c), c = {u.softcap:g}); "
                       f"a capped logit is not a sum of components")
    with torch.no_grad():
        h = u.norm(last) if u.norm is not None else last
        got = nn.functional.linear(h.double(), u.weight.double(),
                                   None if u.bias is None else u.bias.double()) * u.scale
    if not rebuilds(got, logits):
        raise QkvError(f"{model_name(model)}: its final norm and output matrix do not turn the "
                       f"last layer's output into its logits")
    return u


@dataclass(frozen=True)
class LogitAttribution:
    """One logit split by component.

    Attributes:
        token_index: the position read.
        target: the token whose logit it is.
        target_id: see `target`.
        components: the C names; contributions (C,) float64, summing to `logit`.
        logit: the model's own logit.
        bound: how far the sum may be from it (the forward's
            rounding of the final norm's output, measured against the parts' sum, times |W_U|,
            plus the read-out's own dot product of E terms, γ_E Σ|h||w|).
        promoted: per head name, the tokens its output promotes most at this position and by
            how much (logit units): [(token, value), …].
    """

    kind: ClassVar[str] = "logit-attribution"  # its row in qkv.explain.kinds.KINDS

    model: str
    text: str
    tokens: list[str]
    token_index: int
    target: str
    target_id: int
    components: tuple[str, ...]
    contributions: torch.Tensor
    logit: float
    bound: float
    promoted: dict[str, list[tuple[str, float]]]

    def to_dict(self) -> dict:
        return {"kind": self.kind, "model": self.model, "text": self.text, "tokens": self.tokens,
                "token_index": self.token_index, "token": self.tokens[self.token_index],
                "target": self.target, "target_id": self.target_id,
                "components": list(self.components), "contributions": numbers(self.contributions),
                "contributions_sum": float(self.contributions.sum()), "logit": self.logit,
                "bound": self.bound,
                "promoted": {k: [[t, v] for t, v in vs] for k, vs in self.promoted.items()}}


def _target(model, target, logits: torch.Tensor) -> int:
    if target is None:
        return int(logits.argmax())
    if isinstance(target, int) and not isinstance(target, bool):
        if not 0 <= target < logits.shape[-1]:
            raise ArgumentError("target", "{name} id {value} is out of range (0–{last})",
                                value=target, last=logits.shape[-1] - 1)
        return target
    if isinstance(target, str):
        for spelled in (target, "Ġ" + target, "▁" + target, " " + target):
            found = model.tokenizer.token_to_id(spelled)
            if found is not None:
                return found
        ids = model.tokenizer.encode(target).ids
        if len(ids) == 1:
            return ids[0]
    raise ArgumentError("target", "{name} must be one token of the vocabulary (a string) or its "
                        "id, got {value!r}", value=target)


@torch.no_grad()
def logit_attribution(model, text: str, *, token=None, target=None) -> LogitAttribution:
    """The logit of `target` at `token` (an index, a word or `"word@N"`; None: the last)
    split into every component's direct contribution (see the module doc).

    `target`: a token of the vocabulary or its id; None: the model's own top prediction.
    """
    check_decoder(model)
    encoding = encode(model, text)
    units, choice = choose_in(token, encoding, text, words=False, role="token")
    i = units.groups[choice.unit][-1]
    ids = torch.tensor([encoding.ids], dtype=torch.long)
    fwd = run(model, ids, torch.tensor([i]))
    logits = fwd.output.logits[0]  # (t, V)
    last = fwd.hidden_states[-1][0]  # (t, E)
    u = unembedding(model, last[i:i + 1], logits[i:i + 1])
    w_id = _target(model, target, logits[i])
    st = stream(model, fwd, len(model.layers), torch.tensor([i]))
    parts = st.parts[:, 0]  # (C, E)
    lin = None
    if u.norm is not None:
        lin = linearise(u.norm, last[i:i + 1])
        parts = lin.apply(parts)
        parts[-1] += lin.shift
    W = u.weight.double()  # (V, E)
    w = W[w_id]  # (E,)
    contributions = parts @ w  # (C,)
    if u.bias is not None:
        contributions[-1] += float(u.bias[w_id])
    contributions = contributions * u.scale  # Granite's 1/logits_scaling: every part alike
    dtype = last.dtype
    E = last.shape[-1]
    eps = torch.finfo(dtype).eps / 2
    h = parts.sum(0)  # (E,)
    normed = u.norm(last[i:i + 1])[0] if u.norm is not None else last[i]  # the forward's own
    dh = (normed.double() - h).abs()  # its rounding, measured (checked to be rounding)
    if not rebuilds(h, normed):
        raise QkvError(f"{model_name(model)}: the components of the final norm's output are not "
                       f"the forward's (max diff {float(dh.max()):.3g})")
    absolute = (h.abs() * w.abs()).sum()
    bound = abs(u.scale) * float((dh * w.abs()).sum() + E * eps / (1 - E * eps) * absolute
                                 + 64 * torch.finfo(torch.float64).eps * absolute)
    promoted = {}
    vocab = model.tokenizer
    for name, part in zip(st.names, parts):
        if name.startswith("L") and ".H" in name:
            values, top = (part @ W.T).topk(min(PROMOTED, W.shape[0]))
            promoted[name] = [(vocab.id_to_token(int(t)) or str(int(t)), float(v))
                              for t, v in zip(top, values)]
    return LogitAttribution(model=model_name(model), text=text, tokens=list(encoding.tokens),
                            token_index=i, target=vocab.id_to_token(w_id) or str(w_id),
                            target_id=w_id, components=st.names, contributions=contributions,
                            logit=float(logits[i, w_id]), bound=bound, promoted=promoted)


__all__ = ["LogitAttribution", "Unembedding", "logit_attribution", "unembedding"]
