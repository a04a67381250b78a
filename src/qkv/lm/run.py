"""What every decoder that qkv trains shares: `qkv train lm` and `qkv train reader` both run
`train_decoder` and write the same Hugging Face directory.

* `hf_tensors`, `hf_config`, `save_checkpoint` — the checkpoint, a Hugging Face
  Llama directory (a Mistral one when the model has a sliding window), so `qkv.load(out)` and
  transformers both read it:

  ```text
  config.json                     Llama's / Mistral's config + "qkv_training" (step, options,
                                  history, the command) + "files" (sha256s)
  model-<step>.safetensors        the weights, Hugging Face names ("model.layers.0.…")
  model.safetensors.index.json    Hugging Face's index: which file holds each tensor
  optimizer-<step>.safetensors    AdamW's moments (not in --slim checkpoints)
  tokenizer.json                  the run's tokenizer (<bos> put first)
  ```

* `read_training` — the `qkv_training` record, type-checked.
* `init_weights`, `load_weights` — GPT-2's initialisation from the seed; a checkpoint's
  tensors into a model (names and shapes checked).
* `train_decoder` — new run or `--resume` around `qkv.training.loop.run_loop`; a
  `DecoderRun` says what is particular to one kind of run (its model, batches, evaluation).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from qkv.errors import QkvError
from qkv.models.llama import LAYER_NAMES, LlamaConfig, LlamaModel
from qkv.training import loop
from qkv.training.checkpoint import (
    get_field, load_optimizer_tensors, load_tensors, optimizer_tensors, prepare_out_dir,
    read_listed, read_manifest, save_tensors_writer, write_checkpoint,
)
from qkv.training.config import changed_options, check_threads
from qkv.training.loop import TrainState

KINDS = ("model-*.safetensors", "optimizer-*.safetensors", "model.safetensors.index.json",
         "tokenizer.json")

_TO_HF = {qkv: hf for hf, qkv in LAYER_NAMES.items()}


def hf_tensors(model: LlamaModel) -> dict[str, torch.Tensor]:
    """The model's parameters under Hugging Face's names (`model.layers.0.mlp.up_proj.weight`)."""
    out = {}
    for name, x in model.state_dict().items():
        if name == "embed_tokens.weight":
            out["model.embed_tokens.weight"] = x
        elif name == "decoder.norm.weight":
            out["model.norm.weight"] = x
        elif name == "lm_head.weight":
            out["lm_head.weight"] = x
        else:
            _, _, index, rest = name.split(".", 3)  # decoder.layers.<i>.<module>.<weight|bias>
            module, _, kind = rest.rpartition(".")
            out[f"model.layers.{index}.{_TO_HF[module]}.{kind}"] = x
    return out


def hf_config(config: LlamaConfig) -> dict:
    """config.json for Hugging Face and `qkv.load`: `LlamaForCausalLM`, or
    `MistralForCausalLM` when the model has a sliding window (Llama's config has none)."""
    windowed = config.sliding_window is not None
    kind = {"model_type": "mistral", "architectures": ["MistralForCausalLM"]} if windowed else \
        {"model_type": "llama", "architectures": ["LlamaForCausalLM"]}
    return {**kind,
            "vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
            "intermediate_size": config.intermediate_size,
            "num_hidden_layers": config.num_hidden_layers,
            "num_attention_heads": config.num_attention_heads,
            "num_key_value_heads": config.num_key_value_heads, "head_dim": config.head_dim,
            "max_position_embeddings": config.max_position_embeddings,
            "rms_norm_eps": config.rms_norm_eps, "rope_theta": config.rope_theta,
            "hidden_act": config.hidden_act,
            **({"sliding_window": config.sliding_window} if windowed else
               {"attention_bias": False, "mlp_bias": False}),
            "tie_word_embeddings": config.tie_word_embeddings, "bos_token_id": config.bos_token_id,
            "torch_dtype": "float32"}


def save_checkpoint(out: Path, model: LlamaModel, meta: dict, *, step: int,
                    optimizer: torch.optim.Optimizer | None, tokenizer_json: bytes) -> None:
    """Write the Hugging Face directory of `model` at `step` (+ the optimizer, for --resume)."""
    weights = f"model-{step:06d}.safetensors"
    tensors = hf_tensors(model)
    index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in tensors.values())},
             "weight_map": {name: weights for name in sorted(tensors)}}
    files = {"tokenizer.json": tokenizer_json,
             weights: save_tensors_writer(tensors, metadata={"format": "pt"}),
             "model.safetensors.index.json": (json.dumps(index, indent=2) + "\n").encode("utf-8")}
    record = {**meta, "step": step, "weights": weights, "optimizer": None}
    if optimizer is not None:
        state, groups = optimizer_tensors(optimizer)
        name = f"optimizer-{step:06d}.safetensors"
        files[name] = save_tensors_writer(state)
        record["optimizer"] = {"file": name, "param_groups": groups}
    write_checkpoint(out, files, {**hf_config(model.config), "qkv_training": record}, kinds=KINDS)


def read_training(out: str | Path, *, command: str, format_version: int,
                  model_types: tuple[str, ...]) -> dict:
    """The `qkv_training` section of a run's config.json, its fields type-checked.

    `command` (`"lm"`, `"reader"`) names the trainer in messages; `model_types` are those
    its checkpoints have.
    """
    out = Path(out)
    manifest = read_manifest(out)
    where = str(out / "config.json")
    kind = manifest.get("model_type")
    if kind not in model_types or "qkv_training" not in manifest:
        raise QkvError(f"{out} is not a run of qkv train {command} (its config.json has model_type "
                       f"{kind!r}" + (" and no 'qkv_training' record" if kind in model_types else "")
                       + f"); --resume continues a directory that qkv train {command} wrote")
    section = get_field(manifest, "qkv_training", dict, where)
    if section.get("format_version") != format_version:
        raise QkvError(f"{where}: unsupported qkv_training format_version "
                       f"{section.get('format_version')!r} (this qkv reads {format_version})")
    get_field(section, "step", int, where, minimum=0)
    get_field(section, "weights", str, where)
    get_field(section, "train", dict, where)
    get_field(section, "history", list, where)
    if section.get("optimizer") is not None:
        get_field(section["optimizer"], "file", str, where)
        get_field(section["optimizer"], "param_groups", list, where)
    if section.get("threads") is not None:
        get_field(section, "threads", int, where, minimum=1)
    return section


def load_weights(model: LlamaModel, tensors: dict[str, torch.Tensor], source: str) -> None:
    """Copy a checkpoint's Hugging Face-named `tensors` into `model` (names and shapes checked)."""
    expected = hf_tensors(model)
    if set(tensors) != set(expected):
        missing, unexpected = sorted(set(expected) - set(tensors)), sorted(set(tensors) - set(expected))
        raise QkvError(f"{source}: weights do not match the config (missing {missing[:3]}, "
                       f"unexpected {unexpected[:3]})")
    with torch.no_grad():
        for name, target in expected.items():
            if tensors[name].shape != target.shape:
                raise QkvError(f"{source}: tensor {name} has shape {tuple(tensors[name].shape)}, "
                               f"the config needs {tuple(target.shape)}")
            target.copy_(tensors[name])  # state_dict() tensors share the parameters' storage


def init_weights(model: LlamaModel, seed: int) -> LlamaModel:
    """GPT-2's initialisation from `seed`: N(0, 0.02), the residual projections (attention out,
    SwiGLU down) scaled by 1/√(2·layers); RMSNorm gains stay 1."""
    gen = torch.Generator().manual_seed(seed)
    layers = model.config.num_hidden_layers
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                continue
            std = 0.02 / (2 * layers) ** 0.5 if name.endswith(("out_proj.weight", "down.weight")) else 0.02
            p.copy_(torch.randn(p.shape, generator=gen) * std)
    return model


@dataclass(frozen=True)
class DecoderRun:
    """What one kind of decoder run supplies to `train_decoder`.

    Attributes:
        command: the trainer's name (`"lm"`, `"reader"`), for messages.
        format_version: of its `qkv_training` record.
        model_types: its checkpoints'.
        config_class: its config dataclass (`from_dict`, `to_dict`, `RESUMABLE_CHANGES`).
        tokenizer_json: the tokenizer file every checkpoint holds.
        new_model: config → the model, initialised from the config's seed.
        step_loss: (model, step) → (mean loss with a graph, tokens in the batch).
        evaluate: model → (result kept as `state.last_eval`, fields for the history, a log line).
        record: (model, history, final) → fields of the record besides the common ones (e.g.
            when induction appeared; the final held-out numbers).
    """

    command: str
    format_version: int
    model_types: tuple[str, ...]
    config_class: type
    tokenizer_json: bytes
    new_model: Callable[[object], LlamaModel]
    step_loss: Callable[[LlamaModel, int], tuple[torch.Tensor, int]]
    evaluate: Callable[[LlamaModel], tuple[object, dict, str]]
    record: Callable[[LlamaModel, list, bool], dict]


def print_run_summary(state: TrainState, out, seconds: float, details: list[str], file=None) -> None:
    """One line: the step trained to and how long it took, the trainer's `details`, where the
    checkpoint is (`qkv train lm` / `reader` print it at the end)."""
    print("; ".join([f"trained to step {state.step} in {seconds:.0f} s", *details,
                     f"checkpoint in {out}"]), file=file or sys.stdout)


def _resumable(run: DecoderRun, cfg, out: Path, force: bool) -> tuple[dict, bool]:
    """(the record of the run in `out`, whether continuing it stays exact), once it is known
    that `cfg` continues it: the same options (but those that may change), the same thread
    count (or `force`), an optimizer state kept, steps left to train."""
    meta = read_training(out, command=run.command, format_version=run.format_version,
                         model_types=run.model_types)
    diffs = changed_options(run.config_class.from_dict(meta["train"]), cfg,
                            run.config_class.RESUMABLE_CHANGES)
    if diffs:
        raise QkvError(f"--resume: {out} was trained with a different configuration: {', '.join(diffs)}")
    exact = check_threads(meta, out, allow_inexact=force)
    if not isinstance(meta.get("optimizer"), dict):
        raise QkvError(f"{out}: the checkpoint has no optimizer state to resume from (it was "
                       f"saved with --slim)")
    if meta["step"] >= cfg.steps:
        raise QkvError(f"--resume: {out} is already at step {meta['step']} of --steps {cfg.steps}; "
                       f"raise --steps to train further")
    return meta, exact


def train_decoder(run: DecoderRun, cfg, out: str | Path, *, resume: bool = False,
                  progress: bool = True, command: str | None = None, slim: bool = False,
                  force: bool = False, callback: Callable[[TrainState], None] | None = None
                  ) -> tuple[TrainState, LlamaModel]:
    """Train (or, with `resume`, continue) `run`'s model with options `cfg` into `out`.

    `callback(state)` after every step (an exception from it stops the run like a kill),
    `slim` drops the optimizer state from the final checkpoint, a new run needs an empty
    `out` unless `force`, and with `resume` `force` accepts a different thread count
    (recorded as inexact). Returns the final state and the model (in eval mode).

    Raises:
        QkvError: a bad `out`, a configuration that differs from the resumed run's.
        qkv.training.loop.NonFiniteLoss: the loss became NaN or infinite (nothing saved).
    """
    out = prepare_out_dir(out, resume=resume, force=force, kinds=KINDS)
    meta, exact = _resumable(run, cfg, out, force) if resume else (None, True)
    start, history = (meta["step"], list(meta["history"])) if resume else (0, [])
    elapsed_before = float(meta.get("train_seconds", 0.0)) if resume else 0.0

    model = run.new_model(cfg)
    if resume:
        manifest = read_manifest(out)
        load_weights(model, load_tensors(out, manifest, meta["weights"]), str(out))
        read_listed(out, manifest, "tokenizer.json", "tokenizer")  # listed and intact
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95),
                            weight_decay=cfg.weight_decay)
    if resume:
        load_optimizer_tensors(opt, load_tensors(out, manifest, meta["optimizer"]["file"], "optimizer"),
                               meta["optimizer"]["param_groups"], str(out))
    t0 = time.perf_counter()

    def seconds() -> float:
        return round(elapsed_before + time.perf_counter() - t0, 1)

    def evaluate_at(state: TrainState) -> tuple[object, str]:
        result, fields, line = run.evaluate(model)
        history.append({"step": state.step, "seconds": seconds(), "train_loss": round(state.loss, 4),
                        **fields})
        return result, line

    def save(done: int, last_eval: object, final: bool) -> None:
        meta = {"format_version": run.format_version, "train": cfg.to_dict(), "command": command,
                "history": history, "train_seconds": seconds(),
                "threads": torch.get_num_threads(), "exact": exact,
                **run.record(model, history, final),
                "parameters": sum(p.numel() for p in model.parameters())}
        save_checkpoint(out, model, meta, step=done, optimizer=None if (final and slim) else opt,
                        tokenizer_json=run.tokenizer_json)

    model.train()
    plan = loop.LoopPlan(start=start, steps=cfg.steps, clip=cfg.clip, eval_every=cfg.eval_every,
                         save_every=cfg.save_every)
    with torch.random.fork_rng(devices=[]):
        state = loop.run_loop(plan, params=list(model.parameters()), optimizer=opt,
                              lr=cfg.lr_at, step_loss=lambda step: run.step_loss(model, step),
                              evaluate=evaluate_at, save=save, progress=progress, where=str(out),
                              callback=callback)
    model.eval()
    return state, model
