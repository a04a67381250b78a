"""The position-wise feed-forward blocks: plain (two linear maps, a non-linearity between) and
gated (GLU family: SwiGLU in Llama/Mistral/Qwen, GeGLU)."""

from __future__ import annotations

import torch
from torch import nn

ACTIVATIONS = {
    "relu": nn.ReLU,
    "gelu": nn.GELU,  # exact erf GELU (BERT)
    "gelu_tanh": lambda: nn.GELU(approximate="tanh"),  # GPT-2's "gelu_new"
    "silu": nn.SiLU,
}


class FeedForward(nn.Module):
    """`fc2(dropout(act(fc1(x))))` applied to every position alike.

    Examples:
        >>> FeedForward(8, 32, activation="gelu")(torch.randn(2, 5, 8)).shape   # (b, t, E)
        torch.Size([2, 5, 8])
    """

    def __init__(self, dim: int, hidden_dim: int, *, activation: str = "gelu", dropout: float = 0.0,
                 bias: bool = True):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; choose from {sorted(ACTIVATIONS)}")
        self.fc1 = nn.Linear(dim, hidden_dim, bias=bias)
        self.act = ACTIVATIONS[activation]()
        self.dropout = nn.Dropout(dropout)
        self.fc2 = nn.Linear(hidden_dim, dim, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.dropout(self.act(self.fc1(x))))


class GatedFeedForward(nn.Module):
    """`down(dropout(act(gate(x)) ⊙ up(x)))` — Shazeer (2020), "GLU Variants Improve Transformer".

    With `activation="silu"` this is SwiGLU, the feed-forward of Llama, Mistral and Qwen
    (Hugging Face names: `gate_proj`, `up_proj`, `down_proj`).

    Examples:
        >>> GatedFeedForward(8, 32, activation="silu")(torch.randn(2, 5, 8)).shape   # (b, t, E)
        torch.Size([2, 5, 8])
    """

    def __init__(self, dim: int, hidden_dim: int, *, activation: str = "silu", dropout: float = 0.0,
                 bias: bool = False):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; choose from {sorted(ACTIVATIONS)}")
        self.gate = nn.Linear(dim, hidden_dim, bias=bias)
        self.up = nn.Linear(dim, hidden_dim, bias=bias)
        self.act = ACTIVATIONS[activation]()
        self.dropout = nn.Dropout(dropout)
        self.down = nn.Linear(hidden_dim, dim, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.dropout(self.act(self.gate(x)) * self.up(x)))
