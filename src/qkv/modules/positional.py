"""Positional information: sinusoidal, learned, rotary (RoPE) and ALiBi.

Sinusoidal and learned encodings are *added* to the token embeddings (`x + pe`); rotary
embeddings *rotate* queries and keys inside attention; ALiBi adds a distance penalty to the
scores. All take an `offset`: the position of the first token (non-zero when decoding with a
KV cache).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn


def _check_span(offset: int, t: int, max_len: int, what: str) -> None:
    if offset < 0 or offset + t > max_len:
        raise ValueError(
            f"{what}: positions {offset}..{offset + t - 1} exceed the {max_len} positions it has"
        )


class SinusoidalPositionalEncoding(nn.Module):
    """Vaswani et al. (2017), §3.5: PE(p, 2i) = sin(p / 10000^(2i/d)), PE(p, 2i+1) = cos(…).

    Examples:
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

    Examples:
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


@dataclass(frozen=True)
class RopeScaling:
    """How a checkpoint stretches RoPE past the length it was trained on (HF's `rope_scaling`).

    The kinds:

    - `"linear"` (Chen et al., 2023, position interpolation): every frequency / `factor`.
    - `"dynamic"` (NTK-aware, "dynamic NTK"): once a call reaches position p ≥
      `max_positions`, the base becomes base · (factor·(p+1)/max_positions − (factor−1))
      ^(d/(d−2)); shorter calls use the plain frequencies. A function of the call, so
      cached decoding rotates earlier keys with the frequencies of *their* call (as
      `transformers` does).
    - `"llama3"` (Llama 3.1): wavelengths longer than `original_max_positions /
      low_freq_factor` are divided by `factor`, shorter than `… / high_freq_factor`
      kept, and the band between interpolated smoothly.
    """

    kind: str
    factor: float
    max_positions: int | None = None  # dynamic: the trained length (max_position_embeddings)
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    original_max_positions: int = 8192  # llama3

    KINDS = ("linear", "dynamic", "llama3")

    def __post_init__(self):
        if self.kind not in self.KINDS:
            raise ValueError(f"unknown RoPE scaling {self.kind!r}; qkv supports {', '.join(self.KINDS)}")
        if not self.factor > 0:
            raise ValueError(f"RoPE scaling factor must be positive, got {self.factor}")
        if self.kind == "dynamic" and not (self.max_positions or 0) > 0:
            raise ValueError("dynamic RoPE scaling needs max_positions (the trained length)")
        if self.kind == "llama3" and not self.high_freq_factor > self.low_freq_factor:
            raise ValueError(f"llama3 RoPE scaling needs high_freq_factor ({self.high_freq_factor}) "
                             f"> low_freq_factor ({self.low_freq_factor})")


def rope_frequencies(head_dim: int, base: float | torch.Tensor, device=None) -> torch.Tensor:
    """(d/2,) float32 θ_i = base^(−2i/d). Computed in float32 as the reference implementations
    (Meta's, `transformers`) do, so a checkpoint sees exactly the angles it was trained with."""
    i = torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float()
    return 1.0 / (base ** (i / head_dim))


def _llama3(inv_freq: torch.Tensor, s: RopeScaling) -> torch.Tensor:
    low_wavelen = s.original_max_positions / s.low_freq_factor
    high_wavelen = s.original_max_positions / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (s.original_max_positions / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    between = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(between, (1 - smooth) * scaled / s.factor + smooth * scaled, scaled)


# The most positions a rotary module keeps a cos/sin table for (2 × 4 KiB a position at d = 128
# in float32, per layer): a short text's forward reads its angles instead of computing them; a
# longer call computes its own (its attention, not its angles, is then what it spends on).
TABLE_POSITIONS = 1024


class RotaryEmbedding(nn.Module):
    """RoPE (Su et al., 2021): rotate pairs of query/key features by a position-dependent angle.

    Uses the "rotate half" pairing (feature i with feature i + d/2), as GPT-NeoX and Llama do.
    Scores then depend on positions only through their difference. `base` is Llama's
    `rope_theta`; `scaling` a `RopeScaling` (or None).

    Examples:
        >>> rope = RotaryEmbedding(8)
        >>> rope(torch.randn(1, 2, 5, 8), offset=3).shape   # (b, h, t, d)
        torch.Size([1, 2, 5, 8])
        >>> rope(torch.randn(2, 2, 3, 8), positions=torch.tensor([[0, 0, 1], [0, 1, 2]])).shape
        torch.Size([2, 2, 3, 8])
    """

    def __init__(self, head_dim: int, base: float = 10000.0, *, scaling: RopeScaling | None = None):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"RotaryEmbedding needs an even head_dim, got {head_dim}")
        if not base > 0:
            raise ValueError(f"RotaryEmbedding needs a positive base, got {base}")
        self.head_dim, self.base, self.scaling = head_dim, base, scaling
        # on the CPU even when the model is built on the meta device (qkv.load): a function of
        # the config, never read from a checkpoint; .to(device) moves it like any buffer
        inv_freq = rope_frequencies(head_dim, base, device="cpu")
        if scaling is not None and scaling.kind == "linear":
            inv_freq = inv_freq / scaling.factor
        elif scaling is not None and scaling.kind == "llama3":
            inv_freq = _llama3(inv_freq, scaling)
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # (d/2,)
        # (key, length, {dtype: (cos, sin)}): the angles' table, see `table`
        self._table: tuple[tuple, int, dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]]] | None = None

    @property
    def dynamic(self) -> bool:
        """Whether the frequencies depend on how far a call reaches (dynamic NTK)."""
        return self.scaling is not None and self.scaling.kind == "dynamic"

    def table(self, length: int, *, device=None,
              dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor] | None:
        """cos and sin (L, d) of positions 0 … L − 1, L ≥ `length`, rounded to `dtype` — computed
        once and kept while the frequencies, device and dtype are unchanged (a text-independent
        part of every forward); None where they are not kept (dynamic NTK, whose frequencies
        depend on the call, or `length` over `TABLE_POSITIONS`). Each row is what `cos_sin`
        computes for that position alone (cos and sin of the same float32 angles, elementwise)."""
        if self.dynamic or length > TABLE_POSITIONS:
            return None
        device = self.inv_freq.device if device is None else torch.device(device)
        freq = self.inv_freq
        # a move, a dtype change or an in-place edit of the frequencies gives a new key; an
        # inference tensor cannot be saved for a later backward: kept apart
        key = (device, freq.device, freq.data_ptr(), freq._version, torch.is_inference_mode_enabled())
        if self._table is None or self._table[0] != key or self._table[1] < length:
            n = min(TABLE_POSITIONS, max(64, 1 << max(0, length - 1).bit_length()))
            self._table = (key, n, {})
        n, kept = self._table[1:]
        if dtype not in kept:  # one per dtype read (the forward's, the attribution's float64)
            pos = torch.arange(n, device=device).float()[:, None]  # (L, 1)
            angles = pos * self.frequencies(0).to(device)  # (L, d/2)
            emb = torch.cat([angles, angles], dim=-1)  # (L, d)
            kept[dtype] = (emb.cos().to(dtype), emb.sin().to(dtype))
        return kept[dtype]

    def at(self, positions: torch.Tensor, *, dtype: torch.dtype = torch.float32
           ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin at `positions` (n,), (n, d): the table's rows where it is kept (reads the
        largest position: one sync), else computed as `cos_sin` computes them."""
        if positions.numel():
            kept = self.table(int(positions.max()) + 1, device=positions.device, dtype=dtype)
            if kept is not None:
                return kept[0][positions], kept[1][positions]
        cos, sin = self.cos_sin(len(positions), positions=positions[None], device=positions.device,
                                dtype=dtype)  # (1, 1, n, d)
        return cos[0, 0], sin[0, 0]

    def frequencies(self, length: int) -> torch.Tensor:
        """(d/2,) float32 frequencies for a call whose positions end below `length`."""
        s = self.scaling
        if s is None or s.kind != "dynamic" or length <= s.max_positions:
            return self.inv_freq.float()
        d = self.head_dim
        seq = torch.tensor(length, device=self.inv_freq.device)  # float32 as transformers' dynamic NTK
        base = self.base * ((s.factor * seq / s.max_positions) - (s.factor - 1)) ** (d / (d - 2))
        return rope_frequencies(d, base, device=self.inv_freq.device)

    def cos_sin(self, t: int, *, offset: int = 0, positions: torch.Tensor | None = None,
                device=None, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of every token's angles, (t, d) or (b, 1, t, d) with `positions`,
        computed in float32 and rounded to `dtype`."""
        if positions is None:
            kept = self.table(offset + t, device=device, dtype=dtype)
            if kept is not None:  # the kept table's rows (the same numbers)
                return kept[0][offset:offset + t], kept[1][offset:offset + t]  # (t, d)
            pos = torch.arange(offset, offset + t, device=device)  # (t,)
        else:
            if positions.shape[-1] != t:
                raise ValueError(f"positions {tuple(positions.shape)} must end in the {t} tokens of x")
            pos = positions[:, None, :] if positions.ndim == 2 else positions  # (b, 1, t)
        # only dynamic NTK depends on how far the call reaches (a sync: read the largest position)
        length = (int(pos.max()) + 1 if pos.numel() else 0) if self.dynamic else 0
        angles = pos.float()[..., None] * self.frequencies(length).to(device)  # (…, t, d/2)
        emb = torch.cat([angles, angles], dim=-1)  # (…, t, d)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    @staticmethod
    def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x · cos + rotate_half(x) · sin, feature i paired with feature i + d/2."""
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin

    def forward(self, x: torch.Tensor, offset: int = 0, positions: torch.Tensor | None = None) -> torch.Tensor:
        """x: (b, h, t, d) at positions offset … offset + t − 1, or at `positions` (b, t) (left
        padding: each row's own positions) → rotated x, same shape."""
        cos, sin = self.cos_sin(x.shape[-2], offset=offset, positions=positions, device=x.device,
                                dtype=x.dtype)
        return self.rotate(x, cos, sin)

    def pair(self, q: torch.Tensor, k: torch.Tensor, offset: int = 0,
             positions: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Queries and keys of the same tokens rotated with one computation of the angles."""
        cos, sin = self.cos_sin(q.shape[-2], offset=offset, positions=positions, device=q.device,
                                dtype=q.dtype)
        return self.rotate(q, cos, sin), self.rotate(k, cos, sin)


class ALiBi(nn.Module):
    """Press et al. (2022): add −m_h · |p_i − j| to the scores; m_h a geometric slope per head.

    Examples:
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
