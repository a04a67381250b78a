"""The seed documents' worked example, computed by qkv: one token's attention, step by step.

Four tokens ("cat apple tree juice", a seed's example), tiny random embeddings plus sinusoidal
positions, random (seeded) W_Q, W_K, W_V — then every number the seeds talk about, read from
[`qkv.attention_trace`][qkv.attention_trace]. No model is needed: this shows the arithmetic, not
what training learns (`qkv explain` shows that on a real model).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from qkv.attention import AttentionTrace, attention_trace
from qkv.errors import QkvError
from qkv.modules.positional import SinusoidalPositionalEncoding


@dataclass(frozen=True)
class Walkthrough:
    """Inputs and the trace of the worked example. Shapes: x (t, E); w_* (E, d); trace (1, t, ·)."""

    tokens: list[str]
    x: torch.Tensor
    w_q: torch.Tensor
    w_k: torch.Tensor
    w_v: torch.Tensor
    trace: AttentionTrace


def worked_example(tokens: list[str], *, dim: int = 4, seed: int = 0) -> Walkthrough:
    """Embed `tokens` at random (seeded), add positions, project, and attend.

    Examples:
        >>> w = worked_example(["cat", "apple"], dim=4)
        >>> w.trace.weights.shape          # (1, t, s)
        torch.Size([1, 2, 2])
    """
    if not tokens:
        raise QkvError("walkthrough needs at least one token")
    if dim < 2 or dim % 2:
        raise QkvError(f"--dim must be an even number >= 2, got {dim}")
    # The weights come first from the seed alone, so they do not change with the token count;
    # each word's embedding from the seed and the word, so a repeated word is one vector (its
    # copies differ only by their positions), as in a model's embedding table.
    g = torch.Generator().manual_seed(seed)
    w_q, w_k, w_v = (torch.randn(dim, dim, generator=g, dtype=torch.float64) for _ in range(3))
    table = {word: _embedding(word, dim, seed) for word in tokens}
    emb = torch.stack([table[word] for word in tokens])  # (t, E)
    x = SinusoidalPositionalEncoding(dim, max_len=len(tokens)).double()(emb)  # (t, E)
    q, k, v = x @ w_q, x @ w_k, x @ w_v  # (t, d) each
    trace = attention_trace(q[None], k[None], v[None])  # (1, t, ·)
    return Walkthrough(tokens, x, w_q, w_k, w_v, trace)


def _embedding(word: str, dim: int, seed: int) -> torch.Tensor:
    """A word's random (E,) embedding, the same wherever and however often the word appears.

    Seeded by sha256 of the seed and the word (`hash()` is salted per process)."""
    digest = hashlib.sha256(f"{seed}\x00{word}".encode("utf-8", "surrogatepass")).digest()
    g = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)
    return torch.randn(dim, generator=g, dtype=torch.float64)


def _vec(v: torch.Tensor) -> str:
    return "[" + ", ".join(f"{float(a):+.3f}" for a in v) + "]"


def render(w: Walkthrough, focus: int) -> str:
    """The step-by-step text for query token `focus`."""
    tr, toks = w.trace, w.tokens
    d = tr.query.shape[-1]
    lines = [f"Tokens: {' '.join(toks)}   (embedding dim {w.x.shape[-1]}, d_k = {d}, seeded at random)",
             "", "1) Each token's input x = embedding + sinusoidal position, and its projections:"]
    for j, tok in enumerate(toks):
        lines.append(f"   {tok:>8}  x={_vec(w.x[j])}  q={_vec(tr.query[0, j])}  "
                     f"k={_vec(tr.key[0, j])}  v={_vec(tr.value[0, j])}")
    i = focus
    lines += ["", f"2) Query of {toks[i]!r} against every key: score_j = q·k_j, scaled by 1/√{d} = {tr.scale:.4f}"]
    for j, tok in enumerate(toks):
        lines.append(f"   {tok:>8}  q·k = {float(tr.scores[0, i, j]):+8.4f}   scaled = "
                     f"{float(tr.scaled[0, i, j]):+8.4f}   softmax weight = {float(tr.weights[0, i, j]):.4f}")
    lines.append(f"   weights sum to {float(tr.weights[0, i].sum()):.6f}")
    lines += ["", f"3) Output for {toks[i]!r} = Σ_j weight_j · v_j:"]
    terms = " + ".join(f"{float(tr.weights[0, i, j]):.3f}·v({tok})" for j, tok in enumerate(toks))
    lines.append(f"   {terms}")
    lines.append(f"   = {_vec(tr.output[0, i])}")
    return "\n".join(lines)
