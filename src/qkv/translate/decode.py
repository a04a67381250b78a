"""Generating French: greedy and beam search, with the decoder's KV cache.

With the cache, each new token runs the decoder on one position: its self-attention reads the
cached keys and values of the French tokens so far, its cross-attention the memory's keys and
values projected once per sentence. Without it (`use_cache=False`, kept as the reference the
tests and the benchmark compare against), every step re-runs the decoder over the whole prefix.

`model` is a `TranslationModel` (its `start`/`step`),
annotated as `nn.Module`: that module calls these for its own `translate`/`cross_pass`,
so importing it here would make a cycle.

Decoding never emits [PAD], [BOS] or [UNK]: their logits are set to −inf. Output id rows end
with [EOS] and are right-padded with [PAD].
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from torch import nn
from qkv.translate.data import pad
from qkv.translate.vocab import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Vocab

_NEVER = (PAD_ID, BOS_ID, UNK_ID)


def default_max_new(model: nn.Module, src: torch.Tensor) -> int:
    """A bound on the French length: twice the English (ids incl. [EOS]) plus two, within the model's positions."""
    return min(model.config.max_len, 2 * src.shape[1] + 2)


def _next_log_probs(logits: torch.Tensor) -> torch.Tensor:
    """logits (n, V) → log-probabilities with the never-generated tokens at −inf."""
    logits = logits.float().clone()
    logits[:, list(_NEVER)] = float("-inf")
    return torch.log_softmax(logits, dim=-1)  # (n, V)


@torch.no_grad()
def greedy_decode(model: nn.Module, src: torch.Tensor, *, max_new: int | None = None,
                  use_cache: bool = True) -> torch.Tensor:
    """Most likely next token, one at a time: src (b, s) → ids (b, n) ending in [EOS].

    Examples:
        >>> from qkv.translate.model import TranslationConfig, TranslationModel
        >>> m = TranslationModel(TranslationConfig(10, 12, d_model=8, num_heads=2, encoder_layers=1,
        ...                                        decoder_layers=1, ff_dim=16)).eval()
        >>> src = torch.tensor([[5, 6, 2]])
        >>> bool((greedy_decode(m, src) == greedy_decode(m, src, use_cache=False)).all())
        True
    """
    b = src.shape[0]
    max_new = max_new or default_max_new(model, src)
    out = torch.full((b, 0), PAD_ID, dtype=torch.long, device=src.device)
    finished = torch.zeros(b, dtype=torch.bool, device=src.device)
    tokens = torch.full((b, 1), BOS_ID, dtype=torch.long, device=src.device)
    if use_cache:
        state = model.start(src, max_new)
    else:
        memory, memory_mask = model.encode(src), src != model.config.pad_id
    for _ in range(max_new):
        if use_cache:
            logits = model.step(tokens[:, -1:], state)[:, -1]  # (b, V)
        else:
            logits = model.decode(tokens, memory, memory_mask)[:, -1]  # (b, V)
        nxt = _next_log_probs(logits).argmax(-1)  # (b,)
        nxt = nxt.masked_fill(finished, PAD_ID)
        out = torch.cat([out, nxt[:, None]], dim=1)
        finished |= nxt == EOS_ID
        if finished.all():
            break
        tokens = torch.cat([tokens, nxt[:, None]], dim=1)
    return out


@torch.no_grad()
def beam_search(model: nn.Module, src: torch.Tensor, beam_size: int = 4, *,
                max_new: int | None = None, length_penalty: float = 0.0) -> torch.Tensor:
    """Keep the `beam_size` best partial translations per sentence: src (b, s) → ids (b, n).

    A hypothesis's score is its summed log-probability divided by `length ** length_penalty`
    (0 = plain log-probability: this grammar's lengths are fixed by the English). The decoder
    runs on b·K rows; after each step every cache is reordered to follow the surviving beams
    ([`KVCache.reorder`][qkv.KVCache.reorder]). With `beam_size=1` this is exactly `greedy_decode`.
    """
    if beam_size < 1:
        raise ValueError(f"beam_size must be >= 1, got {beam_size}")
    b, K = src.shape[0], beam_size
    max_new = max_new or default_max_new(model, src)
    state = model.start(src.repeat_interleave(K, dim=0), max_new)  # b·K rows, sentence-major
    scores = torch.full((b, K), float("-inf"), device=src.device)
    scores[:, 0] = 0.0  # one live beam at the start, or the K copies would fill the beam
    history = torch.full((b * K, 0), PAD_ID, dtype=torch.long, device=src.device)
    finished = torch.zeros(b * K, dtype=torch.bool, device=src.device)
    tokens = torch.full((b * K, 1), BOS_ID, dtype=torch.long, device=src.device)
    for _ in range(max_new):
        logp = _next_log_probs(model.step(tokens, state)[:, -1])  # (b·K, V)
        # A finished hypothesis may only be extended by [PAD], at no cost.
        logp[finished] = float("-inf")
        logp[finished, PAD_ID] = 0.0
        V = logp.shape[-1]
        candidates = (scores.view(b * K, 1) + logp).view(b, K * V)
        scores, flat = candidates.topk(K, dim=1)  # (b, K)
        rows = (torch.arange(b, device=src.device)[:, None] * K + flat // V).view(-1)  # (b·K,)
        tokens = (flat % V).view(b * K, 1)
        history = torch.cat([history[rows], tokens], dim=1)
        finished = finished[rows] | (tokens[:, 0] == EOS_ID)
        state.reorder(rows)
        if finished.all():
            break
    lengths = ((history != PAD_ID).sum(1).clamp(min=1)).view(b, K).float()
    best = (scores / lengths ** length_penalty).argmax(dim=1)  # (b,)
    return history.view(b, K, -1)[torch.arange(b), best]


def translate(model: nn.Module, vocab: Vocab, texts: list[str], *, beam: int = 1,
              batch_size: int = 256, progress: Callable[[str, int, int], None] | None = None
              ) -> list[str]:
    """French for each English text (QkvError for empty text or unknown words, before decoding);
    `progress("translating", done, len(texts))` told after each batch."""
    ids = [vocab.encode_en(t) for t in texts]
    out: list[str] = []
    for start in range(0, len(ids), batch_size):
        src = pad(ids[start : start + batch_size])
        gen = greedy_decode(model, src) if beam == 1 else beam_search(model, src, beam)
        out.extend(vocab.decode_fr(row.tolist()) for row in gen)
        if progress is not None:
            progress("translating", len(out), len(ids))
    return out
