"""A transformers model on `"qkv"` behind qkv's model protocol: `HFModel`.

`qkv.load(path)` returns one for a model_type qkv has no native family for (Gemma 2, OLMo 2,
gpt-oss, ELECTRA …), so every explanation runs on it unchanged (see
[`qkv.models.protocol`][qkv.models.protocol]). What the protocol asks and where it comes from:

```text
tokenizer        qkv's Tokenizer over the directory's tokenizer files
layers[L]        the L-th element of the checkpoint's layer list (the list holding the
                 attention modules, found by running the model once and listing the
                 attention calls): every layer, whatever mixes its tokens
  .parts         its :class:`~qkv.models.protocol.LayerParts`: mixers with their kinds
                 (:mod:`qkv.hf.mixers`), norms found by behaviour, feed-forward, residual form
parts            :class:`~qkv.models.protocol.ModelParts`: the tables, each layer's parts,
                 the read-out, each checked on the discovery forward
  .self_attn     an :class:`HFAttention` (None in a layer without softmax attention): h,
                 h_kv, d, dv, E read off its call; ``out_proj``
                 the projection that reads the heads' outputs, when one was found;
                 ``q_proj``/``k_proj``/``v_proj`` (every head's W_Q, W_K, W_V as matrices)
                 and ``q_norm``/``k_norm`` from :mod:`qkv.hf.projections`' table, kept only
                 where they rebuild the kernel's q, k, v (else ``projection_note`` says why)
  .norm1, .sequential_residual
                 the norm the attention reads, and whether the layer forms x + attn before
                 its feed-forward (a child reads exactly that sum): what ALTI decomposes
forward(ids, mask, trace_rows=, output_hidden_states=, interventions=)
                 the transformers forward inside a :func:`qkv.hf.trace.recording`: the
                 attention function records the traced rows (q, k, v after the model's own
                 positions and norms) and applies value and head edits; hooks registered for
                 the call only keep what enters each layer (and apply ``Interventions.inputs``),
                 what enters each attention module (its x and the ``position_embeddings``
                 it is handed: the trace's ``position_step``) and what it returns (the
                 residual x + attn)
```

What it cannot give, by name: projections that are no linear map of the module's input (or
that the table does not hold) — `explain_head` then starts from q, k, v as the kernel read
them; ALTI on a layer whose x + attn no child reads (parallel residual, norms on the branch).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn

from qkv.attention.trace import LseRequest
from qkv.attention.traced import row_positions
from qkv.errors import QkvError
from qkv.hf.projections import Parts, Rotation, Sizes, as_projection, read
from qkv.hf.trace import Recording, recording
from qkv.hf.mixers import output_gate, softmax_kind, stateful_kind
from qkv.models.gpt_neox import ParallelResidualLayer
from qkv.rounding import rebuilds
from qkv.models.outputs import DecoderOutput, EncoderOutput
from qkv.models.protocol import (
    Capabilities, Embeddings, LayerNorms, LayerParts, Mixer, ModelParts, OutputGated, ResidualForm,
    ResidualScales, Unembedding,
)
from qkv.modules.multihead import MultiHeadTrace
from qkv.modules.norms import fit
from qkv.modules.stack import LayerRows
from qkv.modules.transformer import LayerTrace
from qkv.modules.writes import AtPositions, Weights, Writes, WritesTrace

#: Why explain_head starts from q, k and v on a module whose projections cannot be read (the
#: reason from :func:`qkv.hf.projections.read` follows it, in its result and its render).
PROJECTION_NOTE = ("x·W_Q, x·W_K and x·W_V are not shown: q and every k_j, v_j are the ones the "
                   "attention kernel read (after the rotation or norm), because ")


class _Weight:
    """Any parameter of a module, where only its dtype is read (`q_proj.weight.element_size()`)."""

    def __init__(self, weight: torch.Tensor):
        self.weight = weight


class HFAttention(OutputGated):
    """One layer's self-attention, as explanations see it (sizes read off the forward).

    Fields: num_heads h, num_kv_heads h_kv, head_dim d, value_dim dv, embed_dim E; module (the
    transformers attention module); out_module (the module reading the heads' outputs: Linear or
    GPT-2's Conv1D) and out_proj (it as a `Projection` (E, h·dv)), or
    None; q_proj, k_proj, v_proj (`Projection`s: every
    head's W_Q (h·d, E), W_K, W_V (h_kv·d, E) and biases) and q_norm, k_norm (the module's own,
    or None) from `parts`; projection_note "" when they were read, else why not (then q_proj
    is any weight of the module: its dtype, for sizes); output_gate the module's
    [`OutputGate`][qkv.models.protocol.OutputGate] (Qwen3-Next / 3.5) or None.
    """

    q_norm = k_norm = None
    norm_after_rotation = False  # True: q_norm, k_norm act after the rotation (HunYuan), as read

    def __init__(self, module: nn.Module, *, heads: int, kv_heads: int, head_dim: int,
                 value_dim: int, embed_dim: int, out_module: nn.Module | None, parts: Parts | str):
        self.module, self.out_module = module, out_module
        self.out_proj = None if out_module is None else as_projection(out_module)
        self.num_heads, self.num_kv_heads = heads, kv_heads
        self.head_dim, self.value_dim, self.embed_dim = head_dim, value_dim, embed_dim
        self.output_gate = output_gate(module, heads=heads, head_dim=head_dim)
        self.parts = parts if isinstance(parts, Parts) else None
        if self.parts is None:
            self.projection_note = PROJECTION_NOTE + parts
            self.q_proj = _Weight(next(module.parameters()))  # its dtype, for sizes
        else:
            self.projection_note = ""
            self.q_proj, self.k_proj, self.v_proj = parts.q_proj, parts.k_proj, parts.v_proj
            self.q_norm, self.k_norm = parts.q_norm, parts.k_norm
            self.norm_after_rotation = parts.norm_after_rotation

    def position_step(self, cos_sin) -> Rotation | None:
        """The `Rotation` the `position_embeddings` handed to the
        module in one forward make of its q and k, in its style, or None (no rotation)."""
        if self.parts is None or self.parts.rotation is None or cos_sin is None:
            return None
        return Rotation(*cos_sin, self.parts.rotation, self.parts.rotate)


class HFLayer:
    """One transformers layer (`block`), its `HFAttention` (`self_attn`; None in a
    layer whose mixers run transformers' own code: Gated DeltaNet, Mamba-2 …) and its parts
    (`parts`, a [`LayerParts`][qkv.models.protocol.LayerParts]).

    `mixers` the layer's [`Mixer`][qkv.models.protocol.Mixer]s; `mixer_module` the one whose
    input and output the residual structure is read from (the attention module where there is
    one); `out_module` what returns the mixer's branch (the output projection, or the mixer
    itself); `feed_forward` and `ffn_norm` (pre-norm: the norm the feed-forward reads).

    Its residual structure, read off a forward (`_structure`): `sequential_residual`
    when the layer forms x + attn (attn: the output projection's output) before its feed-forward
    — pre-norm (`norm_first`; `norm1` the part whose output the attention reads: x + attn is
    read as it is) or post-norm (`norm1` the norm that reads x + attn: its output goes on;
    `norm3` the norm whose output is the layer's, when one is: what it reads, y + ff(y), is
    kept per call in `LayerTrace.ffn_sum`); False otherwise, `residual_note` saying what the
    forward showed instead (a parallel residual, a norm on the attention's branch, a scaled
    branch). A norm on the branches (`post_norm`, `post_ffn_norm`: OLMo 2, Gemma 2) or the
    scales of a scaled layer (`scales`: MiniMax, Granite) make its form `branch_norm` or
    `scaled` ([`ResidualForm`][qkv.models.protocol.ResidualForm]); x + branch is then kept per
    call in `LayerTrace.residual` too.
    """

    cross_attn = None

    def __init__(self, block: nn.Module, self_attn: HFAttention | None, *, mixers: tuple = (),
                 mixer_module: nn.Module | None = None, norm1: nn.Module | None = None,
                 norm3: nn.Module | None = None, ffn_norm: nn.Module | None = None,
                 feed_forward: nn.Module | None = None, norm_first: bool = True,
                 sequential_residual: bool = False, residual_note: str = "",
                 post_norm: nn.Module | None = None, post_ffn_norm: nn.Module | None = None,
                 scales: ResidualScales | None = None, reads_embeddings: bool = False):
        self.block, self.self_attn, self.mixers = block, self_attn, tuple(mixers)
        self.mixer_module = mixer_module if mixer_module is not None else \
            (self_attn.module if self_attn is not None else None)
        self.out_module = self_attn.out_module if self_attn is not None and self_attn.out_module \
            is not None else self.mixer_module
        self.norm1, self.norm_first, self.sequential_residual = norm1, norm_first, sequential_residual
        self.norm3, self.residual_note = norm3, residual_note
        self.ffn_norm, self.feed_forward = ffn_norm, feed_forward
        self.post_norm, self.post_ffn_norm, self.scales = post_norm, post_ffn_norm, scales
        self.reads_embeddings = reads_embeddings

    @property
    def branched(self) -> bool:
        """Whether the layer is `branch_norm` or `scaled`: x + branch formed, read by its parts."""
        return self.scales is not None or self.post_norm is not None

    def modules(self):
        return self.block.modules()

    @property
    def parts(self) -> LayerParts:
        """The layer's [`LayerParts`][qkv.models.protocol.LayerParts], as its forward showed them."""
        if self.sequential_residual:
            form = ResidualForm.PRE_NORM if self.norm_first else ResidualForm.POST_NORM
            norms = LayerNorms(self.norm1, self.ffn_norm if self.norm_first else self.norm3)
        elif self.scales is not None:
            form, norms = ResidualForm.SCALED, LayerNorms(self.norm1, self.ffn_norm)
        elif self.post_norm is not None:
            form = ResidualForm.BRANCH_NORM
            norms = LayerNorms(self.norm1, self.ffn_norm, post_mixer=self.post_norm,
                               post_feed_forward=self.post_ffn_norm)
        else:
            parallel = self.residual_note == ParallelResidualLayer.residual_note \
                and self.feed_forward is not None
            form = ResidualForm.PARALLEL if parallel else ResidualForm.OTHER
            norms = LayerNorms(self.norm1, self.ffn_norm) if parallel or self.reads_embeddings else LayerNorms()
        return LayerParts(self.mixers, norms, self.feed_forward, form, self.residual_note, self.scales,
                          self.reads_embeddings)


@dataclass(frozen=True)
class HFWritesTrace(WritesTrace):
    """What a `Writes` request keeps of a transformers layer's attention: `heads` (b, n, h·dv)
    at the positions, and `key_input` (b, n, E) what the attention module read there — a gated
    head's gate is a map of it (Qwen3-Next, Qwen3.5: `qkv.explain.mixers.gate`), so its writes
    are read from both, as from a row trace's `heads` and `key_input`."""

    key_input: AtPositions | None = None


@dataclass
class _Seen:
    """What one forward's hooks kept for one layer: `entered` (b, t, E) the layer's input
    (after any patch), `x` (b, t, E) the attention module's input, `cos_sin` the
    `position_embeddings` it was handed or None, `out` (b, t, E) what its output projection
    returned, `normed` (b, t, E) what a post-norm layer's `norm1` returned, `ffn_sum`
    (b, t, E) what its `norm3` read, `branch` (b, t, E) what a `branch_norm` layer's
    `post_norm` returned or what a `scaled` layer's `ffn_norm` read (y); `inner`
    (discovery only): every module inside the block → (its input, its output); `order`: for
    each time the layer was entered, how many layers were entered before."""

    entered: torch.Tensor | None = None
    x: torch.Tensor | None = None
    cos_sin: tuple | None = None
    out: torch.Tensor | None = None
    normed: torch.Tensor | None = None
    ffn_sum: torch.Tensor | None = None
    branch: torch.Tensor | None = None
    inner: dict | None = None
    order: list[int] = field(default_factory=list)  # when it was entered: the nth layer entered, each time


class HFModel(nn.Module):
    """A transformers model (`hf`, attn_implementation `"qkv"`) meeting qkv's model protocol.

    Examples:
        >>> model = qkv.load("path/to/gemma-2")                          # doctest: +SKIP
        >>> qkv.explain.explain(model, "The dog ate it", token="it")     # doctest: +SKIP
    """

    def __init__(self, hf: nn.Module, tokenizer, *, name: str):
        super().__init__()
        self.hf, self.tokenizer, self.name, self.config = hf, tokenizer, name, hf.config
        attn_impl = getattr(hf.config, "_attn_implementation", None)
        if attn_impl != "qkv":
            raise ValueError(f"HFModel needs a model on attn_implementation='qkv', got {attn_impl!r}")
        if getattr(hf.config, "is_encoder_decoder", False):
            raise QkvError(f"{name}: an encoder-decoder ({type(hf).__name__}); qkv's explanations of "
                           f"transformers encoder-decoders are not built yet (qkv.hf.load runs it)")
        self._discover()

    # -- what the model is -----------------------------------------------------------------------
    def _discover(self) -> None:
        """Run the model on 3 tokens, listing its attention calls; its layers are the elements of
        the layer list holding them (every checkpoint layer, whatever mixes its tokens); a
        layer's mixers are its attention module (kind by its calls,
        `qkv.hf.mixers.softmax_kind`) and the modules `qkv.hf.mixers.stateful_kind`
        recognises; the output projections are the Linear whose input is exactly a call's
        output. Then once more, traced, to read each attention's projections
        (`qkv.hf.projections.read`), each layer's residual structure and the model's
        embeddings and read-out, checked against that forward."""
        ids = torch.tensor([[1, 2, 3]], device=self._device())
        seen: dict[int, list[torch.Tensor]] = {}
        hooks = [m.register_forward_pre_hook(lambda mod, args: seen.setdefault(id(mod), []).append(args[0]))
                 for m in self.hf.modules() if as_projection(m) is not None]
        rec = Recording(keys=None)
        try:
            with torch.no_grad(), recording(rec):
                out = self.hf(input_ids=ids)
        finally:
            for h in hooks:
                h.remove()
        if not rec.calls:
            raise QkvError(f"{self.name}: no attention call reached qkv during a forward; its attention "
                           f"does not go through transformers' AttentionInterface")
        blocks = self._layer_list(rec.calls)
        per_module: dict[int, list] = {}
        for c in rec.calls:
            per_module.setdefault(id(c.module), []).append(c)
        layers, self._keys, self._extras = [], {}, [()] * len(blocks)
        for i, block in enumerate(blocks):
            inside = {id(m) for m in block.modules()}
            found = [cs for key, cs in per_module.items() if key in inside]
            if len(found) > 1:
                raise QkvError(f"{self.name}: layer {i} runs {len(found)} attention modules; qkv's "
                               f"explanations read one per layer")
            attn = None
            if found:
                c = found[0][0]
                self._keys[id(c.module)] = i
                self._extras[i] = tuple(dict.fromkeys(e for x in found[0] for e in x.extras))
                out_module = None
                for m in block.modules():
                    if any(x.shape == c.output.shape and torch.equal(x, c.output) for x in seen.get(id(m), ())):
                        out_module = m
                attn = (c, out_module, softmax_kind(self.config, calls=len(found[0]),
                                                    indexed=any(x.indexed for x in found[0])))
            layers.append((block, attn, _stateful(block, None if attn is None else attn[0].module)))
        self._layers = self._read_layers(ids, layers)
        first = rec.calls[0]
        causal = bool(getattr(first.module, "is_causal", False))
        self._logits = getattr(out, "logits", None) is not None
        weights = all(layer.self_attn is None or (layer.self_attn.parts is not None
                                                  and layer.self_attn.out_proj is not None)
                      for layer in self._layers)
        self.capabilities = Capabilities(self_attention=True, causal=causal, encoder=not causal,
                                         next_token=causal and self._logits, head_weights=weights)

    def _layer_list(self, calls) -> nn.ModuleList:
        """The checkpoint's layer list: the `nn.ModuleList` whose elements hold the attention
        modules (`model.layers`); QkvError when a module sits in two of its layers (shared)."""
        names = {id(m): n for n, m in self.hf.named_modules()}
        modules = dict(self.hf.named_modules())
        holders = {_layer_name(names[id(c.module)], modules, self.name) for c in calls}
        lists = {name.rsplit(".", 1)[0] for name in holders}
        if len(lists) != 1:
            raise QkvError(f"{self.name}: its attention modules sit in {len(lists)} layer lists "
                           f"({', '.join(sorted(lists))}); qkv reads one stack of layers")
        blocks = modules[lists.pop()]
        for c in calls:
            owners = [i for i, b in enumerate(blocks) if any(m is c.module for m in b.modules())]
            if len(owners) > 1:
                raise QkvError(f"{self.name}: one attention module runs in layers {owners} (shared "
                               f"weights); qkv's explanations need one module per layer")
        return blocks

    def _read_layers(self, ids: torch.Tensor, layers: list) -> list[HFLayer]:
        """One traced forward on `ids`; each layer's `HFLayer` with what it showed: the
        attention module's projections, norms and position step (kept where they rebuild the
        kernel's q, k, v), its residual structure (`_structure`), and the model's
        embeddings and read-out (`_model_parts`)."""
        E = self.hf.config.hidden_size

        def attention(c, m, parts) -> HFAttention:
            return HFAttention(c.module, heads=c.heads, kv_heads=c.kv_heads, head_dim=c.head_dim,
                               value_dim=c.value_dim, embed_dim=E, out_module=m, parts=parts)

        def mixers(attn, stateful) -> tuple[Mixer, ...]:
            soft = () if attn is None else (Mixer(attn[2], attn[0].module, None),)
            return soft + tuple(Mixer(kind, m) for m, kind in stateful)

        unread = [HFLayer(block, None if a is None else attention(a[0], a[1], "not traced yet"),
                          mixer_module=None if a is not None or not st else st[0][0])
                  for block, a, st in layers]  # what the hooks need
        rec = Recording(keys=self._keys, rows=slice(None))
        head = self.hf.get_output_embeddings()  # a PreTrainedModel's: None for an encoder
        with torch.no_grad(), self._hooks(None, unread, inner=True) as (hidden, layers_seen), \
                _outer(self.hf, unread, head) as outer, recording(rec):
            out = self.hf(input_ids=ids)
        # a forward stops after layer L by a hook on it: only where the layers run once each, in order
        self._in_order = all(seen.order == [i] for i, seen in enumerate(layers_seen))
        result = []
        for i, ((block, a, stateful), seen) in enumerate(zip(layers, layers_seen)):
            attn = None
            if a is not None:
                c, out_module, kind = a
                tr = rec.traces[i]
                g = c.heads // c.kv_heads  # the trace's keys and values are repeated per query head
                parts = read(c.module, Sizes(c.heads, c.kv_heads, c.head_dim, c.value_dim), seen.x,
                             seen.cos_sin, tr.query, tr.key[:, ::g], tr.value[:, ::g])
                attn = attention(c, out_module, parts)
                if attn.out_proj is not None:
                    attn.embed_dim = attn.out_proj.weight.shape[0]
            mixer_module = unread[i].mixer_module
            out_module = attn.out_module if attn is not None and attn.out_module is not None else mixer_module
            found = tuple(Mixer(m.kind, m.module, attn if m.kind.softmax else None,
                                out_module if m.module is mixer_module else None)
                          for m in mixers(a, stateful))
            result.append(HFLayer(block, attn, mixers=found, mixer_module=mixer_module,
                                  **_structure(seen, out_module, mixer_module, hidden[i + 1], block,
                                               hidden[0])))
        self._parts = ModelParts(_embeddings(self.hf, ids[0], hidden[0], result),
                                 tuple(layer.parts for layer in result),
                                 _unembedding(outer, head, hidden[-1], getattr(out, "logits", None),
                                              self.config))
        return result

    def _device(self) -> torch.device:
        p = next(self.hf.parameters(), None)
        return p.device if p is not None else torch.device("cpu")

    @property
    def layers(self) -> list[HFLayer]:
        """One `HFLayer` per checkpoint layer: `layers[L].self_attn` is layer L's
        `HFAttention` (None where no softmax attention runs), `.parts` its parts."""
        return self._layers

    @property
    def parts(self) -> ModelParts:
        """Every part an explanation reads ([`ModelParts`][qkv.models.protocol.ModelParts]), each
        found and checked on the discovery forward."""
        return self._parts

    @property
    def max_length(self) -> int | None:
        n = getattr(self.config, "max_position_embeddings", None)
        return n if isinstance(n, int) else None

    def stop_note(self, layer: int) -> str:
        """Why a forward cannot stop after `layer` keeping only what a
        [`LayerRows`][qkv.modules.stack.LayerRows] asks of it ("" where it can — what
        [`stops_at_layer`][qkv.explain.forward.stops_at_layer] answers for this model): the
        layer mixes by transformers' own code (no attention of qkv's to record), the layers do
        not run once each and in order (a hook on layer `layer` would not end the loop after
        it), or its scores carry what a record of q, k and the lse does not keep (a score bias,
        soft-capped or sink logits; each seen on the discovery forward)."""
        if self._layers[layer].self_attn is None:
            kinds = ", ".join(m.kind.value for m in self._parts.layers[layer].mixers) or "nothing"
            return f"layer {layer} mixes its tokens by {kinds} (transformers' own code), not by qkv's attention"
        if not self._in_order:
            return "its layers do not run once each, in order, in one forward"
        if self._extras[layer]:
            return (f"layer {layer}'s attention scores carry {' and '.join(self._extras[layer])}, "
                    f"which a record of q, k and the lse does not keep")
        return ""

    # -- the forward -----------------------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                trace_rows: torch.Tensor | slice | LseRequest | LayerRows | None = None,
                output_hidden_states: bool = False, interventions=None,
                logits_to_keep: int | None = None):
        """The transformers forward, recorded: a `DecoderOutput` (models with next-token
        logits) or an `EncoderOutput`, with qkv's conventions — `hidden_states[L]`
        enters layer L and the last is the last layer's output before any final norm; `traces`
        one `LayerTrace` per layer (`self_attn`: a `MultiHeadTrace` of the rows asked
        for, or an `LseTrace` with `trace_rows=LSE`).

        `trace_rows=LayerRows(ℓ, rows, earlier=…, attention_only=…)` is read as
        [`TransformerStack`][qkv.modules.stack.TransformerStack] reads it: layer ℓ records `rows`
        (positions, `LSE`, `Weights`), each earlier layer `earlier`'s request (the same, a
        `Writes`: its heads and residual at the positions, or nothing), and transformers' layer
        loop ends after layer ℓ (after its attention's residual with `attention_only`, where the
        layer forms x + attn) — a hook on it raises a private signal this forward catches. The
        later layers and the model's head never run: `traces` and `hidden_states` end there and
        the logits (or `last_hidden_state`) have no positions.
        """
        if not isinstance(input_ids, torch.Tensor) or input_ids.ndim != 2 or input_ids.is_floating_point():
            raise ValueError(f"input_ids must be an integer tensor (batch, tokens), got "
                             f"{getattr(input_ids, 'shape', type(input_ids).__name__)}")
        V, L = self.config.vocab_size, len(self._layers)
        if input_ids.numel() and not 0 <= int(input_ids.min()) <= int(input_ids.max()) < V:
            raise QkvError(f"token ids must be in [0, {V}), got {int(input_ids.min())}..{int(input_ids.max())}")
        if interventions is not None:
            interventions.check(L)
        stop = self._stop(trace_rows)
        asked = [trace_rows if stop is None else trace_rows.at(i) if i <= stop else None for i in range(L)]
        edits = {} if interventions is None else \
            {i: e for i in range(L) if (e := interventions.attention(i)) is not None}
        rec = Recording(keys=self._keys, rows=trace_rows if stop is None else None, edits=edits,
                        requests=None if stop is None else dict(enumerate(asked)))
        kwargs = {"logits_to_keep": logits_to_keep} if logits_to_keep is not None and self._logits else {}
        ends = None if stop is None else (stop, trace_rows.attention_only)
        try:
            with self._hooks(interventions, self._layers, stop=ends) as (hidden, seen), recording(rec):
                out = self.hf(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        except _Stopped:  # every hook is removed and the recording reset by the `with`s' exits
            out = None
        if stop is not None:
            short = trace_rows.attention_only and self._layers[stop].sequential_residual
            hidden = hidden[:stop + 1 if short else stop + 2]
            if isinstance(trace_rows.earlier, Writes):  # their positions' rows: all a reader reads
                hidden[:stop] = [trace_rows.earlier.keep(x) for x in hidden[:stop]]
        traces = None
        if trace_rows is not None:
            traces = [self._trace(rec, i, seen[i], asked[i]) for i in range(L if stop is None else stop + 1)]
        states = tuple(hidden) if output_hidden_states else None
        if stop is not None:  # nothing after the layer was computed: no positions
            x = hidden[stop]  # (b, t, E)
            if self._logits:
                return DecoderOutput(logits=x.new_empty(x.shape[0], 0, V), hidden_states=states, traces=traces)
            return EncoderOutput(last_hidden_state=x[:, :0], hidden_states=states, traces=traces)
        if self._logits:
            return DecoderOutput(logits=out.logits, hidden_states=states, traces=traces)
        return EncoderOutput(last_hidden_state=hidden[-1], hidden_states=states, traces=traces)

    def _stop(self, trace_rows) -> int | None:
        """The layer a `LayerRows` stops after (checked), else None."""
        if not isinstance(trace_rows, LayerRows):
            return None
        n = len(self._layers)
        if isinstance(trace_rows.layer, bool) or not isinstance(trace_rows.layer, int) \
                or not 0 <= trace_rows.layer < n:
            raise ValueError(f"LayerRows.layer must be a layer of {self.name} (0…{n - 1}), got "
                             f"{trace_rows.layer!r}")
        if not self._in_order:
            raise QkvError(f"{self.name}: a forward cannot stop after layer {trace_rows.layer}: "
                           f"{self.stop_note(trace_rows.layer)}")
        return trace_rows.layer

    def _trace(self, rec: Recording, i: int, seen: _Seen, asked) -> LayerTrace | None:
        """Layer `i`'s `LayerTrace` for what it was `asked` (None: no trace): the attention's
        record (x = the module's input, its position step, the traced rows, the heads'
        outputs; or the `LSE`, `Weights`, `Writes` record) and, where the layer forms it, the
        residual x + attn (at a `Writes`' positions; none for `Weights`)."""
        if asked is None:
            return None
        layer = self._layers[i]
        residual, ffn_sum = None, seen.ffn_sum  # (b, t, E): x + attn (pre-norm) or norm1(x + attn) (post-norm)
        if layer.sequential_residual:
            residual = seen.entered + seen.out if layer.norm_first else seen.normed
        elif layer.branched:  # y as the layer formed it: x + p₁(m) or α₁·r₁ + β₁·m
            residual = seen.branch if layer.scales is not None else seen.entered + seen.branch
        if isinstance(asked, Writes):
            residual, ffn_sum = (None if r is None else asked.keep(r) for r in (residual, ffn_sum))
        elif isinstance(asked, Weights):  # the weights alone
            residual = ffn_sum = None
        if layer.self_attn is None:  # transformers' own mixer: nothing of qkv's attention to record
            return LayerTrace(None, residual=residual, ffn_sum=ffn_sum)
        if isinstance(asked, Writes):
            read = asked.keep(seen.x)  # (b, n, E) at the positions
            return LayerTrace(HFWritesTrace(rec.traces[i].heads, read), residual=residual, ffn_sum=ffn_sum)
        if isinstance(asked, (LseRequest, Weights)):
            return LayerTrace(rec.traces[i], residual=residual, ffn_sum=ffn_sum)
        x = seen.x  # (b, t, E)
        rows = row_positions(x.shape[1], asked, x.device)
        step = layer.self_attn.position_step(seen.cos_sin)
        return LayerTrace(MultiHeadTrace(rows=rows, query_input=x[:, rows], key_input=x, value_input=x,
                                         attention=rec.traces[i], heads=rec.heads[i],
                                         position_step=step), residual=residual,
                          ffn_sum=ffn_sum)

    @contextmanager
    def _hooks(self, interventions, layers: list[HFLayer], *, inner: bool = False,
               stop: tuple[int, bool] | None = None):
        """For one forward: `hidden` (L + 1 tensors: what the embeddings and each layer
        computed) and `seen` (a `_Seen` per layer: what entered it, after any
        `inputs` patch; what entered its attention module and left its output projection (and
        a post-norm `norm1`); with `inner`, every inner module's input and output). `stop`
        (layer ℓ, attention only): once layer ℓ has run (its x + attn, or norm1 of it, formed,
        where it forms one and only that is asked), a hook raises `_Stopped`. Every hook is
        removed when the `with` ends, however it ends."""
        L = len(layers)
        hidden, seen = [None] * (L + 1), [_Seen(inner={} if inner else None) for _ in range(L)]
        entered = [0]  # how many layers were entered so far (`_Seen.order`)

        def before(i):
            def hook(module, args, kwargs):
                x = args[0] if args else kwargs["hidden_states"]
                seen[i].order.append(entered[0])
                entered[0] += 1
                if i == 0:
                    hidden[0] = x
                new = interventions.input(i, x) if interventions is not None else x
                seen[i].entered = new
                if new is x:
                    return None
                return ((new, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": new})
            return hook

        def after(i):
            def hook(module, args, kwargs, output):
                hidden[i + 1] = _first(output)
            return hook

        handles = []

        def pre(module, hook):
            handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))

        def post(module, hook):
            handles.append(module.register_forward_hook(hook, with_kwargs=True))
        try:
            for i, layer in enumerate(layers):
                pre(layer.block, before(i))
                post(layer.block, after(i))
                if layer.mixer_module is not None:
                    pre(layer.mixer_module, _attention_in(seen[i]))
                if layer.out_module is not None:
                    post(layer.out_module, _keep(seen[i], "out"))
                if not layer.norm_first and layer.sequential_residual:
                    post(layer.norm1, _keep(seen[i], "normed"))
                    if layer.norm3 is not None:
                        pre(layer.norm3, _read(seen[i], "ffn_sum"))
                if layer.scales is not None:
                    pre(layer.ffn_norm, _read(seen[i], "branch"))
                elif layer.post_norm is not None:
                    post(layer.post_norm, _keep(seen[i], "branch"))
                for m in list(layer.block.modules())[1:] if inner else ():
                    post(m, _any_module(seen[i], m))
            if stop is not None:  # after the hooks that keep what it read
                layer, short = layers[stop[0]], stop[1] and layers[stop[0]].sequential_residual
                ends = layer.block if not short else layer.out_module if layer.norm_first else layer.norm1
                post(ends, _stop_here)
            yield hidden, seen
        finally:
            for h in handles:
                h.remove()


class _Stopped(Exception):
    """Raised by a hook once the layer a `LayerRows` stops after has run; `HFModel.forward`
    catches it (private: nothing else sees it)."""


def _stop_here(module, args, kwargs, output):
    raise _Stopped


def _given(args: tuple, kwargs: dict):
    """A hooked module's first input, positional or by keyword."""
    return args[0] if args else next(iter(kwargs.values()), None)


def _attention_in(seen: _Seen):
    def hook(module, args, kwargs):
        seen.x = args[0] if args else kwargs["hidden_states"]
        cos_sin = kwargs.get("position_embeddings")
        seen.cos_sin = tuple(cos_sin) if isinstance(cos_sin, (tuple, list)) and len(cos_sin) == 2 else None
    return hook


def _keep(seen: _Seen, field: str):
    def hook(module, args, kwargs, output):
        setattr(seen, field, _first(output))
    return hook


def _read(seen: _Seen, field: str):
    def hook(module, args, kwargs):
        setattr(seen, field, _given(args, kwargs))
    return hook


def _any_module(seen: _Seen, m: nn.Module):
    def hook(module, args, kwargs, output):
        seen.inner[m] = (_given(args, kwargs), _first(output))
    return hook


def _structure(seen: _Seen, out_module: nn.Module | None, attention: nn.Module,
               output: torch.Tensor, block: nn.Module | None = None,
               embedded: torch.Tensor | None = None) -> dict:
    """A layer's residual structure from what one forward's hooks saw (`HFLayer`'s keywords;
    `output` (b, t, E) the layer's): it forms x + attn when some part reads exactly that sum;
    pre-norm when a part maps x to what the attention reads, or when the sum goes on unnormed
    (the layer's output is x + attn + f, f what a part made of the sum's reader's output: an
    identity norm before the attention, ModernBERT's first layer); post-norm when the attention
    reads x itself and a norm reads x + attn; neither (`sequential_residual` False) otherwise
    (`_other`; `embedded` (b, t, E): what entered layer 0)."""
    if attention is None:
        return dict(residual_note="no token mixer: the layer is a feed-forward only (its tokens "
                                  "do not mix)")
    if out_module is None or seen.out is None:
        return dict(residual_note="no output of its mixer was seen")
    summed = seen.entered + seen.out  # (b, t, E) as the layer would add them
    readers = [made for m, (given, made) in seen.inner.items() if _same(given, summed)]
    norm1 = next((m for m, (given, made) in seen.inner.items() if m is not attention
                  and _same(given, seen.entered) and _same(made, seen.x)), None)
    if not readers and norm1 is not None and _same(output, summed):
        # x + mix is the layer's output, nothing after it (Nemotron-H's layers): pre-norm, no feed-forward
        return dict(norm1=norm1, norm_first=True, sequential_residual=True)
    if not readers:
        return _other(seen, attention, output, block, embedded)
    reads_x = _same(seen.x, seen.entered)
    branch = [made.reshape(summed.shape) for given, made in seen.inner.values()  # (b, t, E) each
              if isinstance(made, torch.Tensor) and made.numel() == summed.numel()
              and any(_same(given, r) for r in readers)]
    norms = [m for m, (given, made) in seen.inner.items() if _same(given, summed) and _normalises(given, made)]
    if (norm1 is not None and not reads_x) or any(_same(output, summed + f) for f in branch):
        ffn_norm = norms[0] if norms else None
        ff = _reader(seen, ffn_norm, attention)
        made = None if ff is None else seen.inner[ff][1]
        if not (isinstance(made, torch.Tensor) and made.shape == summed.shape
                and rebuilds((summed + made).double(), output)):
            ff = None  # no one part is the feed-forward (OPT's fc1, fc2 are the layer's own)
        return dict(norm1=norm1, norm_first=True, sequential_residual=True, ffn_norm=ffn_norm,
                    feed_forward=ff)
    if reads_x and norms:  # norm3: the norm that makes the layer's output (reads y + ff(y))
        norm3 = next((m for m, (given, made) in seen.inner.items() if m is not norms[0]
                      and isinstance(given, torch.Tensor) and _same(made, output)
                      and _normalises(given, made)), None)
        ff = _reader(seen, norms[0], attention)
        made = None if ff is None else seen.inner[ff][1]
        if ff is not None and (norm3 is None or not isinstance(made, torch.Tensor)
                               or made.shape != seen.inner[norms[0]][1].shape
                               or not _same(seen.inner[norms[0]][1] + made, seen.inner[norm3][0])):
            ff = None  # no one part is the feed-forward's branch (BERT's output sub-layer adds it)
        return dict(norm1=norms[0], norm3=norm3, norm_first=False, sequential_residual=True,
                    feed_forward=ff)
    return _other(seen, attention, output, block, embedded)


def _other(seen: _Seen, attention: nn.Module, output: torch.Tensor, block: nn.Module | None,
           embedded: torch.Tensor | None) -> dict:
    """A layer that hands no x + attn on: what it does instead (`_not_summed`), with the parts
    of the forms qkv reads (parallel, a norm on the branch, a scaled residual, a mixer reading
    n₁([x; e]) with e what entered layer 0: Zamba2's shared block)."""
    wide, E = seen.x.shape[-1], seen.entered.shape[-1]
    if wide != E:
        both = None if embedded is None else torch.cat([seen.entered, embedded], -1)  # (b, t, 2E)
        norm1 = next((m for m, (given, made) in seen.inner.items() if m is not attention
                      and _same(given, both) and _same(made, seen.x)), None)
        return dict(norm1=norm1, reads_embeddings=norm1 is not None, residual_note=f"its mixer reads {wide} numbers per token, not the layer's "
                                  f"input's {E} (Zamba2's shared block: the input concatenated with "
                                  f"the embeddings), and its output reaches the residual stream only "
                                  f"through the parts after it (Zamba2: a feed-forward, a linear map "
                                  f"and Mamba-2's input), never as a sum of head writes")
    note = _not_summed(seen, output)
    if note == ParallelResidualLayer.residual_note:
        return dict(residual_note=note, **_parallel(seen, attention, output))
    found = _branch_norm(seen, attention, output) or _scaled(seen, attention, output, block)
    return dict(residual_note=note, **(found or {}))


def _branch_norm(seen: _Seen, mixer: nn.Module, output: torch.Tensor) -> dict | None:
    """A `branch_norm` layer's parts (y = x + p₁(m(n₁(x))), out = y + p₃(f(n₃(y)))): p₁ the
    part that normalises the mixer's output, n₁ what made the mixer's input of x (None: it reads
    x), the feed-forward f the outermost part outside the mixer reading y (or n₃(y)), p₃ the
    part that normalises f's output — each checked to rebuild y and the layer's output."""
    post = next((m for m, (given, made) in seen.inner.items() if _same(given, seen.out)
                 and _normalises(given, made)), None)
    if post is None:
        return None
    y = seen.entered + seen.inner[post][1]  # (b, t, E): as the layer adds them
    norm1 = None if _same(seen.x, seen.entered) else next(
        (m for m, (given, made) in seen.inner.items() if m is not mixer and _same(given, seen.entered)
         and _same(made, seen.x)), None)
    if norm1 is None and not _same(seen.x, seen.entered):
        return None
    n3 = next((m for m, (given, made) in seen.inner.items() if _same(given, y) and _normalises(given, made)), None)
    inside = set(mixer.modules())
    ff = _reader(seen, n3, mixer) if n3 is not None else _outermost(
        [m for m, (given, _) in seen.inner.items() if _same(given, y) and m not in inside])
    made = None if ff is None else seen.inner[ff][1]
    p3 = None if made is None else next(
        (m for m, (given, out) in seen.inner.items() if _same(given, made) and _normalises(given, out)
         and rebuilds((y + out).double(), output)), None)
    if p3 is None and not (isinstance(made, torch.Tensor) and made.shape == y.shape
                           and rebuilds((y + made).double(), output)):
        ff = None  # no one part is the feed-forward's branch
    return dict(norm1=norm1, post_norm=post, ffn_norm=n3, feed_forward=ff, post_ffn_norm=p3)


def _scaled(seen: _Seen, mixer: nn.Module, output: torch.Tensor, block: nn.Module | None) -> dict | None:
    """A `scaled` layer's parts (y = α₁·r₁ + β₁·m(n₁(x)), out = α₃·r₃ + β₃·f(n₃(y))): y
    what a norm n₃ reads, fitted as α₁·r₁ + β₁·m with r₁ = n₁(x) (the mixer's input, MiniMax)
    or x (Granite); f the outermost part outside the mixer reading n₃(y); α₃, β₃ fitted on the
    layer's output. Each factor is the layer's (or its config's) own number where one matches
    the fit; both sums are checked to rebuild what the forward made."""
    inside = set(mixer.modules())
    norm1 = next((m for m, (given, out) in seen.inner.items() if m is not mixer
                  and _same(given, seen.entered) and _same(out, seen.x)), None)
    residuals = [(seen.entered, False)] + ([(seen.x, True)] if norm1 is not None else [])
    for n3, (y, n3y) in seen.inner.items():
        if n3 in inside or y.shape != seen.out.shape or _same(y, seen.entered) or not _normalises(y, n3y):
            continue  # n₁ reads x itself (y = 1·x + 0·m)
        for r1, normed in residuals:
            a1, b1 = _fit(y, r1, seen.out, block)
            if a1 is None:
                continue
            ff = _reader(seen, n3, mixer)
            made = None if ff is None else seen.inner[ff][1]
            if not (isinstance(made, torch.Tensor) and made.shape == y.shape):
                return None
            a3, b3 = _fit(output, n3y if normed else y, made, block)
            if a3 is None:
                return None
            return dict(norm1=norm1, ffn_norm=n3, feed_forward=ff,
                        scales=ResidualScales(a1, b1, a3, b3, normed))
    return None


def _fit(want: torch.Tensor, r: torch.Tensor, branch: torch.Tensor, block: nn.Module | None
         ) -> tuple[float | None, float | None]:
    """(α, β) with want = α·r + β·branch (each (b, t, E)), by least squares, each replaced by
    the nearest of 1 and the layer's own float attributes (MiniMax's `attn_alpha_factor`,
    Granite's `residual_multiplier`); (None, None) where those do not rebuild `want` (a fit no
    number of the layer's explains is no scaled residual)."""
    a, b, y = r.double().flatten(), branch.double().flatten(), want.double().flatten()
    gram = torch.stack([torch.stack([a @ a, a @ b]), torch.stack([b @ a, b @ b])])
    if float(torch.linalg.det(gram)) <= 1e-12 * float(gram.diagonal().prod()):
        return None, None
    fitted = (float(c) for c in torch.linalg.solve(gram, torch.stack([a @ y, b @ y])))
    own = [1.0, *_floats(block)]
    alpha, beta = (min(own, key=lambda v: abs(v - c)) for c in fitted)
    if not rebuilds(alpha * a + beta * b, want.flatten()):
        return None, None
    return alpha, beta


def _floats(block: nn.Module | None) -> list[float]:
    """The numbers `block` keeps as attributes (those a scaled residual reads)."""
    found = [] if block is None else vars(block).values()
    return [float(v) for v in found if isinstance(v, (int, float)) and not isinstance(v, bool)]


def _parallel(seen: _Seen, mixer: nn.Module, output: torch.Tensor) -> dict:
    """A parallel layer's parts (out = x + m(n₁(x)) + f(n₃(x))): the feed-forward f (the
    outermost part, not in the mixer, whose output completes the sum), n₁ (what made the
    mixer's input of x) and n₃ (what made the feed-forward's)."""
    inside = {id(m) for m in mixer.modules()}
    summed = (seen.entered + seen.out).double()
    ff = _outermost([m for m, (given, made) in seen.inner.items() if id(m) not in inside
                     and isinstance(made, torch.Tensor) and made.numel() == summed.numel()
                     and rebuilds(summed + made.double().reshape(summed.shape), output)])
    if ff is None:
        return {}
    reads = seen.inner[ff][0]
    n1 = next((m for m, (given, made) in seen.inner.items() if m is not mixer
               and _same(given, seen.entered) and _same(made, seen.x)), None)
    n3 = next((m for m, (given, made) in seen.inner.items() if m is not ff
               and _same(given, seen.entered) and _same(made, reads)), None)
    return dict(norm1=n1, ffn_norm=n3, feed_forward=ff)


def _reader(seen: _Seen, norm: nn.Module | None, mixer: nn.Module) -> nn.Module | None:
    """The outermost part (not the mixer, not inside it) that reads exactly what `norm` made:
    the feed-forward of a layer whose norm feeds it."""
    if norm is None:
        return None
    made = seen.inner[norm][1]
    inside = {id(m) for m in mixer.modules()}
    readers = [m for m, (given, _) in seen.inner.items() if m is not norm and id(m) not in inside
               and _same(given, made)]
    return _outermost(readers)


def _outermost(found: list[nn.Module]) -> nn.Module | None:
    """The module of `found` holding the most parts (hooks list a parent after its children)."""
    return max(found, key=lambda m: sum(1 for _ in m.modules()), default=None)


def _normalises(given, made) -> bool:
    """Whether a part made `made` of `given` as a norm does (`qkv.modules.norms.fit`: by
    behaviour, so any norm class is one)."""
    return fit(given, made) is not None


def _first(output):
    """A module's output tensor (the first element of a tuple or a ModelOutput)."""
    if isinstance(output, tuple):
        return output[0]
    if isinstance(output, dict):
        return next(iter(output.values()), None)
    return output


def _stateful(block: nn.Module, attention: nn.Module | None) -> list[tuple[nn.Module, object]]:
    """The layer's mixers that run transformers' own code, in module order: (module, kind) for
    each outermost module `qkv.hf.mixers.stateful_kind` recognises (not inside the
    attention module or another mixer)."""
    found, skip = [], set() if attention is None else {id(m) for m in attention.modules()}
    for m in block.modules():
        if id(m) in skip:
            continue
        kind = stateful_kind(m)
        if kind is not None:
            found.append((m, kind))
            skip |= {id(x) for x in m.modules()}
    return found


@contextmanager
def _outer(hf: nn.Module, layers: list[HFLayer], head: nn.Module | None):
    """For the discovery forward: `seen` (module → (input, output)) of every module outside
    the layers, and `"head"` → what the output embedding read."""
    inside = {id(m) for layer in layers for m in layer.block.modules()}
    seen: dict = {}

    def keep(module, args, kwargs, output):
        given = args[0] if args else next(iter(kwargs.values()), None)
        seen[module] = (given, _first(output))

    handles = [m.register_forward_hook(keep, with_kwargs=True) for m in hf.modules()
               if id(m) not in inside and not isinstance(m, nn.ModuleList)]
    try:
        yield seen
    finally:
        for h in handles:
            h.remove()


# the position and segment tables' names beside the token table (BERT's, GPT-2's, OPT's): names
# only propose; the rows must rebuild what entered layer 0
_TABLES = {"position": ("position_embeddings", "wpe", "embed_positions"),
           "type": ("token_type_embeddings",)}


def _embeddings(hf: nn.Module, ids: torch.Tensor, first: torch.Tensor, layers: list[HFLayer]
                ) -> Embeddings | None:
    """The [`Embeddings`][qkv.models.protocol.Embeddings] that rebuild `first` (1, t, E), what
    entered layer 0 for `ids` (t,): the input embedding, the tables beside it, a norm beside
    them that normalises their sum, a multiplier after; None where none rebuild it."""
    token = hf.get_input_embeddings()
    holder = next((m for m in hf.modules() if any(c is token for c in m.children())), None)
    if holder is None or first is None:
        return None
    children = dict(holder.named_children())
    tables = {"token": token}
    for part, names in _TABLES.items():
        table = next((children[n] for n in names if n in children), None)
        weight = None if table is None else getattr(table, "weight", None)
        if isinstance(weight, torch.Tensor) and weight.ndim == 2:
            tables[part] = table
    inside = {id(m) for layer in layers for m in layer.block.modules()}
    pads = [None]
    pad = getattr(tables.get("position"), "padding_idx", None)
    if isinstance(pad, int):
        pads.insert(0, pad)
    offset = getattr(tables.get("position"), "offset", 0)
    offset = offset if isinstance(offset, int) else 0
    want = first[0].double()  # (t, E)
    with torch.no_grad():
        for pad in pads:
            e = Embeddings(tables, position_offset=offset, position_pad=pad)
            summed = sum(e.rows(ids).values()).double()  # (t, E)
            norms = [None] + [m for m in holder.children() if id(m) not in inside and m is not token
                              and not isinstance(m, nn.Embedding)]
            for norm in norms:
                try:
                    made = summed if norm is None else norm(summed.to(first.dtype)).double()
                except (RuntimeError, TypeError):
                    continue
                if made.shape != want.shape:
                    continue
                scale = float((made * want).sum() / (made * made).sum().clamp_min(1e-300))
                if rebuilds(made * scale, first[0]):
                    return Embeddings(tables, offset, pad, norm, 1.0 if rebuilds(made, first[0]) else scale)
    return None


def _unembedding(outer: dict, head: nn.Module | None, last: torch.Tensor,
                 logits: torch.Tensor | None, config) -> Unembedding | None:
    """The read-out ([`Unembedding`][qkv.models.protocol.Unembedding]) that turns `last` (1, t, E),
    the last layer's output, into `logits`: the output embedding after the part outside the
    layers that normalises `last` into what it read, times a constant (Granite's
    1/`logits_scaling`). None for a model without logits, or where none rebuild them."""
    weight = None if head is None else getattr(head, "weight", None)
    if logits is None or not isinstance(weight, torch.Tensor) or head not in outer or last is None:
        return None
    read = outer[head][0]
    norm = next((m for m, (given, made) in outer.items() if m is not head and _same(given, last)
                 and _same(made, read) and _normalises(given, made)), None)
    bias = getattr(head, "bias", None)
    with torch.no_grad():
        h = norm(last) if norm is not None else last
        made = nn.functional.linear(h, weight, bias).double()
    want = logits.double()
    if made.shape != want.shape:
        return None
    scale = float((made * want).sum() / (made * made).sum().clamp_min(1e-300))
    if rebuilds(made * scale, logits):
        return Unembedding(weight, bias, norm, 1.0 if rebuilds(made, logits) else scale)
    c = getattr(config, "final_logit_softcapping", None)  # Gemma 2: c·tanh(z/c)
    if isinstance(c, (int, float)) and c > 0 and rebuilds(c * torch.tanh(made / c), logits):
        return Unembedding(weight, bias, norm, softcap=float(c))
    return None


def _not_summed(seen: _Seen, output: torch.Tensor) -> str:
    """What a layer does instead of handing x + attn on, as one forward shows it (`output`
    (b, t, E) the layer's): a norm reads the attention's output (a sandwich norm); a part reads
    x + c·attn (a residual multiplier, Granite); the output is x + attn + f with f a part's output
    (a parallel residual: GPT-J, GPT-NeoX, Phi)."""
    out, entered = seen.out.double().flatten(), seen.entered.double().flatten()  # (b·t·E,)

    made = [(m, given, y) for m, (given, y) in seen.inner.items()
            if isinstance(given, torch.Tensor)]
    if any(_same(given, seen.out) and _normalises(given, y) for _, given, y in made):
        return ("x + norm(attn(x)): the attention's output normalised before it is added (a norm "
                "on the branch, as in a sandwich norm)")
    for _, given, _ in made:
        if given.numel() == out.numel() and float(out @ out) > 0:
            rest = given.double().flatten() - entered
            c = float(rest @ out) / float(out @ out)
            if min(abs(c), abs(c - 1)) > 1e-3 and rebuilds(entered + c * out, given.flatten()):  # c = 0: x
                return (f"x + {c:.3g}·attn: the attention's output scaled before it is added (a "
                        f"residual multiplier)")
    summed = entered + out
    if any(isinstance(y, torch.Tensor) and y.numel() == out.numel()
           and rebuilds(summed + y.double().flatten(), output.flatten()) for _, _, y in made):
        return ParallelResidualLayer.residual_note  # the same words as qkv's own parallel layer
    return "no part of it reads x + attn"


def _same(a, b) -> bool:
    """Whether two hooked values hold the same numbers in the same order (a part may read its
    input flattened to (b·t, E): OPT's feed-forward)."""
    return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.numel() == b.numel() \
        and torch.equal(a.reshape(b.shape), b)


def _layer_name(attention: str, modules: dict[str, nn.Module], model: str) -> str:
    """The name of the layer holding the attention module `attention`: the deepest prefix
    that is an element of an `nn.ModuleList` (`model.layers.3` for `model.layers.3.self_attn`)."""
    parts = attention.split(".")
    for end in range(len(parts) - 1, 0, -1):
        parent = ".".join(parts[:end - 1])
        if parts[end - 1].isdigit() and isinstance(modules.get(parent), nn.ModuleList):
            return ".".join(parts[:end])
    raise QkvError(f"{model}: cannot tell which layer holds the attention module {attention!r} "
                   f"(no layer list above it)")


def wrap(hf: nn.Module, tokenizer, *, name: str) -> HFModel:
    """`HFModel` around a transformers model already on `attn_implementation="qkv"`."""
    return HFModel(hf, tokenizer, name=name).eval()


__all__ = ["HFAttention", "HFLayer", "HFModel", "PROJECTION_NOTE", "wrap"]
