"""A transformers model on ``"qkv"`` behind qkv's model protocol: :class:`HFModel`.

``qkv.load(path)`` returns one for a model_type qkv has no native family for (Gemma 2, OLMo 2,
gpt-oss, ELECTRA …), so every explanation runs on it unchanged (see
:mod:`qkv.models.protocol`). What the protocol asks and where it comes from::

    tokenizer        qkv's Tokenizer over the directory's tokenizer files
    layers[L]        the transformers layer holding the L-th attention module (found by running
                     the model once and listing the attention calls, in order)
      .self_attn     an :class:`HFAttention`: h, h_kv, d, dv, E read off that call; ``out_proj``
                     the projection that reads the heads' outputs, when one was found
    forward(ids, mask, trace_rows=, output_hidden_states=, interventions=)
                     the transformers forward inside a :func:`qkv.hf.trace.recording`: the
                     attention function records the traced rows (q, k, v after the model's own
                     positions and norms) and applies value and head edits; a forward pre-hook
                     on each layer, registered for the call only, keeps what enters it and
                     applies ``Interventions.inputs``

What it cannot give: the query/key/value projections as matrices one can multiply x by (the
positions and norms between them and the kernel are the architecture's own code), so
``explain_head`` starts from q, k, v as the kernel read them (``projection_note``), and the
residual structure of a layer (ALTI refuses it). ``norm`` needs ``out_proj``.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn

from qkv.errors import QkvError
from qkv.hf.trace import Recording, recording
from qkv.models.outputs import DecoderOutput, EncoderOutput
from qkv.models.protocol import Capabilities
from qkv.modules.lse_trace import LseRequest
from qkv.attention.traced import row_positions
from qkv.modules.multihead import MultiHeadTrace
from qkv.modules.transformer import LayerTrace

#: Why explain_head starts from q, k and v on these models (in its result and its render).
PROJECTION_NOTE = ("x·W_Q, x·W_K and x·W_V are not shown: this model's projections, positions and "
                   "norms are transformers' code, not matrices qkv can multiply x by; q and every "
                   "k_j, v_j are the ones its attention kernel read (after the rotation or norm)")


class _Transposed:
    """A GPT-2 ``Conv1D`` (weight (in, out)) seen as an ``nn.Linear`` (weight (out, in))."""

    def __init__(self, conv: nn.Module):
        self.weight, self.bias = conv.weight.T, conv.bias


class _Weight:
    """Any parameter of a module, where only its dtype is read (``q_proj.weight.element_size()``)."""

    def __init__(self, weight: torch.Tensor):
        self.weight = weight


class HFAttention:
    """One layer's self-attention, as explanations see it (sizes read off the forward).

    Fields: num_heads h, num_kv_heads h_kv, head_dim d, value_dim dv, embed_dim E; module (the
    transformers attention module); out_proj (an ``nn.Linear``-like (E, h·dv) reading the heads'
    outputs) or None; q_proj (the query projection module, or any weight: its dtype); rotary,
    q_norm, k_norm None (applied inside transformers' code); projection_note (see the module).
    """

    rotary = q_norm = k_norm = None
    projection_note = PROJECTION_NOTE

    def __init__(self, module: nn.Module, *, heads: int, kv_heads: int, head_dim: int,
                 value_dim: int, embed_dim: int, out_proj):
        self.module, self.out_proj = module, out_proj
        self.num_heads, self.num_kv_heads = heads, kv_heads
        self.head_dim, self.value_dim, self.embed_dim = head_dim, value_dim, embed_dim
        q = next((m for n, m in module.named_children() if n in ("q_proj", "query", "q_lin", "q")), None)
        self.q_proj = q if q is not None else _Weight(next(module.parameters()))  # its dtype, for sizes


class HFLayer:
    """One transformers layer (``block``) and its :class:`HFAttention` (``self_attn``)."""

    cross_attn = None

    def __init__(self, block: nn.Module, self_attn: HFAttention):
        self.block, self.self_attn = block, self_attn

    def modules(self):
        return self.block.modules()


class HFModel(nn.Module):
    """A transformers model (``hf``, attn_implementation ``"qkv"``) meeting qkv's model protocol.

    Example:
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
        """Run the model once on 3 tokens, listing its attention calls: the layers, their sizes, the
        output projections (the Linear whose input is exactly a call's output), causality."""
        ids = torch.tensor([[1, 2, 3]], device=self._device())
        seen: dict[int, list[torch.Tensor]] = {}
        hooks = [m.register_forward_pre_hook(lambda mod, args: seen.setdefault(id(mod), []).append(args[0]))
                 for m in self.hf.modules() if _projection(m) is not None]
        rec = Recording(keys=None)
        try:
            with torch.no_grad(), recording(rec):
                out = self.hf(input_ids=ids)
        finally:
            for h in hooks:
                h.remove()
        calls = rec.calls
        if not calls:
            raise QkvError(f"{self.name}: no attention call reached qkv during a forward; its attention "
                           f"does not go through transformers' AttentionInterface")
        if len({id(c.module) for c in calls}) != len(calls):
            raise QkvError(f"{self.name}: one attention module runs in several layers (shared "
                           f"weights); qkv's explanations need one module per layer")
        names = {id(m): n for n, m in self.hf.named_modules()}
        modules = dict(self.hf.named_modules())
        layers = []
        for c in calls:
            block = modules[_layer_name(names[id(c.module)], modules, self.name)]
            out_proj = None
            for m in block.modules():
                if any(x.shape == c.output.shape and torch.equal(x, c.output) for x in seen.get(id(m), ())):
                    out_proj = _projection(m)
            E = out_proj.weight.shape[0] if out_proj is not None else self.hf.config.hidden_size
            layers.append(HFLayer(block, HFAttention(c.module, heads=c.heads, kv_heads=c.kv_heads,
                                                     head_dim=c.head_dim, value_dim=c.value_dim,
                                                     embed_dim=E, out_proj=out_proj)))
        self._layers = layers
        self._keys = {id(layer.self_attn.module): i for i, layer in enumerate(layers)}
        causal = bool(getattr(calls[0].module, "is_causal", False))
        self._logits = getattr(out, "logits", None) is not None
        self.capabilities = Capabilities(self_attention=True, causal=causal, encoder=not causal,
                                         next_token=causal and self._logits, head_weights=False)

    def _device(self) -> torch.device:
        p = next(self.hf.parameters(), None)
        return p.device if p is not None else torch.device("cpu")

    @property
    def layers(self) -> list[HFLayer]:
        """``layers[L].self_attn`` is layer L's :class:`HFAttention`."""
        return self._layers

    @property
    def max_length(self) -> int | None:
        n = getattr(self.config, "max_position_embeddings", None)
        return n if isinstance(n, int) else None

    # -- the forward -----------------------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                trace_rows: torch.Tensor | slice | LseRequest | None = None,
                output_hidden_states: bool = False, interventions=None,
                logits_to_keep: int | None = None):
        """The transformers forward, recorded: a :class:`DecoderOutput` (models with next-token
        logits) or an :class:`EncoderOutput`, with qkv's conventions — ``hidden_states[L]``
        enters layer L and the last is the last layer's output before any final norm; ``traces``
        one :class:`LayerTrace` per layer (``self_attn``: a ``MultiHeadTrace`` of the rows asked
        for, or an ``LseTrace`` with ``trace_rows=LSE``)."""
        if not isinstance(input_ids, torch.Tensor) or input_ids.ndim != 2 or input_ids.is_floating_point():
            raise ValueError(f"input_ids must be an integer tensor (batch, tokens), got "
                             f"{getattr(input_ids, 'shape', type(input_ids).__name__)}")
        V, L = self.config.vocab_size, len(self._layers)
        if input_ids.numel() and not 0 <= int(input_ids.min()) <= int(input_ids.max()) < V:
            raise QkvError(f"token ids must be in [0, {V}), got {int(input_ids.min())}..{int(input_ids.max())}")
        if interventions is not None:
            interventions.check(L)
        edits = {} if interventions is None else \
            {i: e for i in range(L) if (e := interventions.attention(i)) is not None}
        rec = Recording(keys=self._keys, rows=trace_rows, edits=edits)
        kwargs = {"logits_to_keep": logits_to_keep} if logits_to_keep is not None and self._logits else {}
        with self._layer_hooks(interventions) as (hidden, entered), recording(rec):
            out = self.hf(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        traces = None
        if trace_rows is not None:
            traces = [LayerTrace(self._trace(rec, i, entered[i], trace_rows)) for i in range(L)]
        states = tuple(hidden) if output_hidden_states else None
        if self._logits:
            return DecoderOutput(logits=out.logits, hidden_states=states, traces=traces)
        return EncoderOutput(last_hidden_state=hidden[-1], hidden_states=states, traces=traces)

    def _trace(self, rec: Recording, i: int, x: torch.Tensor, trace_rows) -> MultiHeadTrace:
        if isinstance(trace_rows, LseRequest):
            return rec.traces[i]
        rows = row_positions(x.shape[1], trace_rows, x.device)
        return MultiHeadTrace(rows=rows, query_input=x[:, rows], key_input=x, value_input=x,
                              attention=rec.traces[i], heads=rec.heads[i])

    @contextmanager
    def _layer_hooks(self, interventions):
        """For one forward: ``hidden`` (L + 1 tensors: what the embeddings and each layer
        computed) and ``entered`` (what each layer received, after any ``inputs`` patch)."""
        L = len(self._layers)
        hidden, entered = [None] * (L + 1), [None] * L

        def before(i):
            def hook(module, args, kwargs):
                x = args[0] if args else kwargs["hidden_states"]
                if i == 0:
                    hidden[0] = x
                new = interventions.input(i, x) if interventions is not None else x
                entered[i] = new
                if new is x:
                    return None
                return ((new, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": new})
            return hook

        def after(i):
            def hook(module, args, kwargs, output):
                hidden[i + 1] = output[0] if isinstance(output, tuple) else output
            return hook

        handles = []
        try:
            for i, layer in enumerate(self._layers):
                handles.append(layer.block.register_forward_pre_hook(before(i), with_kwargs=True))
                handles.append(layer.block.register_forward_hook(after(i), with_kwargs=True))
            yield hidden, entered
        finally:
            for h in handles:
                h.remove()


def _projection(m: nn.Module):
    """``m`` as an nn.Linear-like (weight (out, in), bias) if it is a Linear or GPT-2's Conv1D."""
    if isinstance(m, nn.Linear):
        return m
    if type(m).__name__ == "Conv1D" and hasattr(m, "nf"):  # transformers.pytorch_utils.Conv1D
        return _Transposed(m)
    return None


def _layer_name(attention: str, modules: dict[str, nn.Module], model: str) -> str:
    """The name of the layer holding the attention module ``attention``: the deepest prefix
    that is an element of an ``nn.ModuleList`` (``model.layers.3`` for ``model.layers.3.self_attn``)."""
    parts = attention.split(".")
    for end in range(len(parts) - 1, 0, -1):
        parent = ".".join(parts[:end - 1])
        if parts[end - 1].isdigit() and isinstance(modules.get(parent), nn.ModuleList):
            return ".".join(parts[:end])
    raise QkvError(f"{model}: cannot tell which layer holds the attention module {attention!r} "
                   f"(no layer list above it)")


def wrap(hf: nn.Module, tokenizer, *, name: str) -> HFModel:
    """:class:`HFModel` around a transformers model already on ``attn_implementation="qkv"``."""
    return HFModel(hf, tokenizer, name=name).eval()


__all__ = ["HFAttention", "HFLayer", "HFModel", "PROJECTION_NOTE", "wrap"]
