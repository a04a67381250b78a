"""Text generation for every decoder: greedy or sampled, with the KV cache, padded batches, EOS.

One loop serves all decoder families (GPT-2, Llama, Mistral, Qwen, ...). A decoder takes part
by having:

```text
model(ids, attention_mask, kv_caches=caches) -> an output with .logits (b, t, V)
model.new_kv_caches(batch, max_len)          -> one KVCache per layer
model.max_length                             -> the most tokens it takes
```

Each step feeds only the newest token (the cache holds the keys and values of everything
before it); prompts of different lengths are **left**-padded to one length and the
`attention_mask` says which tokens are real, so every row continues right after its last
real token. Sampling draws from `softmax(logits / temperature)` restricted to the `top_k`
largest and to the smallest set whose probabilities reach `top_p` (Holtzman et al., 2020),
with a private `torch.Generator` (`seed`), so nothing touches the global RNG.
"""

from __future__ import annotations

import inspect

import torch

from qkv.errors import QkvError
from qkv.models.protocol import DECODER
from qkv.modules.stack import stop_note

_FROM_CONFIG = object()  # eos_token_id's default: the model's config says


def generate(model, ids: torch.Tensor, max_new_tokens: int, *, do_sample: bool = False,
             temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
             seed: int | None = None, attention_mask: torch.Tensor | None = None,
             eos_token_id=_FROM_CONFIG, pad_token_id: int | None = None,
             use_cache: bool = True) -> torch.Tensor:
    """Continue each prompt of `ids` by up to `max_new_tokens` tokens.

    Args:
        model: a decoder (see the module doc).
        ids: (b, t) prompt token ids, t ≥ 1; left-padded when the prompts differ in length.
        max_new_tokens: the most tokens to add.
        do_sample: draw each token (True) or take the most likely one (False, greedy).
        temperature: divides the logits before sampling (> 0; < 1 sharpens).
        top_k: sample only among the k most likely tokens (None: all).
        top_p: sample only among the most likely tokens whose probabilities sum to ≥ top_p
            (nucleus sampling; None or 1.0: all).
        seed: seeds the sampler's own generator (reproducible draws).
        attention_mask: (b, t), 1 for real prompt tokens, 0 for (left) padding.
        eos_token_id: a token id or ids that end a row; default the model config's
            `eos_token_id` (none for GPT-2's config here); None never stops.
        pad_token_id: written after a row has ended (default: its first EOS id).
        use_cache: feed only the new token each step (True) or the whole sequence (False;
            the same tokens, slower — the test of the cache).

    Returns:
        (b, t + n) the prompts and their continuations, n ≤ `max_new_tokens`: fewer when
        every row ended with an EOS token (rows that end earlier are padded).

    Examples:
        >>> out = generate(model, torch.tensor([[1, 2, 3]]), 5, do_sample=True, top_k=10, seed=0)  # doctest: +SKIP
        >>> out.shape                                                                             # doctest: +SKIP
        torch.Size([1, 8])
    """
    b, t = _check(model, ids, max_new_tokens, temperature, top_k, top_p, attention_mask)
    eos = _eos_ids(model, eos_token_id)
    pad = pad_token_id if pad_token_id is not None else (eos[0] if eos else 0)
    total = t + max_new_tokens
    mask = torch.ones(b, total, dtype=torch.long, device=ids.device)  # (b, total)
    if attention_mask is not None:
        mask[:, :t] = attention_mask
    generator = None
    if do_sample:
        generator = torch.Generator(device=ids.device)
        if seed is None:
            generator.seed()  # a non-deterministic seed for this generator only
        else:
            generator.manual_seed(seed)
    eos_t = torch.tensor(eos, dtype=ids.dtype, device=ids.device)
    done = torch.zeros(b, dtype=torch.bool, device=ids.device)
    caches = model.new_kv_caches(b, total) if use_cache else None
    # only the last position's logits are needed; a model that can skip the rest is asked to
    last = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
    out, step_input = ids, ids
    with torch.inference_mode():
        for _ in range(max_new_tokens):
            n = out.shape[1]
            logits = model(step_input, mask[:, :n], kv_caches=caches, **last).logits[:, -1]  # (b, V)
            if do_sample:
                next_id = sample(logits, temperature=temperature, top_k=top_k, top_p=top_p,
                                 generator=generator)  # (b,)
            else:
                next_id = logits.argmax(dim=-1)  # (b,)
            next_id = torch.where(done, torch.full_like(next_id, pad), next_id)
            out = torch.cat([out, next_id[:, None]], dim=1)  # (b, n + 1)
            if eos:
                done |= torch.isin(next_id, eos_t)
                if bool(done.all()):
                    break
            step_input = next_id[:, None] if use_cache else out
    return out


def sample(logits: torch.Tensor, *, temperature: float = 1.0, top_k: int | None = None,
           top_p: float | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """(b, V) logits → (b,) one token id per row, drawn from
    [`filter_scores`][qkv.models.generate.filter_scores]' softmax.

    Examples:
        >>> sample(torch.tensor([[0.0, 5.0, 1.0]]), top_k=1)   # only the largest is left
        tensor([1])
    """
    probs = filter_scores(logits, temperature=temperature, top_k=top_k, top_p=top_p).softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]  # (b,)


def filter_scores(logits: torch.Tensor, *, temperature: float = 1.0, top_k: int | None = None,
                  top_p: float | None = None) -> torch.Tensor:
    """(b, V) logits / temperature, with −inf for every token top-k or top-p leaves out.

    top-k keeps the k largest (ties with the k-th stay); top-p keeps the most likely tokens
    until their probabilities reach `top_p` (the token that reaches it included, so at least
    one stays) — the rules of `transformers`' `TopKLogitsWarper` / `TopPLogitsWarper`.

    Examples:
        >>> filter_scores(torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])), top_p=0.7).isinf()
        tensor([[False, False,  True,  True]])
    """
    scores = logits.float() / temperature  # (b, V)
    if top_k is not None and top_k < scores.shape[-1]:
        kth = scores.topk(top_k, dim=-1).values[:, -1:]  # (b, 1) the k-th largest
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_scores, order = scores.sort(dim=-1, descending=False)  # (b, V) least likely first
        # drop the least likely tokens while what they add up to stays within 1 − top_p
        drop_sorted = sorted_scores.softmax(dim=-1).cumsum(dim=-1) <= 1 - top_p
        drop_sorted[:, -1] = False  # the most likely token always stays
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    return scores


def _eos_ids(model, eos_token_id) -> tuple[int, ...]:
    if eos_token_id is _FROM_CONFIG:
        eos_token_id = getattr(getattr(model, "config", None), "eos_token_id", None)
    if eos_token_id is None:
        return ()
    ids = tuple(eos_token_id) if isinstance(eos_token_id, (list, tuple)) else (eos_token_id,)
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise ValueError(f"eos_token_id must be a token id or a list of them, got {eos_token_id!r}")
    return ids


def _check(model, ids, max_new_tokens, temperature, top_k, top_p, attention_mask) -> tuple[int, int]:
    if not isinstance(ids, torch.Tensor) or ids.ndim != 2 or ids.is_floating_point():
        shape = tuple(ids.shape) if isinstance(ids, torch.Tensor) else type(ids).__name__
        raise ValueError(f"ids must be an integer tensor (batch, tokens), got {shape}")
    b, t = ids.shape
    if t == 0 or b == 0 or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"need a non-empty prompt and max_new_tokens >= 0, got prompt "
                         f"{(b, t)} and max_new_tokens={max_new_tokens!r}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if top_k is not None and (not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be a positive integer or None, got {top_k!r}")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1] or None, got {top_p!r}")
    if attention_mask is not None and tuple(attention_mask.shape) != (b, t):
        raise ValueError(f"attention_mask must be (batch, tokens) = {(b, t)}, got "
                         f"{tuple(attention_mask.shape)}")
    limit = model.max_length
    if t + max_new_tokens > limit:
        raise QkvError(f"prompt ({t} tokens) + max_new_tokens ({max_new_tokens}) = "
                       f"{t + max_new_tokens} tokens; {getattr(model, 'name', 'the model')} takes "
                       f"at most {limit}")
    return b, t


class DecoderGenerationMixin:
    """`model.generate(...)` (see
    [`generate`][qkv.models.generate.DecoderGenerationMixin.generate]);
    `qkv.models.decoder.DecoderLM` is the decoder base that mixes it in."""

    causal = True  # a token attends to itself and earlier tokens only (what explanations say)
    capabilities = DECODER  # the one model protocol (qkv.models.protocol)

    def stop_note(self, layer: int) -> str:
        """Why the forward cannot stop after `layer` ("" where it can):
        `qkv.modules.stack.stop_note`, the stack's rule."""
        return stop_note(self.layers, layer)

    def generate(self, ids: torch.Tensor, max_new_tokens: int, use_cache: bool = True, **kwargs) -> torch.Tensor:
        """Continue `ids` (b, t), left-padded with `attention_mask` when the prompts differ
        in length: greedy by default, or sampled (`do_sample`, `temperature`, `top_k`,
        `top_p`, `seed`); see [`qkv.models.generate.generate`][qkv.models.generate.generate], the
        one loop every decoder shares.

        Returns:
            (b, t + n) the prompts followed by the generated tokens.
        """
        return generate(self, ids, max_new_tokens, use_cache=use_cache, **kwargs)
