"""Positional information: sinusoidal, learned, rotary (RoPE) and ALiBi.

Sinusoidal and learned encodings are *added* to the token embeddings (``x + pe``); rotary
embeddings *rotate* queries and keys inside attention; ALiBi adds a distance penalty to the
scores. All take an ``offset``: the position of the first token (non-zero when decoding with a
KV cache).
"""

from __future__ import annotations

import math

import torch
from torch import nn


def _check_span(offset: int, t: int, max_len: int, what: str) -> None:
    if offset < 0 or offset + t > max_len:
        raise ValueError(
            f"{what}: positions {offset}..{offset + t - 1} exceed the {max_len} positions it has"
        )


class SinusoidalPositionalEncoding(nn.Module):
    """Vaswani et al. (2017), §3.5: PE(p, 2i) = sin(p / 10000^(2i/d)), PE(p, 2i+1) = cos(…).

    Example:
        >>> pe = SinusoidalPositionalEncoding(8, max_len=16)
        >>> pe(torch.zeros(2, 5, 8)).shape          # (b, t, d) in, (b, t, d) out
        torch.Size([2, 5, 8])
    """

    def __init__(self, dim: int, max_len: int = 4096, base: float = 10000.0):
        super().__init__()
        if dim <= 0 or max_len <= 0:
            raise ValueError(f"dim ({dim}) and max_len ({max_len}) must be positive")
        self.max_len = max_len
        pos = torch.arange(max_len, dtype=torch.float64).unsqueeze(1)  # (max_len, 1)
        freq = torch.exp(-math.log(base) * torch.arange(0, dim, 2, dtype=torch.float64) / dim)
        pe = torch.zeros(max_len, dim, dtype=torch.float64)
        pe[:, 0::2] = torch.sin(pos * freq)
        pe[:, 1::2] = torch.cos(pos * freq[: dim // 2])
        # Not a parameter and not saved: it is a function of (dim, max_len), rebuilt on load.
        self.register_buffer("pe", pe.float(), persistent=False)  # (max_len, d)

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """x: (b, t, d) → x + PE[offset : offset + t]."""
        _check_span(offset, x.shape[-2], self.max_len, "SinusoidalPositionalEncoding")
        return x + self.pe[offset : offset + x.shape[-2]].to(x.dtype)


class LearnedPositionalEmbedding(nn.Module):
    """A trained table of position vectors (BERT, GPT-2), added to the token embeddings.

    Example:
        >>> LearnedPositionalEmbedding(512, 8)(torch.zeros(1, 3, 8), offset=2).shape
        torch.Size([1, 3, 8])
    """

    def __init__(self, max_len: int, dim: int):
        super().__init__()
        self.max_len = max_len
        self.weight = nn.Parameter(torch.empty(max_len, dim).normal_(std=0.02))  # (max_len, d)

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """x: (b, t, d) → x + weight[offset : offset + t]."""
        _check_span(offset, x.shape[-2], self.max_len, "LearnedPositionalEmbedding")
        return x + self.weight[offset : offset + x.shape[-2]]


class RotaryEmbedding(nn.Module):
    """RoPE (Su et al., 2021): rotate pairs of query/key features by a position-dependent angle.

    Uses the "rotate half" pairing (feature i with feature i + d/2), as GPT-NeoX and Llama do.
    Scores then depend on positions only through their difference.

    Example:
        >>> rope = RotaryEmbedding(8)
        >>> rope(torch.randn(1, 2, 5, 8), offset=3).shape   # (b, h, t, d)
        torch.Size([1, 2, 5, 8])
    """

    def __init__(self, head_dim: int, base: float = 10000.0):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"RotaryEmbedding needs an even head_dim, got {head_dim}")
        inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)  # (d/2,)

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """x: (..., t, d) at positions offset … offset + t − 1 → rotated x, same shape."""
        t = x.shape[-2]
        pos = torch.arange(offset, offset + t, device=x.device, dtype=torch.float32)
        angles = torch.outer(pos, self.inv_freq)  # (t, d/2)
        cos = torch.cat([angles.cos(), angles.cos()], dim=-1).to(x.dtype)  # (t, d)
        sin = torch.cat([angles.sin(), angles.sin()], dim=-1).to(x.dtype)  # (t, d)
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class ALiBi(nn.Module):
    """Press et al. (2022): add −m_h · |p_i − j| to the scores; m_h a geometric slope per head.

    Example:
        >>> ALiBi(4).bias(2, 3).shape      # (h, t, s), bottom-right aligned
        torch.Size([4, 2, 3])
    """

    def __init__(self, num_heads: int):
        super().__init__()
        self.register_buffer("slopes", self.slopes_for(num_heads), persistent=False)  # (h,)

    @staticmethod
    def slopes_for(n: int) -> torch.Tensor:
        """The paper's slopes 2^(−8/n), 2^(−16/n), …; for n not a power of two, its recipe of
        interleaving the slopes of the next power of two."""

        def power_of_two(k: int) -> list[float]:
            start = 2 ** (-8 / k)
            return [start ** (i + 1) for i in range(k)]

        k = 2 ** math.floor(math.log2(n))
        slopes = power_of_two(k)
        if k < n:
            slopes += power_of_two(2 * k)[0::2][: n - k]
        return torch.tensor(slopes)

    def bias(self, t: int, s: int, device: torch.device | None = None) -> torch.Tensor:
        """The (h, t, s) float bias for t queries that are the last t of s positions."""
        pos = torch.arange(s - t, s, device=device).unsqueeze(-1)  # (t, 1)
        dist = (pos - torch.arange(s, device=device)).abs()  # (t, s)
        return -self.slopes.to(device).view(-1, 1, 1) * dist  # (h, t, s)
