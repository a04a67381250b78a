"""``qkv train lm``: a small Llama-architecture decoder learns text with repeated spans.

* :class:`LMTrainConfig` — every knob, with commented defaults; ``from_dict`` rejects unknown keys
  and wrong types; values are bounded (:mod:`qkv.training.config`).
* :func:`evaluate` — validation loss (all next words, and those predictable only by induction)
  and every head's induction and previous-token score (:mod:`qkv.explain.induction`).
* :func:`train` — AdamW, warm-up + cosine, gradient clipping, the progress bar and checkpoints
  of the shared loop (:func:`qkv.training.loop.run_loop`), ``--resume`` exact.

The checkpoint is a Hugging Face Llama directory, so ``qkv.load(out)`` runs it like any Llama::

    config.json                     Llama's config (model_type "llama") + "qkv_training"
                                    (step, options, history, the command) + "files" (sha256s)
    model-<step>.safetensors        the weights, Hugging Face names ("model.layers.0.…")
    model.safetensors.index.json    Hugging Face's index: which file holds each tensor
    optimizer-<step>.safetensors    AdamW's moments (not in --slim checkpoints)
    tokenizer.json                  the word-level tokenizer (<bos> put first)
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from qkv.errors import QkvError
from qkv.lm.data import BOS_ID, VOCAB_SIZE, DataConfig, LMBatch, build_tokenizer, get_batch, valid_batch
from qkv.models.llama import LAYER_NAMES, LlamaConfig, LlamaModel
from qkv.training import loop
from qkv.training.checkpoint import (
    get_field, load_optimizer_tensors, load_tensors, optimizer_tensors, prepare_out_dir,
    read_listed, read_manifest, save_tensors_writer, write_checkpoint,
)
from qkv.training.config import (
    Schedule, changed_options, check_float, check_int, check_threads, config_from_dict,
)
from qkv.training.loop import TrainState

FORMAT_VERSION = 1
KINDS = ("model-*.safetensors", "optimizer-*.safetensors", "model.safetensors.index.json",
         "tokenizer.json")
# An induction head "has appeared" once some head puts at least this much of its attention, on
# average, on the token after the current token's earlier occurrence (chance is ~0.04 here).
APPEARED = 0.5


@dataclass(frozen=True)
class LMTrainConfig(Schedule):
    """Everything an LM training run depends on. Defaults: the shipped model's run.

    Example:
        >>> LMTrainConfig.from_dict({"steps": 10}).steps
        10
    """

    seed: int = 0  # model initialisation and the training batches
    # model (a Llama: RMSNorm, SwiGLU, RoPE); two layers are the fewest induction needs. Heads of
    # 32 dimensions: RoPE rotates the fast pairs of a head with its position, so only the slow
    # ones can match content; with 16-dimensional heads (64 wide, 4 heads) no induction head had
    # formed after 1,700 steps, with 32 one did within a few hundred (measured, same data).
    d_model: int = 64
    num_heads: int = 2
    layers: int = 2
    ff_dim: int = 128  # SwiGLU width
    # data (see qkv.lm.data.DataConfig)
    seq_len: int = 64
    copy_prob: float = 1.0
    rule_prob: float = 0.0
    min_span: int = 4
    max_span: int = 16
    # optimisation and bookkeeping: Schedule's (steps, batch_size, lr, warmup, min_lr_ratio,
    # weight_decay, clip, eval_every, save_every), at its defaults
    eval_size: int = 64  # validation sequences
    probe_size: int = 20  # repeated random sequences for the head scores

    RESUMABLE_CHANGES = Schedule.RESUMABLE_CHANGES | {"eval_size", "probe_size"}

    def __post_init__(self) -> None:
        for name, high in (("d_model", 1024), ("num_heads", 64), ("layers", 24), ("ff_dim", 4096),
                           ("seq_len", 1024), ("min_span", 1024), ("max_span", 1024)):
            check_int(name, getattr(self, name), low=1, high=high)
        check_int("seed", self.seed, low=0, high=2**63 - 1)
        super().__post_init__()
        check_int("eval_size", self.eval_size, low=1, high=10**5)
        check_int("probe_size", self.probe_size, low=1, high=1000)
        check_float("copy_prob", self.copy_prob, low=0.0, high=1.0)
        check_float("rule_prob", self.rule_prob, low=0.0, high=1.0)
        if self.d_model % self.num_heads or (self.d_model // self.num_heads) % 2:
            raise QkvError(f"--d-model ({self.d_model}) must be --num-heads ({self.num_heads}) × an "
                           f"even head size (RoPE rotates pairs)")
        if self.min_span > self.max_span or self.max_span > self.seq_len // 2:
            raise QkvError(f"need --min-span ({self.min_span}) <= --max-span ({self.max_span}) <= "
                           f"--seq-len / 2 ({self.seq_len // 2})")

    @classmethod
    def from_dict(cls, d: dict) -> "LMTrainConfig":
        return config_from_dict(cls, d)

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def data(self) -> DataConfig:
        return DataConfig(seq_len=self.seq_len, copy_prob=self.copy_prob, rule_prob=self.rule_prob,
                          min_span=self.min_span, max_span=self.max_span)

    @property
    def probe_length(self) -> int:
        """Length n of the probe's random half: the sequences are <bos> + 2n ≤ the model's length."""
        return min(25, self.seq_len // 2)

    def model_config(self) -> LlamaConfig:
        return LlamaConfig(vocab_size=VOCAB_SIZE, hidden_size=self.d_model,
                           intermediate_size=self.ff_dim, num_hidden_layers=self.layers,
                           num_attention_heads=self.num_heads,
                           max_position_embeddings=1 + self.seq_len, rms_norm_eps=1e-6,
                           bos_token_id=BOS_ID)


def lr_at(step: int, cfg: LMTrainConfig) -> float:
    return cfg.lr_at(step)


def loss_fn(model: LlamaModel, batch: LMBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean loss, per-position loss (b, t−1)) of predicting ``ids[:, 1:]`` from what precedes."""
    logits = model(batch.ids[:, :-1]).logits  # (b, t−1, V)
    per = F.cross_entropy(logits.transpose(1, 2), batch.ids[:, 1:], reduction="none")  # (b, t−1)
    return per.mean(), per


@dataclass(frozen=True)
class LMEval:
    """Validation numbers after a step.

    Fields:
        loss: mean next-word loss; copy_loss: on words predictable only by induction (the
        second and later words of a copied span); random_loss: on the others (best: ln 256 ≈ 5.55).
        induction, previous_token: (layers × heads) lists of scores (see qkv.explain.induction).
    """

    loss: float
    copy_loss: float | None  # None: the validation data has no such words
    random_loss: float | None
    induction: list[list[float]]
    previous_token: list[list[float]]

    @property
    def best_induction(self) -> tuple[int, int, float]:
        return max(((layer, head, s) for layer, row in enumerate(self.induction)
                    for head, s in enumerate(row)), key=lambda c: (c[2], -c[0], -c[1]))


@torch.no_grad()
def evaluate(model: LlamaModel, cfg: LMTrainConfig) -> LMEval:
    """Loss on the run's validation batch and every head's probe scores."""
    from qkv.explain.induction import induction_probe

    was_training = model.training
    model.eval()
    batch = valid_batch(cfg.data, batch_size=cfg.eval_size, seed=cfg.seed)
    loss, per = loss_fn(model, batch)
    copy = batch.predictable[:, 1:]
    scores = {probe: induction_probe(model, probe, sequences=cfg.probe_size,
                                     length=cfg.probe_length, seed=cfg.seed).scores.tolist()
              for probe in ("induction", "previous-token")}
    model.train(was_training)
    return LMEval(float(loss), _mean_or_none(per[copy]), _mean_or_none(per[~copy]),
                  scores["induction"], scores["previous-token"])


def _mean_or_none(losses: torch.Tensor) -> float | None:
    """The mean, or None when there is nothing to average (``--copy-prob 0``: no copied words;
    a NaN would be written into config.json, which strict JSON cannot hold)."""
    return float(losses.mean()) if losses.numel() else None


def _loss(x: float | None) -> str:
    return "n/a (none in the validation data)" if x is None else f"{x:.4f}"


# -- the checkpoint (Hugging Face Llama layout) --------------------------------------------------
_TO_HF = {qkv: hf for hf, qkv in LAYER_NAMES.items()}


def hf_tensors(model: LlamaModel) -> dict[str, torch.Tensor]:
    """The model's parameters under Hugging Face's names (``model.layers.0.mlp.up_proj.weight``)."""
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
    """config.json for Hugging Face (``LlamaForCausalLM``) and ``qkv.load``."""
    return {"model_type": "llama", "architectures": ["LlamaForCausalLM"],
            "vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
            "intermediate_size": config.intermediate_size,
            "num_hidden_layers": config.num_hidden_layers,
            "num_attention_heads": config.num_attention_heads,
            "num_key_value_heads": config.num_key_value_heads, "head_dim": config.head_dim,
            "max_position_embeddings": config.max_position_embeddings,
            "rms_norm_eps": config.rms_norm_eps, "rope_theta": config.rope_theta,
            "hidden_act": config.hidden_act, "attention_bias": False, "mlp_bias": False,
            "tie_word_embeddings": config.tie_word_embeddings, "bos_token_id": config.bos_token_id,
            "torch_dtype": "float32"}


def save_checkpoint(out: Path, model: LlamaModel, meta: dict, *, step: int,
                    optimizer: torch.optim.Optimizer | None) -> None:
    """Write the Hugging Face directory of ``model`` at ``step`` (+ the optimizer, for --resume)."""
    weights = f"model-{step:06d}.safetensors"
    tensors = hf_tensors(model)
    index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in tensors.values())},
             "weight_map": {name: weights for name in sorted(tensors)}}
    files = {"tokenizer.json": build_tokenizer().to_str(pretty=True).encode("utf-8"),
             weights: save_tensors_writer(tensors, metadata={"format": "pt"}),
             "model.safetensors.index.json": (json.dumps(index, indent=2) + "\n").encode("utf-8")}
    record = {**meta, "step": step, "weights": weights, "optimizer": None}
    if optimizer is not None:
        state, groups = optimizer_tensors(optimizer)
        name = f"optimizer-{step:06d}.safetensors"
        files[name] = save_tensors_writer(state)
        record["optimizer"] = {"file": name, "param_groups": groups}
    write_checkpoint(out, files, {**hf_config(model.config), "qkv_training": record}, kinds=KINDS)


def read_training(out: str | Path) -> dict:
    """The ``qkv_training`` section of a run's config.json, its fields type-checked."""
    out = Path(out)
    manifest = read_manifest(out)
    where = str(out / "config.json")
    if manifest.get("model_type") != "llama" or "qkv_training" not in manifest:
        raise QkvError(f"{out} is not a run of qkv train lm (its config.json has model_type "
                       f"{manifest.get('model_type')!r}"
                       + (" and no 'qkv_training' record" if manifest.get("model_type") == "llama" else "")
                       + "); --resume continues a directory that qkv train lm wrote")
    section = get_field(manifest, "qkv_training", dict, where)
    if section.get("format_version") != FORMAT_VERSION:
        raise QkvError(f"{where}: unsupported qkv_training format_version "
                       f"{section.get('format_version')!r} (this qkv reads {FORMAT_VERSION})")
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


def _from_hf(model: LlamaModel, tensors: dict[str, torch.Tensor], source: str) -> None:
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


def _tokenizer():
    from qkv.models.tokenizer import Tokenizer

    return Tokenizer(build_tokenizer(), name="lm")


def new_model(cfg: LMTrainConfig) -> LlamaModel:
    """The run's model, initialised from ``cfg.seed`` (GPT-2's init: N(0, 0.02), residual
    projections scaled by 1/√(2·layers))."""
    gen = torch.Generator().manual_seed(cfg.seed)
    model = LlamaModel(cfg.model_config(), tokenizer=_tokenizer(), name="lm")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                continue  # RMSNorm gains stay 1
            std = 0.02 / (2 * cfg.layers) ** 0.5 if name.endswith(("out_proj.weight", "down.weight")) else 0.02
            p.copy_(torch.randn(p.shape, generator=gen) * std)
    return model


# -- training -------------------------------------------------------------------------------------
def train(cfg: LMTrainConfig, out: str | Path, *, resume: bool = False, progress: bool = True,
          command: str | None = None, slim: bool = False, force: bool = False,
          callback: Callable[[TrainState], None] | None = None) -> TrainState:
    """Train (or, with ``resume``, continue) a model into directory ``out``.

    Same contract as :func:`qkv.translate.train.train`: ``callback(state)`` after every step (an
    exception from it stops the run like a kill), ``slim`` drops the optimizer state from the final
    checkpoint, a new run needs an empty ``out`` unless ``force``, and with ``resume`` ``force``
    accepts a different thread count (recorded as inexact).

    Raises:
        QkvError: a bad ``out``, a configuration that differs from the resumed run's.
        qkv.training.loop.NonFiniteLoss: the loss became NaN or infinite (nothing saved).
    """
    out = prepare_out_dir(out, resume=resume, force=force, kinds=KINDS)
    exact = True
    if resume:
        meta = read_training(out)
        diffs = changed_options(LMTrainConfig.from_dict(meta["train"]), cfg, LMTrainConfig.RESUMABLE_CHANGES)
        if diffs:
            raise QkvError(f"--resume: {out} was trained with a different configuration: {', '.join(diffs)}")
        exact = check_threads(meta, out, allow_inexact=force)
        if not isinstance(meta.get("optimizer"), dict):
            raise QkvError(f"{out}: the checkpoint has no optimizer state to resume from (it was "
                           f"saved with --slim)")
        start, history = meta["step"], list(meta["history"])
        elapsed_before = float(meta.get("train_seconds", 0.0))
        if start >= cfg.steps:
            raise QkvError(f"--resume: {out} is already at step {start} of --steps {cfg.steps}; "
                           f"raise --steps to train further")
    else:
        start, history, elapsed_before = 0, [], 0.0

    model = new_model(cfg)
    if resume:
        manifest = read_manifest(out)
        _from_hf(model, load_tensors(out, manifest, meta["weights"]), str(out))
        read_listed(out, manifest, "tokenizer.json", "tokenizer")  # listed and intact
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95),
                            weight_decay=cfg.weight_decay)
    if resume:
        load_optimizer_tensors(opt, load_tensors(out, manifest, meta["optimizer"]["file"], "optimizer"),
                               meta["optimizer"]["param_groups"], str(out))
    t0 = time.perf_counter()

    def step_loss(step: int) -> tuple[torch.Tensor, int]:
        batch = get_batch(cfg.data, batch_size=cfg.batch_size, seed=cfg.seed, step=step)
        return loss_fn(model, batch)[0], batch.num_tokens

    def evaluate_at(state: TrainState) -> tuple[LMEval, str]:
        ev = evaluate(model, cfg)
        layer, head, score = ev.best_induction
        history.append({"step": state.step, "seconds": round(elapsed_before + time.perf_counter() - t0, 1),
                        "train_loss": round(state.loss, 4), **asdict(ev)})
        prev = max(max(row) for row in ev.previous_token)
        return ev, (f"valid loss {ev.loss:.4f} (copied words {_loss(ev.copy_loss)}, random words "
                    f"{_loss(ev.random_loss)}); best induction head L{layer} H{head} {score:.3f}, "
                    f"best previous-token score {prev:.3f}")

    def save(done: int, last_eval: LMEval | None, final: bool) -> None:
        meta = {"format_version": FORMAT_VERSION, "train": cfg.to_dict(), "command": command,
                "history": history, "train_seconds": round(elapsed_before + time.perf_counter() - t0, 1),
                "threads": torch.get_num_threads(), "exact": exact,
                "induction_appeared_at": appeared_at(history),
                "parameters": sum(p.numel() for p in model.parameters())}
        save_checkpoint(out, model, meta, step=done, optimizer=None if (final and slim) else opt)

    model.train()
    plan = loop.LoopPlan(start=start, steps=cfg.steps, clip=cfg.clip, eval_every=cfg.eval_every,
                         save_every=cfg.save_every)
    with torch.random.fork_rng(devices=[]):
        state = loop.run_loop(plan, params=list(model.parameters()), optimizer=opt,
                              lr=lambda step: lr_at(step, cfg), step_loss=step_loss,
                              evaluate=evaluate_at, save=save, progress=progress, where=str(out),
                              callback=callback)
    model.eval()
    return state


def appeared_at(history: list[dict], threshold: float = APPEARED) -> int | None:
    """The first evaluated step at which some head's induction score reached ``threshold``."""
    for h in history:
        if max(max(row) for row in h["induction"]) >= threshold:
            return h["step"]
    return None


def print_summary(state: TrainState, out: Path, seconds: float, file=None) -> None:
    file = file or sys.stdout
    line = f"trained to step {state.step} in {seconds:.0f} s"
    ev = state.last_eval
    if isinstance(ev, LMEval):
        layer, head, score = ev.best_induction
        line += (f"; validation loss {ev.loss:.4f} (copied words {_loss(ev.copy_loss)}); best "
                 f"induction head L{layer} H{head} ({score:.3f})")
    print(f"{line}; checkpoint in {out}", file=file)
