"""The plumbing every decoder-only language model shares (GPT-2, GPT-NeoX, Llama and its kin).

```text
input_ids (b, t) ─► embed ─► TransformerStack (causal, ends in its final norm) ─► h (b, t, E)
                                                ─► logits = h · Wᵀ (b, t, V), W = output_weight
```

A family's model subclasses `DecoderLM`, builds its parts in `__init__` and keeps only
what is its own: how tokens are embedded (`DecoderLM.embed`: GPT-2 adds learned position
vectors; rotary models add nothing and let the layers rotate by `positions`) and the mask
(`DecoderLM.attention_mask`: Mistral's sliding window). Generation comes from
[`qkv.models.generate.DecoderGenerationMixin`][qkv.models.generate.DecoderGenerationMixin].
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from qkv.attention.attention_mask import AttentionMask
from qkv.errors import QkvError
from qkv.models.generate import DecoderGenerationMixin
from qkv.models.outputs import DecoderOutput
from qkv.models.parts import model_parts
from qkv.models.protocol import ModelParts
from qkv.modules import Interventions, KVCache


class DecoderLM(DecoderGenerationMixin, nn.Module):
    """A decoder-only language model: token embedding → causal layer stack → tied or own head.

    A subclass's `__init__` sets `config` (with `vocab_size`), `name`, `tokenizer`,
    `embed_tokens` (an `nn.Embedding` (V, E)), `decoder` (a
    [`TransformerStack`][qkv.TransformerStack] with its final norm) and `lm_head`
    (`nn.Linear(E, V, bias=False)`, or None when the logits read `embed_tokens.weight`); it
    overrides `max_length` when its config has no `max_length`.

    Examples:
        >>> from qkv.models import LlamaConfig, LlamaModel
        >>> model = LlamaModel(LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64,
        ...                                num_hidden_layers=2, num_attention_heads=4))
        >>> len(model.new_kv_caches(batch_size=1, max_len=8)), model.max_length   # a cache per layer
        (2, 2048)
        >>> model(torch.tensor([[1, 2, 3]]), logits_to_keep=1).logits.shape   # (b, k, V)
        torch.Size([1, 1, 100])
    """

    max_length_field = "max_position_embeddings"  # the config field named when input is too long

    @property
    def layers(self) -> nn.ModuleList:
        """The decoder's layers: `model.layers[L].self_attn` is layer L's attention."""
        return self.decoder.layers

    @property
    def max_length(self) -> int:
        """The most tokens (prompt + generated) the model takes."""
        return self.config.max_length

    @property
    def parts(self) -> ModelParts:
        """Every part an explanation reads ([`ModelParts`][qkv.models.protocol.ModelParts]): the
        tables `embedding_tables` names, each layer's parts, the final norm and
        `output_weight`."""
        return model_parts(self.layers, self.embedding_tables(), head=self.output_weight,
                           final_norm=self.decoder.norm)

    def embedding_tables(self) -> dict[str, nn.Module]:
        """The tables `embed` sums, by name: the token table (rotary models have no other)."""
        return {"token": self.embed_tokens}

    @property
    def output_weight(self) -> torch.Tensor:
        """(V, E) the matrix the logits are read with (`embed_tokens.weight` when tied)."""
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def new_kv_caches(self, batch_size: int, max_len: int) -> list[KVCache]:
        """One empty [`KVCache`][qkv.modules.kv_cache.KVCache] per layer for `max_len` tokens
        (prompt included), with as many heads as the layers' keys and values have (h_kv under GQA)."""
        p = self.embed_tokens.weight
        return [KVCache(batch_size, layer.self_attn.num_kv_heads, layer.self_attn.head_dim, max_len,
                        dtype=p.dtype, device=p.device) for layer in self.layers]

    def attention_mask(self, padding: torch.Tensor | None, t: int = 2) -> AttentionMask:
        """The one mask of every layer: causal, bottom-right (with a cache the t new tokens are
        the last of all positions), and the padding (b, s) (True = real token) if any."""
        return AttentionMask(causal=True, alignment="bottom_right", key_padding=padding)

    def embed(self, input_ids: torch.Tensor, positions: torch.Tensor | None, past: int) -> torch.Tensor:
        """(b, t) ids → (b, t, E) what enters layer 0; `positions` (b, t) when some token is
        padding (else the t tokens follow the `past` cached ones). Rotary models add nothing here."""
        return self.embed_tokens(input_ids)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                kv_caches: list[KVCache] | None = None,
                trace_rows: torch.Tensor | slice | None = None,
                output_hidden_states: bool = False,
                logits_to_keep: int | None = None,
                position_ids: torch.Tensor | None = None,
                interventions: Interventions | None = None) -> DecoderOutput:
        """Next-token logits for every position (or the last `logits_to_keep`).

        Args:
            input_ids: (b, t) token ids (the new tokens, when `kv_caches` hold earlier ones).
            attention_mask: (b, past + t), 1/True for real tokens, 0/False for padding (either
                side). Positions count real tokens only, so padding never changes a real
                token's result (a left-padded prompt decodes as it does alone).
            kv_caches: one [`KVCache`][qkv.modules.kv_cache.KVCache] per layer (see
                `new_kv_caches`); the new tokens' keys and values are appended and attention is
                causal, bottom-right.
            trace_rows: query positions (among the t new tokens) to record in every layer.
            output_hidden_states: also return what enters each layer.
            logits_to_keep: compute the logits of the last k positions only, (b, k, V)
                (generation needs 1: the output head is a large matrix).
            position_ids: (b, t) or (t,) each new token's position, when it is not its place in
                `input_ids` — e.g. a shard of one long sequence under sequence parallelism
                ([`qkv.distributed.shard_positions`][qkv.distributed.shard_positions]: learned
                tables and RoPE must see global positions). Default: counted from the cache and the
                padding.
            interventions: heads zeroed or replaced, value vectors zeroed, layer inputs patched
                (`Interventions`, handed to the layer stack).

        Returns:
            A `DecoderOutput` (logits (b, t, V), or (b, k, V)).
        """
        # 1) check the ids, the caches and the length
        b, t = self._check_ids(input_ids)
        past = self._check_caches(kv_caches)
        if past + t > self.max_length:
            raise QkvError(f"input is {past + t} tokens; {self.name} takes at most "
                           f"{self.max_length} ({self.max_length_field})")
        # 2) padding and each token's position
        padding, positions = self._padding_positions(attention_mask, b, t, past)
        if position_ids is not None:
            positions = self._check_position_ids(position_ids, b, t)
        # 3) embed → layers (the stack ends in the final norm) → logits
        out = self.decoder(self.embed(input_ids, positions, past), mask=self.attention_mask(padding, t),
                           kv_caches=kv_caches, trace_rows=trace_rows,
                           output_hidden_states=output_hidden_states, positions=positions,
                           interventions=interventions)
        h = out.last_hidden_state if logits_to_keep is None else out.last_hidden_state[:, -logits_to_keep:]
        return DecoderOutput(
            logits=F.linear(h, self.output_weight),  # (b, t or k, V)
            hidden_states=out.hidden_states,
            traces=out.traces,
        )

    def _padding_positions(self, attention_mask: torch.Tensor | None, b: int, t: int,
                           past: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(padding (b, past + t) True = real, positions (b, t)), both None when no token is padding."""
        if attention_mask is None:
            return None, None
        if attention_mask.shape != (b, past + t):
            raise ValueError(f"attention_mask must be (batch, past + new tokens) = "
                             f"{(b, past + t)}, got {tuple(attention_mask.shape)}")
        real = attention_mask.bool()
        if bool(real.all()):
            return None, None
        # each token's position = how many real tokens precede it
        return real, (real.long().cumsum(-1) - 1).clamp(min=0)[:, past:]  # (b, t)

    def _check_position_ids(self, position_ids: torch.Tensor, b: int, t: int) -> torch.Tensor:
        """(b, t) integer positions in [0, max_length); ValueError naming the problem otherwise."""
        if not isinstance(position_ids, torch.Tensor) or position_ids.is_floating_point() or \
                position_ids.dtype == torch.bool or position_ids.shape not in ((t,), (b, t)):
            raise ValueError(f"position_ids must be an integer tensor of shape {(b, t)} or {(t,)}, got "
                             f"{getattr(position_ids, 'dtype', type(position_ids).__name__)} "
                             f"{tuple(getattr(position_ids, 'shape', ()))}")
        if position_ids.numel() and (int(position_ids.min()) < 0 or int(position_ids.max()) >= self.max_length):
            raise ValueError(f"position_ids must lie in [0, {self.max_length}) for {self.name}, got "
                             f"{int(position_ids.min())}…{int(position_ids.max())}")
        return position_ids.to(torch.long).expand(b, t)

    def _check_ids(self, input_ids: torch.Tensor) -> tuple[int, int]:
        if not isinstance(input_ids, torch.Tensor) or input_ids.ndim != 2 or input_ids.is_floating_point():
            shape = tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
            raise ValueError(f"input_ids must be an integer tensor (batch, tokens), got {shape}")
        V = self.config.vocab_size
        if input_ids.numel() and not 0 <= int(input_ids.min()) <= int(input_ids.max()) < V:
            raise QkvError(f"token ids must be in [0, {V}), got "
                           f"{int(input_ids.min())}..{int(input_ids.max())}")
        return tuple(input_ids.shape)

    def _check_caches(self, kv_caches: list[KVCache] | None) -> int:
        if kv_caches is None:
            return 0
        if len(kv_caches) != len(self.layers):
            raise ValueError(f"kv_caches must hold one KVCache per layer ({len(self.layers)}), "
                             f"got {len(kv_caches)}")
        return len(kv_caches[0])
