"""`qkv train lm`: a small Llama-architecture decoder learns text with repeated spans.

* `LMTrainConfig` — every knob, with commented defaults; `from_dict` rejects unknown keys
  and wrong types; values are bounded (`qkv.training.config`).
* `evaluate` — validation loss (all next words, and those predictable only by induction)
  and every head's induction and previous-token score (`qkv.explain.induction`).
* `train` — AdamW, warm-up + cosine, gradient clipping, the progress bar and checkpoints
  of the shared loop (`qkv.training.loop.run_loop`), `--resume` exact.

The checkpoint is a Hugging Face Llama directory, so `qkv.load(out)` runs it like any Llama
(its layout, the resume logic and the loop are `qkv.lm.run`'s, shared with `qkv train
reader`); `tokenizer.json` is the word-level tokenizer (`<bos>` put first).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from qkv.errors import QkvError
from qkv.lm.data import BOS_ID, VOCAB_SIZE, DataConfig, LMBatch, build_tokenizer, get_batch, valid_batch
from qkv.lm.run import DecoderRun, hf_config, hf_tensors, init_weights, print_run_summary, train_decoder
from qkv.lm.run import read_training as read_run
from qkv.models.llama import LlamaConfig, LlamaModel
from qkv.training.config import Schedule, option
from qkv.training.loop import TrainState

__all__ = ["LMTrainConfig", "LMEval", "appeared_at", "evaluate", "hf_config", "hf_tensors",
           "loss_fn", "lr_at", "new_model", "print_summary", "read_training", "train"]

FORMAT_VERSION = 1
MODEL_TYPES = ("llama",)
# An induction head "has appeared" once some head puts at least this much of its attention, on
# average, on the token after the current token's earlier occurrence (chance is ~0.04 here).
APPEARED = 0.5


@dataclass(frozen=True)
class LMTrainConfig(Schedule):
    """Everything an LM training run depends on. Defaults: the shipped model's run.

    Examples:
        >>> LMTrainConfig.from_dict({"steps": 10}).steps
        10
    """

    seed: int = option(0, "model initialisation and the training batches", low=0, high=2**63 - 1)
    # model (a Llama: RMSNorm, SwiGLU, RoPE); two layers are the fewest induction needs. Heads of
    # 32 dimensions: RoPE rotates the fast pairs of a head with its position, so only the slow
    # ones can match content; with 16-dimensional heads (64 wide, 4 heads) no induction head had
    # formed after 1,700 steps, with 32 one did within a few hundred (measured, same data).
    d_model: int = option(64, "width E of every token vector", low=1, high=1024)
    num_heads: int = option(2, "attention heads per layer", low=1, high=64)
    layers: int = option(2, "decoder layers (induction needs 2)", low=1, high=24)
    ff_dim: int = option(128, "SwiGLU width", low=1, high=4096)
    # data (see qkv.lm.data.DataConfig)
    seq_len: int = option(64, "words per training sequence (after <bos>)", low=1, high=1024)
    copy_prob: float = option(1.0, "chance, after each random word, that a copied span starts",
                              low=0.0, high=1.0)
    rule_prob: float = option(0.0, "chance that a word is the fixed rule's function of the word "
                                   "two back", low=0.0, high=1.0)
    min_span: int = option(4, "shortest copied span", low=1, high=1024)
    max_span: int = option(16, "longest copied span", low=1, high=1024)
    # optimisation and bookkeeping: Schedule's (steps, batch_size, lr, warmup, min_lr_ratio,
    # weight_decay, clip, eval_every, save_every), at its defaults
    eval_size: int = option(64, "validation sequences", low=1, high=10**5)
    probe_size: int = option(20, "repeated random sequences for the induction / previous-token "
                                 "scores", low=1, high=1000)

    RESUMABLE_CHANGES = Schedule.RESUMABLE_CHANGES | {"eval_size", "probe_size"}

    def __post_init__(self) -> None:
        super().__post_init__()  # every option against its bounds (training/config.py)
        if self.d_model % self.num_heads or (self.d_model // self.num_heads) % 2:
            raise QkvError(f"--d-model ({self.d_model}) must be --num-heads ({self.num_heads}) × an "
                           f"even head size (RoPE rotates pairs)")
        if self.min_span > self.max_span or self.max_span > self.seq_len // 2:
            raise QkvError(f"need --min-span ({self.min_span}) <= --max-span ({self.max_span}) <= "
                           f"--seq-len / 2 ({self.seq_len // 2})")

    @property
    def data(self) -> DataConfig:
        return DataConfig(seq_len=self.seq_len, copy_prob=self.copy_prob, rule_prob=self.rule_prob,
                          min_span=self.min_span, max_span=self.max_span)

    @property
    def probe_length(self) -> int:
        """Length n of the probe's random half: the sequences are `<bos>` + 2n ≤ the model's length."""
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
    """(mean loss, per-position loss (b, t−1)) of predicting `ids[:, 1:]` from what precedes."""
    logits = model(batch.ids[:, :-1]).logits  # (b, t−1, V)
    per = F.cross_entropy(logits.transpose(1, 2), batch.ids[:, 1:], reduction="none")  # (b, t−1)
    return per.mean(), per


@dataclass(frozen=True)
class LMEval:
    """Validation numbers after a step.

    Attributes:
        loss: mean next-word loss.
        copy_loss: on words predictable only by induction (the second and later words of a
            copied span).
        random_loss: on the others (best: ln 256 ≈ 5.55).
        induction: (layers × heads) lists of scores (see `qkv.explain.induction`).
        previous_token: likewise, the previous-token scores.
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
    from qkv.explain.probes.induction import induction_probe

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
    """The mean, or None when there is nothing to average (`--copy-prob 0`: no copied words;
    a NaN would be written into config.json, which strict JSON cannot hold)."""
    return float(losses.mean()) if losses.numel() else None


def _loss(x: float | None) -> str:
    return "n/a (none in the validation data)" if x is None else f"{x:.4f}"


def read_training(out: str | Path) -> dict:
    """The `qkv_training` section of a run's config.json, its fields type-checked."""
    return read_run(out, command="lm", format_version=FORMAT_VERSION, model_types=MODEL_TYPES)


def _tokenizer():
    from qkv.models.tokenizer import Tokenizer

    return Tokenizer(build_tokenizer(), name="lm")


def new_model(cfg: LMTrainConfig) -> LlamaModel:
    """The run's model, initialised from `cfg.seed` (`qkv.lm.run.init_weights`)."""
    return init_weights(LlamaModel(cfg.model_config(), tokenizer=_tokenizer(), name="lm"), cfg.seed)


# -- training -------------------------------------------------------------------------------------
def train(cfg: LMTrainConfig, out: str | Path, *, resume: bool = False, progress: bool = True,
          command: str | None = None, slim: bool = False, force: bool = False,
          callback: Callable[[TrainState], None] | None = None) -> TrainState:
    """Train (or, with `resume`, continue) a model into directory `out`.

    The contract is `qkv.lm.run.train_decoder`'s (as `qkv.translate.train.train`'s):
    `callback(state)` after every step (an exception from it stops the run like a kill),
    `slim` drops the optimizer state from the final checkpoint, a new run needs an empty
    `out` unless `force`, and with `resume` `force` accepts a different thread count
    (recorded as inexact).

    Raises:
        QkvError: a bad `out`, a configuration that differs from the resumed run's.
        qkv.training.loop.NonFiniteLoss: the loss became NaN or infinite (nothing saved).
    """
    def step_loss(model: LlamaModel, step: int) -> tuple[torch.Tensor, int]:
        batch = get_batch(cfg.data, batch_size=cfg.batch_size, seed=cfg.seed, step=step)
        return loss_fn(model, batch)[0], batch.num_tokens

    def evaluate_at(model: LlamaModel) -> tuple[LMEval, dict, str]:
        ev = evaluate(model, cfg)
        layer, head, score = ev.best_induction
        prev = max(max(row) for row in ev.previous_token)
        return ev, asdict(ev), (f"valid loss {ev.loss:.4f} (copied words {_loss(ev.copy_loss)}, "
                                f"random words {_loss(ev.random_loss)}); best induction head "
                                f"L{layer} H{head} {score:.3f}, best previous-token score {prev:.3f}")

    run = DecoderRun(command="lm", format_version=FORMAT_VERSION, model_types=MODEL_TYPES,
                     config_class=LMTrainConfig,
                     tokenizer_json=build_tokenizer().to_str(pretty=True).encode("utf-8"),
                     new_model=new_model, step_loss=step_loss, evaluate=evaluate_at,
                     record=lambda model, history, final: {"induction_appeared_at": appeared_at(history)})
    state, _ = train_decoder(run, cfg, out, resume=resume, progress=progress, command=command,
                             slim=slim, force=force, callback=callback)
    return state


def appeared_at(history: list[dict], threshold: float = APPEARED) -> int | None:
    """The first evaluated step at which some head's induction score reached `threshold`."""
    for h in history:
        if max(max(row) for row in h["induction"]) >= threshold:
            return h["step"]
    return None


def print_summary(state: TrainState, out: Path, seconds: float, file=None) -> None:
    ev, details = state.last_eval, []
    if isinstance(ev, LMEval):
        layer, head, score = ev.best_induction
        details.append(f"validation loss {ev.loss:.4f} (copied words {_loss(ev.copy_loss)}); best "
                       f"induction head L{layer} H{head} ({score:.3f})")
    print_run_summary(state, out, seconds, details, file)
