"""A transformers checkpoint directory, built with `attn_implementation="qkv"` — or one error
naming the architecture or the value that cannot run on qkv (nothing downloaded, no remote code
ever, no pickle ever).

Before transformers builds anything, `config.json` and the weights' headers are checked here,
by the one safetensors reader every qkv loader uses (`qkv.models.checkpoint`: files listed,
inside the directory, never a pickle, index well-formed): the model_type and the architecture
class, every size a positive integer, the activation, dtype, rope_theta, no quantisation and no
other attention implementation, and the layer count against the headers. Then the model is laid
out on the meta device (no memory) and every tensor's shape and dtype checked; transformers'
own loading bars, log lines and warnings stay off stderr.

Examples:
    >>> import qkv.hf                                            # doctest: +SKIP
    >>> model = qkv.hf.load("path/to/olmo2")                     # doctest: +SKIP
    >>> model.config._attn_implementation                        # doctest: +SKIP
    'qkv'
"""

from __future__ import annotations

import os
import re
import warnings
from contextlib import contextmanager

import torch

from qkv.errors import QkvError
from qkv.models import config as cfg
from qkv.models.checkpoint import WeightFiles
from qkv.models.loading import read_config

@contextmanager
def quiet():
    """transformers' progress bars, log lines and `warnings.warn` kept off stderr while it
    loads (an error is qkv's one line; a good load says nothing). Restores what was set."""
    from transformers.utils import logging

    verbosity, bars = logging.get_verbosity(), logging.is_progress_bar_enabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.set_verbosity(verbosity)
        if bars:
            logging.enable_progress_bar()


def load(path: str | os.PathLike, *, dtype=None):
    """The transformers model of `path` (its `architectures[0]` class, eval mode) on qkv.

    Raises `QkvError` (a `ValueError`) when transformers cannot build the
    model_type (remote code is never run), when the class's attention does not go through
    transformers' `AttentionInterface`, when the directory has no config.json, when a value of
    config.json is unusable (see the module doc), or when the weights are missing, pickled,
    outside the directory, of another layer count, shape or dtype, or hold tensors the model
    does not have.
    """

    from huggingface_hub.errors import StrictDataclassError

    from qkv.hf.attention import NAME

    path = os.fspath(path)
    config_file = os.path.join(path, "config.json")
    try:  # a regular file, nested at most MAX_JSON_DEPTH: never a hang or a RecursionError
        raw = read_config(config_file)
    except QkvError as e:
        raise QkvError(f"cannot read a transformers config: {e}") from None
    cls = model_class(raw, config_file)
    cfg.check_common(raw, config_file)
    check_sizes(raw, config_file)
    check_activations(raw, config_file)
    weights = WeightFiles.open(path)  # the files, then every header: before anything is built
    for key in cfg.LAYER_KEYS:  # a layer count beyond the headers' fails here, not after 10⁹ layers
        weights.check_layers(raw.get(key), key, config_file, at_most=True)
    with quiet():
        try:  # transformers' own field checks (huggingface_hub's strict dataclass: a type per field)
            config = cls.config_class.from_pretrained(path, local_files_only=True,
                                                      trust_remote_code=False)
        except (TypeError, ValueError, StrictDataclassError) as e:
            cause = e.__cause__ or e  # the strict dataclass error wraps the TypeError that names the value
            first = str(cause).strip().splitlines()[0] if str(cause).strip() else type(e).__name__
            raise QkvError(f"{config_file}: transformers refuses it: {first}") from None
        check_top_k(config, raw, config_file)
        kw = {} if dtype is None else dict(dtype=dtype)
        try:  # a combination of values no one check names (sizes that do not fit each other)
            check_weights(weights, cls, config)
            # mismatched shapes come back in ``info`` (named below), not as transformers' report
            model, info = cls.from_pretrained(path, config=config, attn_implementation=NAME,
                                              trust_remote_code=False, local_files_only=True,
                                              use_safetensors=True, output_loading_info=True,
                                              ignore_mismatched_sizes=True, **kw)
        except QkvError:
            raise
        except BUILD_ERRORS as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            if "CONVERSION" in first:  # its report (which tensor) is a log line kept quiet here
                raise QkvError(f"{path}: a tensor that transformers converts as it loads {cls.__name__} "
                               f"(experts stacked into one) has another shape than this config.json "
                               f"needs; config.json and the weights disagree") from None
            raise QkvError(f"{config_file}: transformers cannot build {cls.__name__} with these "
                           f"values: {type(e).__name__}: {first}") from None
    name = cls.__name__
    for key, what in (("missing_keys", "has no tensor {0!r}{1} that {2} with this config.json needs"),
                      ("unexpected_keys", "holds a tensor {0!r}{1} that {2} does not have"),
                      ("mismatched_keys", "holds a tensor {0!r}{1} of another shape than {2} needs")):
        found = sorted(str(k if isinstance(k, str) else k[0]) for k in info.get(key) or ())
        if found:  # transformers would go on (random or dropped tensors) and say so in a log line
            more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
            raise QkvError(f"{path}: the checkpoint {what.format(found[0], more, name)}; "
                           f"config.json and the weights disagree")
    return model.eval()


def model_class(raw: dict, config_file: str):
    """The transformers model class config.json names (`architectures[0]`), checked: the
    model_type is one transformers builds, the class is a model class (not `AutoModel`, not
    `Trainer`) of that model_type, and its attention goes through the AttentionInterface."""
    import transformers

    model_type = raw.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise QkvError(f"{config_file}: model_type must be a non-empty string, got {model_type!r}")
    if model_type not in transformers.CONFIG_MAPPING:
        remote = " (its config names remote code, which qkv never runs)" if "auto_map" in raw else ""
        raise QkvError(f"{config_file}: transformers {transformers.__version__} cannot build "
                       f"model_type {model_type!r}{remote}; qkv runs architectures that transformers "
                       f"itself implements")
    architectures = raw.get("architectures") or []
    if not isinstance(architectures, list) or not all(isinstance(a, str) for a in architectures):
        raise QkvError(f"{config_file}: architectures must be a list of class names, got "
                       f"{architectures!r}")
    name = architectures[0] if architectures else model_type
    cls = getattr(transformers, name, None)
    if cls is None:
        raise QkvError(f"{config_file}: architecture {name!r} is not a transformers class; qkv runs "
                       f"architectures that transformers itself implements")
    if not (isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel)
            and isinstance(getattr(cls, "config_class", None), type)):
        raise QkvError(f"{config_file}: architecture {name!r} is not a transformers model class "
                       f"(a PreTrainedModel such as LlamaForCausalLM); qkv builds the class "
                       f"config.json names")
    wants = getattr(cls.config_class, "model_type", model_type)
    if wants and wants != model_type:  # transformers would build it, warning in a log line only
        raise QkvError(f"{config_file}: architecture {name!r} is a {wants!r} model but config.json "
                       f"says model_type {model_type!r}; config.json and the weights disagree")
    # transformers' own test (a private heuristic on the modelling source, read defensively):
    # an ``*Attention(nn.Module)`` that calls ALL_ATTENTION_FUNCTIONS.get_interface
    can_set = getattr(cls, "_can_set_attn_implementation", None)
    if can_set is not None and not can_set():
        raise QkvError(f"{name}: its attention does not go through transformers' AttentionInterface, "
                       f"so it cannot run on qkv; load it with attn_implementation='eager'")
    return cls


# what model code raises on values that do not fit each other (a head dimension the RoPE part
# exceeds, a top-k above the experts): one line naming the class and transformers' words
BUILD_ERRORS = (RuntimeError, ValueError, TypeError, IndexError, KeyError, ZeroDivisionError,
                OverflowError, AttributeError)
#: sizes of the hybrid mixers (issue 39: linear attention, Mamba-2, MLA, indexers, experts), a
#: positive integer where config.json gives one, as :data:`qkv.models.config.SIZE_KEYS` are
HYBRID_SIZE_KEYS = (
    "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim",
    "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
    "linear_conv_kernel_dim", "linear_head_dim", "linear_num_heads", "mamba_n_heads", "mamba_d_head",
    "mamba_d_state", "mamba_d_conv", "mamba_expand", "mamba_chunk_size", "mamba_n_groups",
    "mamba_d_ssm", "mamba_num_heads", "mamba_head_dim", "n_mamba_heads", "mamba_ngroups",
    "n_groups", "ssm_state_size", "conv_kernel", "chunk_size", "expand", "conv_L_cache",
    "block_size", "num_local_experts", "num_experts", "n_routed_experts", "num_experts_per_tok",
    "moe_intermediate_size", "shared_expert_intermediate_size", "shared_intermediate_size",
    "index_topk", "index_head_dim", "index_n_heads", "adapter_rank", "num_mem_blocks",
    "attn_layer_period", "expert_layer_period")
#: where a hybrid's config.json lists each layer's kind
LAYER_TYPE_KEYS = ("layer_types", "layers_block_type")
#: no tensor dimension beyond 2³¹ − 1: a bigger size overflows inside torch
MAX_SIZE = 2**31 - 1
#: a top-k and the count it picks from
TOP_K = {"num_experts_per_tok": ("n_routed_experts", "num_local_experts", "num_experts")}


def check_sizes(raw: dict, where: str) -> None:
    """Every size config.json gives (`SIZE_KEYS` and
    `HYBRID_SIZE_KEYS`) a positive integer of at most `MAX_SIZE`, and each top-k at
    most the count it picks from (`check_top_k`, on the built config) — one QkvError naming the key
    and value, before transformers meets it as a tensor size.

    Examples:
        >>> check_sizes({"kv_lora_rank": -1}, "config.json")
        Traceback (most recent call last):
        ...
        qkv.errors.QkvError: config.json: kv_lora_rank must be an integer >= 1, got -1
    """
    for key in cfg.SIZE_KEYS + HYBRID_SIZE_KEYS:
        if raw.get(key) is not None and cfg.get_int(raw, key, where=where) > MAX_SIZE:
            raise QkvError(f"{where}: {key} {raw[key]} is beyond any model's size (at most "
                           f"{MAX_SIZE})")


def check_top_k(config, raw: dict, where: str) -> None:
    """Each top-k of the built config (a default where config.json has none) at most the count
    it picks from: else a forward's `topk` fails."""
    for key, counts in TOP_K.items():
        k = getattr(config, key, None)
        count = next((c for c in counts if isinstance(getattr(config, c, None), int)), None)
        if isinstance(k, int) and count is not None and k > getattr(config, count):
            given = "" if raw.get(key) is not None else " (transformers' default: config.json has none)"
            raise QkvError(f"{where}: {key} {k}{given} is more than {count} {getattr(config, count)}")


def check_activations(raw: dict, where: str) -> None:
    """The activations config.json names are ones transformers knows (a KeyError inside
    transformers' model code otherwise)."""
    from transformers.activations import ACT2FN

    for key in cfg.ACTIVATION_KEYS:
        act = raw.get(key)
        if act is not None and (not isinstance(act, str) or act not in ACT2FN):
            raise QkvError(f"{where}: {key} {act!r} is not an activation transformers knows "
                           f"({', '.join(sorted(ACT2FN))})")


# a layer's index in a checkpoint name: model.layers.3.…, encoder.layer.3.…, transformer.h.3.…
_LAYER = re.compile(r"\.(?:layers|layer|h|block|blocks)\.(\d+)\.")


def check_weights(weights: WeightFiles, cls, config) -> None:
    """One QkvError naming the tensor and file when the safetensors *headers* (no data read)
    disagree with the model that `config` describes: another number of layers, a tensor
    whose shape is not the model's (e.g. a changed hidden_size), or a floating-point parameter
    stored as integers (int8: refused, never cast). Names the model does not have under the
    same name (renamed by transformers' loading, or dropped) are left to it.
    """
    with torch.device("meta"):  # shapes only: nothing allocated, nothing initialised
        model = cls._from_config(config)
    prefix = (getattr(model, "base_model_prefix", "") or "") + "."
    strip = lambda n: n[len(prefix):] if prefix != "." and n.startswith(prefix) else n  # noqa: E731
    expected = {strip(n): tuple(p.shape) for n, p in model.state_dict().items()}
    layers = {int(m.group(1)) for n in expected if (m := _LAYER.search("." + n))}
    stored_layers: dict[int, tuple[str, str]] = {}
    for name, (file, key) in weights.where.items():
        m = _LAYER.search("." + strip(name))
        if m:
            stored_layers.setdefault(int(m.group(1)), (key, file))
        want = expected.get(strip(name))
        if want is None:
            continue
        if want != weights.shapes[name]:
            raise QkvError(f"{file}: tensor {key!r} has shape {weights.shapes[name]} but "
                           f"{cls.__name__} with this config.json needs {want}; config.json and "
                           f"the weights disagree")
        weights.check_dtype(name)
    if layers and stored_layers and max(stored_layers) != max(layers):
        n, m = max(layers) + 1, max(stored_layers) + 1
        key, file = stored_layers[max(stored_layers)]
        raise QkvError(f"{file}: the weights hold {m} layers (the last: {key!r}) but config.json "
                       f"says {n}; config.json and the weights disagree")


def load_explainable(path: str | os.PathLike, *, name: str | None = None, dtype=None, device=None,
                     files=None):
    """`path` as a qkv model (`qkv.hf.adapter.HFModel`): `load` on `"qkv"`, with
    qkv's tokenizer over the directory's tokenizer files — the registry's `transformers`
    loader ([`qkv.models.registry`][qkv.models.registry]), what [`qkv.load`][qkv.load] returns for a
    model_type without a native family."""
    from qkv.hf.adapter import wrap
    from qkv.models.tokenizer import Tokenizer

    path = os.fspath(path)
    name = name or os.path.basename(os.path.normpath(os.path.abspath(path)))
    hf = load(path, dtype=dtype)
    limit = getattr(hf.config, "max_position_embeddings", None)
    tokenizer = Tokenizer.from_dir(path, name=name, max_length=limit if isinstance(limit, int) else None,
                                   files=files)
    rows = getattr(hf.config, "vocab_size", None)
    if isinstance(rows, int) and tokenizer.vocab_size > rows:
        raise QkvError(f"the tokenizer in {path} has {tokenizer.vocab_size} tokens but the model's "
                       f"vocab_size is {rows} (config.json): a tokenizer from another model?")
    if device is not None:
        hf = hf.to(device)
    try:  # wrap runs one forward (the parts' discovery)
        return wrap(hf, tokenizer, name=name)
    except BUILD_ERRORS as e:
        raise _layer_types_error(e, hf, os.path.join(path, "config.json")) from None


def _layer_types_error(e: Exception, hf, config_file: str) -> Exception:
    """The QkvError for a forward of transformers' own code failing on a layer-type list that
    its config accepted (a kind this model has no layer, mask or cache for), else `e`: a
    failure in qkv's code stays a traceback."""
    import traceback

    frames = traceback.extract_tb(e.__traceback__)
    inside = bool(frames) and f"{os.sep}transformers{os.sep}" in frames[-1].filename
    key = next((k for k in LAYER_TYPE_KEYS if isinstance(getattr(hf.config, k, None), list)), None)
    if not inside or key is None:
        return e
    kinds = getattr(hf.config, key)
    if isinstance(e, KeyError) and e.args and e.args[0] in kinds:
        return QkvError(f"{config_file}: {key} names {e.args[0]!r}, which {type(hf).__name__} "
                        f"has no layer for")
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return QkvError(f"{config_file}: {type(hf).__name__} does not run with {key} {kinds}: "
                    f"{type(e).__name__}: {first}")

