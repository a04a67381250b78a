"""A 🤗 transformers encoder-decoder (Marian, BART, mBART, M2M100/NLLB, T5/mT5) behind qkv's model
protocol: what [`qkv.load`][qkv.load] returns for such a directory.

The model runs with `attn_implementation="qkv"` (every encoder, decoder and cross-attention goes
through [`qkv.hf.attention.qkv_attention_forward`][qkv.hf.attention.qkv_attention_forward]; T5's
relative position bias arrives as `bias=`), so the weights it reports are qkv's own
(`output_attentions`: from the forward's log-sum-exp; `cross_pass`: the traced rows', below). The
adapter adds what [`qkv.explain.cross`][qkv.explain.cross] asks every cross-attention model for
([`CrossPass`][qkv.models.protocol.CrossPass]):

`cross_pass(text, target=None)`
    one forward teacher-forced on `target` exactly as transformers trains on `labels`: the
    labels are `tokenizer(text_target=target)` (its end-of-sequence included, its target-side
    rules: mBART's language code, Marian's target vocabulary) and the model's own forward shifts
    them right behind the decoder start token. Row j of a cross map is where the decoder looked
    while producing label j:

    ```text
    labels            y0     y1     y2     </s>
    decoder input   start    y0     y1     y2        (shifted by transformers, not here)
    ```

    ``target=None``: the model's own greedy translation (``generate``), teacher-forced on what it
    generated (decoder input = the generated ids without their last, so each row is the step that
    chose the next token).
`translate(texts, beam=1)`
    `generate` on qkv's attention (greedy or beam search), decoded without special tokens.

Every attention call of that forward is recorded (`qkv.hf.trace`, the one traced attention
qkv's own layers call too): the weights are the traces', and `CrossPass.trace` holds each
layer's record — like the translation model's — so
[`qkv.explain.cross_attention_head`][qkv.explain.cross_attention_head] redoes a cross-attention head
step by step: the decoder's x (what the module received) · W_Q + b → q, the encoder's output (its
`key_value_states`: the memory) · W_K + b → k_i for every source token, with W_Q, W_K, W_V read by
`qkv.hf.projections`' table and checked against the forward (`decoder[L].cross_attn`, an
`HFAttention`). The hooks that keep x and the memory are registered for the call only.

Examples:
    >>> import qkv                                             # doctest: +SKIP
    >>> model = qkv.load("path/to/opus-mt-en-fr")              # doctest: +SKIP
    >>> cp = model.cross_pass("the cat", target="le chat")     # doctest: +SKIP
    >>> cp.target, cp.cross.shape                              # doctest: +SKIP
    (['▁le', '▁chat', '</s>'], torch.Size([6, 8, 3, 3]))
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Hashable

import torch
from torch import nn

from qkv.errors import QkvError
from qkv.files import parse_json, read_regular
from qkv.hf.adapter import HFAttention
from qkv.hf.projections import Sizes, as_projection, read
from qkv.hf.trace import Recording, recording
from qkv.models.protocol import SEQ2SEQ, CrossPass, TooLong
from qkv.translate.model import TranslationTrace
from qkv.modules.multihead import MultiHeadTrace
from qkv.modules.transformer import LayerTrace

# a directory's tokenizer is described by one of these (save_pretrained writes both)
TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json")


class Seq2SeqModel:
    """A transformers encoder-decoder (`hf`, eval, on qkv's attention) and its tokenizer.

    Fields: `hf` the `…ForConditionalGeneration` model; `tokenizer` transformers' own
    tokenizer of the directory; `name` for messages; `config` the transformers config;
    `decoder[L]` layer L's `CrossLayer` (its cross-attention's projections, read off a
    forward at construction); `capabilities` (`head_weights` where every layer's W_Q, W_K,
    W_V and W_O were read).
    """

    def __init__(self, hf, tokenizer, *, name: str):
        self.hf, self.tokenizer, self.name = hf, tokenizer, name
        self.config = hf.config
        self._keys, self.decoder = _discover(hf, name)
        if len(self.decoder) != self.cross_shape[0]:
            raise QkvError(f"{name}: {len(self.decoder)} cross-attention calls reached qkv in a "
                           f"forward, but its config has {self.cross_shape[0]} decoder layers")
        # the one model protocol (qkv.models.protocol): W_Q … W_O known where every layer's were read
        self.capabilities = replace(SEQ2SEQ, head_weights=all(
            layer.cross_attn.parts is not None and layer.cross_attn.out_proj is not None
            for layer in self.decoder))

    @property
    def cross_layers(self) -> list[CrossLayer]:
        """`decoder`, as the protocol names it: layer L's `cross_attn` and `norm_first`."""
        return self.decoder

    @property
    def cross_shape(self) -> tuple[int, int]:
        """(decoder layers, heads per layer)."""
        c = self.config
        layers = getattr(c, "decoder_layers", None) or getattr(c, "num_decoder_layers", None) or c.num_layers
        heads = getattr(c, "decoder_attention_heads", None) or c.num_heads
        return int(layers), int(heads)

    @property
    def max_positions(self) -> int | None:
        """Positions the embeddings cover: the config's `max_position_embeddings`; None where it
        has none (relative positions only, as T5's)."""
        limit = getattr(self.config, "max_position_embeddings", None)
        return limit if isinstance(limit, int) else None

    def gold_alignment(self, text: str) -> None:
        """None: a transformers encoder-decoder knows no gold alignment of its sentences."""
        return None

    def _check_length(self, argument: str, n: int) -> None:
        limit = self.max_positions
        if limit is not None and n > limit:
            raise TooLong(argument, n, limit, self.name)

    def encode_source(self, text: str) -> torch.Tensor:
        """(1, s) the tokenizer's ids of `text` (its special tokens included)."""
        ids = self.tokenizer(text)["input_ids"]
        self._check_length("text", len(ids))
        return torch.tensor([ids], dtype=torch.long)

    def encode_target(self, target: str) -> torch.Tensor:
        """(1, t) the labels transformers trains on: `tokenizer(text_target=target)`."""
        labels = self.tokenizer(text_target=target)["input_ids"]
        self._check_length("target", len(labels))
        return torch.tensor([labels], dtype=torch.long)

    def generate(self, src: torch.Tensor, *, beam: int = 1) -> torch.Tensor:
        """(1, n) `generate`'s ids for `src` (decoder start token first), greedy or beam."""
        kw = dict(num_beams=beam, do_sample=False)
        limit = self.max_positions
        if limit is not None:  # never past the decoder's positions (transformers' default may be)
            kw["max_length"] = min(int(self.hf.generation_config.max_length or limit), limit)
        with torch.no_grad():
            return self.hf.generate(input_ids=src, attention_mask=torch.ones_like(src), **kw)

    def translate(self, texts: list[str], *, beam: int = 1) -> list[str]:
        """The model's translation of each text (special tokens left out)."""
        return [self.tokenizer.decode(self.generate(self.encode_source(t), beam=beam)[0],
                                      skip_special_tokens=True).strip() for t in texts]

    def tokens(self, ids: list[int]) -> list[str]:
        """The tokenizer's strings for `ids`; `[id N]` for an id past its vocabulary (a
        model's embedding often has more rows than its tokenizer has tokens)."""
        return [t if t is not None else f"[id {i}]"
                for i, t in zip(ids, self.tokenizer.convert_ids_to_tokens(ids))]

    @torch.no_grad()
    def cross_pass(self, text: str, target: str | None = None) -> CrossPass:
        """One forward teacher-forced on `target` (see the module doc) →
        [`CrossPass`][qkv.models.protocol.CrossPass].

        Raises [`TooLong`][qkv.models.protocol.TooLong] (a QkvError) when the text or the target
        needs more positions than the model has.
        """
        src = self.encode_source(text)  # (1, s)
        ones = torch.ones_like(src)
        if target is None:
            generated = self.generate(src)[0]  # (n,): start, y0 … (EOS)
            eos_ids = self.hf.generation_config.eos_token_id
            eos_ids = [eos_ids] if isinstance(eos_ids, int) else list(eos_ids or ())
            eos = torch.isin(generated[1:], torch.tensor(eos_ids, dtype=generated.dtype)).nonzero()
            end = int(eos[0]) + 2 if len(eos) else len(generated)  # through the first EOS
            labels = generated[1:end][None]  # (1, t)
            inputs = dict(decoder_input_ids=generated[None, :end - 1])
        else:
            labels = self.encode_target(target)  # (1, t)
            # transformers shifts the labels itself (its decoder start token, mBART's language code)
            inputs = dict(labels=labels)
        rec, seen = _recorded(self.hf, self._keys, input_ids=src, attention_mask=ones, **inputs)
        trace = TranslationTrace(encoder=_layer_traces(rec, seen, "encoder"),
                                 decoder=_layer_traces(rec, seen, "decoder"))
        tok = self.tokenizer
        ids = labels[0].tolist()
        specials = set(tok.all_special_ids)
        target_tokens = self.tokens(ids)
        return CrossPass(
            source=self.tokens(src[0].tolist()), target=target_tokens,
            special=[i in specials for i in ids],
            words=[t for t, i in zip(target_tokens, ids) if i not in specials],
            translation=tok.decode(ids, skip_special_tokens=True).strip(),
            cross=_weights(rec, "cross"), encoder=_weights(rec, "encoder"),
            decoder=_weights(rec, "decoder"), trace=trace)


@dataclass(frozen=True)
class CrossLayer:
    """One decoder layer as [`qkv.explain.cross_attention_head`][qkv.explain.cross_attention_head]
    reads it (as it reads the translation model's layers): `cross_attn` the layer's cross-attention
    (`HFAttention`: h, d, W_Q, W_K, W_V and W_O where they were read, else
    its `projection_note`); `norm_first` whether the module reads a norm of the residual
    stream (pre-norm: mBART, M2M100, T5) rather than the residual itself (post-norm: BART, Marian
    — then a norm reads x + attn, which is how a forward tells them apart)."""

    cross_attn: HFAttention
    norm_first: bool


@dataclass
class _Seen:
    """What one attention module received and returned in one forward: `x` (b, t, E) its
    `hidden_states`, `memory` (b, s, E) its `key_value_states` (cross-attention: the
    encoder's output) or None, `out` (b, t, E) its output (after its output projection)."""

    x: torch.Tensor | None = None
    memory: torch.Tensor | None = None
    out: torch.Tensor | None = None


# Discovery runs a 3-token source and a 2-token target: s ≠ t, so each attention call's
# (queries, keys) says what it is — the encoder's self-attention, the decoder's, or a
# cross-attention (the decoder's queries, the encoder's keys).
PROBE = {(3, 3): "encoder", (2, 2): "decoder", (2, 3): "cross"}


def _discover(hf: nn.Module, name: str) -> tuple[dict[int, Hashable], list[CrossLayer]]:
    """The keys of every attention module (`("encoder" | "decoder" | "cross", layer)`, by the
    order of their calls) and each decoder layer's `CrossLayer`: two forwards of the
    `PROBE` lengths, the first listing the calls (and which projection reads each call's
    output: its W_O), the second traced, reading W_Q, W_K, W_V off it
    (`qkv.hf.projections.read`, kept only where they rebuild the kernel's q, k, v)."""
    device = next(hf.parameters()).device
    src, tgt = torch.arange(1, 4, device=device)[None], torch.arange(1, 3, device=device)[None]
    read_by: dict[int, list[torch.Tensor]] = {}  # id(projection) → what it read
    hooks = [m.register_forward_pre_hook(lambda mod, args: read_by.setdefault(id(mod), []).append(args[0]))
             for m in hf.modules() if as_projection(m) is not None]
    rec = Recording(keys=None)
    try:
        with torch.no_grad(), recording(rec):
            hf(input_ids=src, decoder_input_ids=tgt, use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    calls = rec.calls
    if not calls or len({id(c.module) for c in calls}) != len(calls):
        raise QkvError(f"{name}: its attention calls do not reach qkv once per module (none, or "
                       f"shared weights); qkv's explanations need one module per layer")
    keys, count = {}, {kind: 0 for kind in PROBE.values()}
    for c in calls:
        kind = PROBE.get((c.t, c.s))
        if kind is None:
            raise QkvError(f"{name}: an attention call of {c.t} queries over {c.s} keys on a "
                           f"3-token source and a 2-token target is none of the encoder's, the "
                           f"decoder's or a cross-attention")
        keys[id(c.module)] = (kind, count[kind])
        count[kind] += 1
    cross = [c for c in calls if keys[id(c.module)][0] == "cross"]
    modules = {id(m): m for m in hf.modules()}
    out_modules = [next((modules[i] for i, xs in read_by.items()
                         if any(x.shape == c.output.shape and torch.equal(x, c.output) for x in xs)),
                        None) for c in cross]
    traced, seen = _recorded(hf, keys, input_ids=src, decoder_input_ids=tgt, inner=True)
    layers = []
    for i, (c, out_module) in enumerate(zip(cross, out_modules)):
        tr, at = traced.traces[("cross", i)], seen[("cross", i)]
        g = c.heads // c.kv_heads  # the trace's keys and values are repeated per query head
        parts = read(c.module, Sizes(c.heads, c.kv_heads, c.head_dim, c.value_dim), at.x, None,
                     tr.query, tr.key[:, ::g], tr.value[:, ::g], memory=at.memory)
        attn = HFAttention(c.module, heads=c.heads, kv_heads=c.kv_heads, head_dim=c.head_dim,
                           value_dim=c.value_dim, embed_dim=at.x.shape[-1], out_module=out_module,
                           parts=parts)
        summed = at.x + at.out  # (b, t, E): what a post-norm layer's norm reads
        post_norm = any(x.shape == summed.shape and torch.equal(x, summed) for x in seen["inner"])
        layers.append(CrossLayer(attn, norm_first=not post_norm))
    return keys, layers


@torch.no_grad()
def _recorded(hf: nn.Module, keys: dict[int, Hashable], *, inner: bool = False, **inputs):
    """One forward of `hf` on `inputs` with every attention call keyed in `keys` traced
    (every row: `qkv.hf.trace.recording`) → (the `Recording`, a
    `_Seen` per key; with `inner`, also `"inner"`: what every module read). Every
    hook is removed when it returns."""
    rec = Recording(keys=keys, rows=slice(None))
    modules = {id(m): m for m in hf.modules()}
    seen: dict = {key: _Seen() for key in keys.values()}
    seen["inner"] = []

    def attention_in(key):
        def hook(module, args, kwargs):
            seen[key].x = args[0] if args else kwargs["hidden_states"]
            seen[key].memory = kwargs.get("key_value_states")
        return hook

    def attention_out(key):
        def hook(module, args, output):
            seen[key].out = output[0] if isinstance(output, tuple) else output
        return hook

    def any_in(module, args, kwargs):
        given = args[0] if args else next(iter(kwargs.values()), None)
        if isinstance(given, torch.Tensor):
            seen["inner"].append(given)

    handles = []
    try:
        for i, key in keys.items():
            handles.append(modules[i].register_forward_pre_hook(attention_in(key), with_kwargs=True))
            handles.append(modules[i].register_forward_hook(attention_out(key)))
        if inner:
            handles += [m.register_forward_pre_hook(any_in, with_kwargs=True) for m in hf.modules()]
        with recording(rec):
            hf(**inputs, use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return rec, seen


def _layer_traces(rec: Recording, seen: dict, part: str) -> list[LayerTrace]:
    """The encoder's (`part="encoder"`) or the decoder's `LayerTrace`s, every row: the
    self-attention's record (x: the module's input, projected into q, k and v) and, in the
    decoder, the cross-attention's (q from x, k and v from the memory)."""
    def record(key, memory: bool) -> MultiHeadTrace:
        at, x = seen[key], seen[key].x  # x (b, t, E)
        kv = at.memory if memory else x  # (b, s, E)
        return MultiHeadTrace(rows=torch.arange(x.shape[1], device=x.device), query_input=x,
                              key_input=kv, value_input=kv, attention=rec.traces[key],
                              heads=rec.heads[key])

    n = sum(1 for key in rec.traces if key[0] == part)
    return [LayerTrace(record((part, i), False),
                       cross_attn=record(("cross", i), True) if part == "decoder" else None)
            for i in range(n)]


def _weights(rec: Recording, part: str) -> torch.Tensor:
    """(L, H, t, s) the traced weights of every `part` call (`"encoder"`, `"decoder"`,
    `"cross"`), in layer order."""
    n = sum(1 for key in rec.traces if key[0] == part)
    return torch.stack([rec.traces[(part, i)].weights[0] for i in range(n)])


def load(path: str | os.PathLike, *, name: str | None = None, dtype=None,
         device: torch.device | str | None = None) -> Seq2SeqModel:
    """The encoder-decoder in `path` on qkv's attention, with transformers' tokenizer.

    Raises QkvError when transformers cannot build it (`qkv.hf.load`'s errors); when the
    directory has no tokenizer transformers can read (naming a missing backend such as
    sentencepiece), or a tokenizer file that is not one (`check_tokenizer_files`); when the
    tokenizer has more tokens than the model's embedding has rows (a tokenizer from another
    model); or when its Marian tokenizer keeps separate source and target vocabularies (refused:
    the same id means different tokens on the two sides, and qkv labels both from one).
    """
    import transformers

    from qkv.hf.load import load as load_hf

    path = os.fspath(path)
    check_tokenizer_files(path)
    hf = load_hf(path, dtype=dtype)
    if not any(os.path.isfile(os.path.join(path, f)) for f in TOKENIZER_FILES):
        # transformers would build an empty tokenizer of the model's class and say nothing
        raise QkvError(f"{path}: transformers cannot read the tokenizer of this "
                       f"{hf.config.model_type} model (no {' or '.join(TOKENIZER_FILES)}); qkv needs "
                       f"it to tokenise the text and the target: save the model's tokenizer beside it")
    if device is not None:
        hf = hf.to(device)
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True,
                                                               trust_remote_code=False)
    except (ImportError, OSError, ValueError, TypeError, KeyError, IndexError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise QkvError(f"{path}: transformers cannot read the tokenizer of this "
                       f"{hf.config.model_type} model ({first}); qkv needs it to tokenise the text "
                       f"and the target (Marian and M2M100 tokenizers need the sentencepiece "
                       f"package)") from None
    _check_vocabulary(tokenizer, hf, path)
    return Seq2SeqModel(hf, tokenizer, name=name or os.path.basename(os.path.normpath(os.path.abspath(path))))


# the tokenizer's JSON files transformers reads when present (each must hold one JSON object), and
# its other files (vocabularies, sentencepiece models: regular files, never a FIFO that blocks)
TOKENIZER_JSON = ("tokenizer_config.json", "tokenizer.json", "special_tokens_map.json",
                  "added_tokens.json", "vocab.json")
TOKENIZER_DATA = ("merges.txt", "vocab.txt", "source.spm", "target.spm", "spiece.model",
                  "sentencepiece.bpe.model")


def check_tokenizer_files(path: str) -> None:
    """Every tokenizer file in `path` is what transformers expects, before it reads any: a
    regular file (a FIFO would block the reader, a directory fail later), the JSON ones one
    object each, `tokenizer.json` a tokenizer `tokenizers` reads; Marian's
    `separate_vocabs` refused (see `load`). QkvError naming the file otherwise.

    (transformers reads a `tokenizer.json` holding `[]` and fails at the first text with a
    TypeError; a FIFO `tokenizer_config.json` it skips, building a tokenizer without the
    model's special tokens.)
    """
    import tokenizers

    for name in TOKENIZER_JSON + TOKENIZER_DATA:
        file = os.path.join(path, name)
        if not os.path.lexists(file):
            continue
        data = read_regular(file)  # missing target, FIFO, directory: one line naming the file
        if name not in TOKENIZER_JSON:
            continue
        raw = parse_json(data, file)
        if not isinstance(raw, dict):
            raise QkvError(f"{file} holds a JSON {type(raw).__name__}, not an object: it is not a "
                           f"tokenizer file")
        if name == "tokenizer.json":
            try:
                tokenizers.Tokenizer.from_str(data.decode("utf-8-sig"))
            except Exception as e:  # the Rust side raises a bare Exception
                raise QkvError(f"{file} could not be read as a tokenizer: {e}") from None
        if name == "tokenizer_config.json" and raw.get("separate_vocabs"):
            raise QkvError(f"{file}: this tokenizer keeps separate source and target vocabularies "
                           f"(separate_vocabs), so an id names different tokens in the text and "
                           f"the target; qkv does not show such models yet (a shared vocabulary "
                           f"works)")


def _check_vocabulary(tokenizer, hf, path: str) -> None:
    """Every id the tokenizer can produce must be a row of the model's embedding table (the
    rule of [`qkv.models.loading.load`][qkv.models.loading.load]'s tokenizer check, asked of the
    model's own embedding): a tokenizer from another model would index past it or into wrong rows."""
    rows = hf.get_input_embeddings().num_embeddings
    ids = tokenizer.get_vocab().values()
    n = max(ids) + 1 if ids else 0
    if n > rows:
        raise QkvError(f"the tokenizer in {path} has {n} tokens but the model's vocab_size is "
                       f"{rows} (config.json): a tokenizer from another model?")
