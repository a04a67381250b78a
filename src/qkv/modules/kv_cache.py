"""The KV cache: keys and values of past tokens, kept so decoding does not recompute them."""

from __future__ import annotations

import torch


class KVCache:
    """Preallocated key/value buffers of shape (b, h_kv, max_len, d) for one attention layer.

    `update(k, v)` appends the new tokens' keys and values and returns everything cached so far;
    the attention then runs the new queries against all of it with bottom-right causality.

    Examples:
        >>> cache = KVCache(batch_size=1, num_kv_heads=2, head_dim=4, max_len=8)
        >>> k, v = cache.update(torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4))
        >>> k.shape, len(cache)
        (torch.Size([1, 2, 3, 4]), 3)
    """

    def __init__(self, batch_size: int, num_kv_heads: int, head_dim: int, max_len: int,
                 *, value_dim: int | None = None, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None):
        if min(batch_size, num_kv_heads, head_dim, max_len) <= 0:
            raise ValueError(
                f"KVCache sizes must be positive, got batch_size={batch_size}, "
                f"num_kv_heads={num_kv_heads}, head_dim={head_dim}, max_len={max_len}"
            )
        self.max_len = max_len
        self.k = torch.zeros(batch_size, num_kv_heads, max_len, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros(batch_size, num_kv_heads, max_len, value_dim or head_dim, dtype=dtype,
                             device=device)
        self.length = 0

    def __len__(self) -> int:
        return self.length

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """k: (b, h_kv, t, d), v: (b, h_kv, t, dv) → all cached (b, h_kv, length + t, ·)."""
        t = k.shape[-2]
        if k.ndim != 4 or k.shape[:2] != self.k.shape[:2] or k.shape[-1] != self.k.shape[-1]:
            raise ValueError(f"KVCache holds {tuple(self.k.shape)}, cannot append keys {tuple(k.shape)}")
        if v.shape != (*self.v.shape[:2], t, self.v.shape[-1]):
            raise ValueError(f"KVCache holds values {tuple(self.v.shape)}, cannot append values "
                             f"{tuple(v.shape)} to keys {tuple(k.shape)}")
        if self.length + t > self.max_len:
            raise ValueError(f"KVCache is full: {self.length} + {t} tokens > max_len {self.max_len}")
        self.k[:, :, self.length : self.length + t] = k
        self.v[:, :, self.length : self.length + t] = v
        self.length += t
        return self.k[:, :, : self.length], self.v[:, :, : self.length]

    def reorder(self, index: torch.Tensor) -> None:
        """Keep batch rows `index` (beam search: follow each surviving beam's history)."""
        self.k = self.k.index_select(0, index)
        self.v = self.v.index_select(0, index)

    def reset(self) -> None:
        self.length = 0
