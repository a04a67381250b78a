"""The position-wise feed-forward block: two linear maps with a non-linearity between."""

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
    """``fc2(dropout(act(fc1(x))))`` applied to every position alike.

    Example:
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
