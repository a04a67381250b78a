"""A test-sized token mixer written by following docs/architecture.md's mixer recipe: a causal
exponential moving average per head,

    o_t = a·o_{t−1} + (1 − a)·v_t,  o_{−1} = 0      ⇒  o = M·v,  M[t, j] = (1 − a)·a^{t−j} (j ≤ t)

with a = sigmoid(`ema_logit`) one decay per head and v = x·W_V. `EMAMixer` is the "transformers"
layer (its forward calls the module-level kernel `ema_scan` by name, as transformers' linear layers
call theirs); `read` is its explanation; `recognises` how the adapter tells it (by the state it
holds). Nothing registers on import: `test_mixer_recipe.py` registers the kind, the recogniser
and `MIXER`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from qkv.errors import QkvError
from qkv.explain.mixers import Mixer
from qkv.explain.mixers.capture import kernel_call
from qkv.explain.mixers.linear import EffectiveAttention

KIND = "ema"
KERNEL = "ema_scan"


def ema_scan(values: torch.Tensor, decay: torch.Tensor) -> torch.Tensor:
    """(b, t, h, d) values, (h,) decays → (b, t, h, d) their running averages, oldest first."""
    a = decay[:, None]  # (h, 1)
    out, state = [], torch.zeros_like(values[:, 0])  # (b, h, d)
    for t in range(values.shape[1]):
        state = a * state + (1 - a) * values[:, t]
        out.append(state)
    return torch.stack(out, dim=1)


class EMAMixer(nn.Module):
    """A layer's token mixer in transformers' calling convention: `(out, None)` from `hidden_states`."""

    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.v_proj = nn.Linear(hidden, hidden, bias=False)
        self.o_proj = nn.Linear(hidden, hidden, bias=False)
        self.ema_logit = nn.Parameter(torch.linspace(-1.0, 2.0, heads))  # a from 0.27 to 0.88

    def forward(self, hidden_states: torch.Tensor, **kwargs) -> tuple[torch.Tensor, None]:
        b, t, E = hidden_states.shape
        v = self.v_proj(hidden_states).view(b, t, self.heads, self.head_dim)  # (b, t, h, d)
        o = ema_scan(v, torch.sigmoid(self.ema_logit))  # (b, t, h, d)
        return self.o_proj(o.reshape(b, t, E)), None


def recognises(module: nn.Module) -> bool:
    """An EMA mixer holds its decays as `ema_logit` (its layer holds them only through it)."""
    return "ema_logit" in dict(module.named_parameters(recurse=False))


@dataclass(frozen=True)
class EMA(EffectiveAttention):
    """One text through an EMA mixer, in float64 (letters: t tokens, h heads, d channels)."""

    kind = KIND
    v: torch.Tensor       # (t, h, d) the values the kernel averaged
    decay: torch.Tensor   # (h,) a
    output: torch.Tensor  # (t, h, d) the kernel's own output, before o_proj

    @property
    def heads(self) -> int:
        return self.v.shape[1]

    def values(self, head: int) -> torch.Tensor:
        return self.v[:, head]

    def matrix(self, head: int) -> torch.Tensor:
        """(t, t) M[t, j] = (1 − a)·a^{t−j} below the diagonal and on it, 0 above."""
        t, a = self.v.shape[0], self.decay[head]
        lag = torch.arange(t)[:, None] - torch.arange(t)[None, :]  # (t, t) t − j
        return torch.where(lag >= 0, (1 - a) * a ** lag.clamp(min=0), torch.zeros((), dtype=a.dtype))

    def row(self, head: int, query: int) -> torch.Tensor:
        """(t,) row `query`: O(t)."""
        t = self.v.shape[0]
        if not 0 <= query < t:
            raise QkvError(f"query {query} is out of range for a text of {t} tokens")
        a = self.decay[head]
        lag = query - torch.arange(t)
        return torch.where(lag >= 0, (1 - a) * a ** lag.clamp(min=0), torch.zeros((), dtype=a.dtype))


def read(module: EMAMixer, hidden_states: torch.Tensor) -> EMA:
    """Run the layer once on (1, t, hidden) `hidden_states` and keep what it handed its kernel."""
    if hidden_states.shape[0] != 1:
        raise QkvError(f"one text at a time: the batch holds {hidden_states.shape[0]}")
    call = kernel_call(module, KERNEL, hidden_states)
    return EMA(v=call.arguments["values"][0].detach().double(), decay=call.arguments["decay"].detach().double(),
               output=call.result[0].detach().double())


MIXER = Mixer(KIND, read, True, "an exponential moving average per head: M[t, j] = (1 − a)·a^(t−j)")
