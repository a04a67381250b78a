"""Training the translation model: plain, importable functions around one loop.

* `TrainConfig` — every knob, with commented defaults; `from_dict` rejects unknown keys.
* `lr_at` — the learning rate of a step: linear warm-up, then cosine decay.
* `get_batch` (in `qkv.translate.data`) — batch `step` as a pure function of
  (seed, step), so `--resume` replays exactly the batches an uninterrupted run would see.
* `evaluate` — validation loss, token accuracy and greedy exact match.
* `train` — AdamW, label smoothing, gradient clipping, a progress bar, periodic evaluation
  and atomic checkpoints: the loop is `qkv.training.loop.run_loop`, shared with
  `qkv train lm`; the files are written by `qkv.training.checkpoint`.

Dropout is made a pure function of (seed, step) too: the global RNG is re-seeded from them at
every step (inside `torch.random.fork_rng`, so the caller's RNG is left as it was). Resuming at
step k therefore gives the same parameters as never having stopped.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from qkv.errors import QkvError
from qkv.translate.model import TranslationConfig, TranslationModel
from qkv.training import loop
from qkv.training.checkpoint import prepare_out_dir
from qkv.training.config import (
    Schedule, changed_options, check_threads, option,
)
from qkv.training.loop import TrainState
from qkv.translate.checkpoint import (
    KINDS, load_checkpoint, load_optimizer_tensors, read_meta, save_checkpoint,
)
from qkv.translate.data import EncodedCorpus, encode_pairs, get_batch, iter_batches, load_splits
from qkv.translate.decode import greedy_decode
from qkv.translate.vocab import PAD_ID, Vocab


@dataclass(frozen=True)
class TrainConfig(Schedule):
    """Everything a training run depends on. Defaults: the shipped model's run.

    Examples:
        >>> TrainConfig.from_dict({"steps": 10, "d_model": 32}).steps
        10
        >>> TrainConfig.from_dict({"stpes": 10})
        Traceback (most recent call last):
        ...
        qkv.errors.QkvError: unknown training option 'stpes' (known: batch_size, ...)
    """

    # data and randomness
    seed: int = option(0, "model initialisation, batch order and dropout", low=0, high=2**63 - 1)
    data_seed: int = option(0, "the grammar's splits", low=0, high=2**31 - 1)  # make_splits(seed=)
    # model (see TranslationConfig). Bounds: what a CPU run of this toy model can do, so a typo
    # (--d-model 1000000) is refused at once instead of failing minutes later.
    d_model: int = option(128, "width E of every token vector", low=1, high=2048)
    num_heads: int = option(4, "attention heads per layer", low=1, high=64)
    encoder_layers: int = option(3, "encoder layers", low=1, high=48)
    decoder_layers: int = option(3, "decoder layers", low=1, high=48)
    ff_dim: int = option(256, "hidden width of the feed-forward blocks", low=1, high=8192)
    # No dropout: the grammar is noise-free, held-out combinations are translated perfectly
    # without it (measured), and on CPU its random masks cost ~40% of a step.
    dropout: float = option(0.0, "dropout everywhere", low=0.0, high=1.0, high_open=True)
    norm_first: bool = option(False, "pre-norm layers instead of the paper's post-norm")
    # optimisation and bookkeeping: Schedule's fields; these defaults differ from its
    steps: int = 1200
    batch_size: int = 64  # sentences per step
    lr: float = 1e-3
    min_lr_ratio: float = 0.05
    eval_every: int = 200
    save_every: int = 200
    label_smoothing: float = option(0.1, "label smoothing of the cross-entropy", low=0.0, high=1.0,
                                    high_open=True)
    eval_size: int = option(500, "validation sentences decoded for exact match", low=0, high=10**6)

    RESUMABLE_CHANGES = Schedule.RESUMABLE_CHANGES | {"eval_size"}

    def __post_init__(self) -> None:
        super().__post_init__()  # every option against its bounds (training/config.py)
        if self.d_model % self.num_heads:
            raise QkvError(f"--d-model ({self.d_model}) must be divisible by --num-heads ({self.num_heads})")

    def model_config(self, vocab: Vocab) -> TranslationConfig:
        return TranslationConfig(
            src_vocab_size=vocab.src_size, tgt_vocab_size=vocab.tgt_size, d_model=self.d_model,
            num_heads=self.num_heads, encoder_layers=self.encoder_layers,
            decoder_layers=self.decoder_layers, ff_dim=self.ff_dim, dropout=self.dropout,
            norm_first=self.norm_first)


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate for (0-based) `step`: linear warm-up to `lr`, cosine down to `lr·min_lr_ratio`.

    Examples:
        >>> cfg = TrainConfig(steps=1000, warmup=100, lr=1e-3)
        >>> lr_at(49, cfg), lr_at(99, cfg), round(lr_at(999, cfg), 6)
        (0.0005, 0.001, 5e-05)
    """
    return cfg.lr_at(step)


def loss_fn(logits: torch.Tensor, target: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
    """Mean cross-entropy over the real (non-[PAD]) target tokens. logits (b, t, V), target (b, t)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1),
                           ignore_index=PAD_ID, label_smoothing=label_smoothing)


@dataclass(frozen=True)
class EvalResult:
    """Validation numbers: loss and token accuracy (teacher-forced), exact match (greedy)."""

    loss: float
    token_accuracy: float
    exact_match: float
    sentences: int


@torch.no_grad()
def evaluate(model: TranslationModel, corpus: EncodedCorpus, *, exact_size: int | None = None,
             batch_size: int = 250) -> EvalResult:
    """Loss and token accuracy on all of `corpus`; exact match on its first `exact_size` pairs."""
    was_training = model.training
    model.eval()
    loss_sum, correct, count = 0.0, 0, 0
    for batch in iter_batches(corpus, batch_size):
        logits = model(batch.src, batch.tgt_in)  # (b, t, V)
        real = batch.tgt_out != PAD_ID
        n = int(real.sum())
        loss_sum += float(loss_fn(logits, batch.tgt_out)) * n
        correct += int(((logits.argmax(-1) == batch.tgt_out) & real).sum())
        count += n
    exact_size = len(corpus) if exact_size is None else min(exact_size, len(corpus))
    hits = 0
    for start in range(0, exact_size, batch_size):
        index = torch.arange(start, min(start + batch_size, exact_size))
        batch = corpus.batch(index)
        gen = greedy_decode(model, batch.src)  # (b, n) ending in [EOS]
        hits += sum(_same(g, t) for g, t in zip(gen, batch.tgt_out))
    model.train(was_training)
    return EvalResult(loss_sum / max(count, 1), correct / max(count, 1),
                      hits / max(exact_size, 1), exact_size)


def _same(generated: torch.Tensor, target: torch.Tensor) -> bool:
    """Equal up to and including [EOS] (both are [PAD]-filled after it)."""
    n = max(len(generated), len(target))
    g = F.pad(generated, (0, n - len(generated)), value=PAD_ID)
    t = F.pad(target, (0, n - len(target)), value=PAD_ID)
    return bool((g == t).all())


def _check_resume(saved: dict, cfg: TrainConfig, out: Path) -> None:
    old = TrainConfig.from_dict(saved)
    diffs = changed_options(old, cfg, TrainConfig.RESUMABLE_CHANGES)
    if diffs:
        raise QkvError(f"--resume: {out} was trained with a different configuration: {', '.join(diffs)}")


def train(cfg: TrainConfig, out: str | Path, *, resume: bool = False, progress: bool = True,
          command: str | None = None, slim: bool = False, force: bool = False,
          callback: Callable[[TrainState], None] | None = None) -> TrainState:
    """Train (or, with `resume`, continue training) a model into directory `out`.

    `callback(state)` runs after every step; an exception it raises stops the run like a kill
    would, leaving the newest checkpoint in `out` intact. `slim` drops the optimizer state
    from the final checkpoint (for shipping; such a checkpoint cannot be resumed). A new run
    needs an empty (or missing) `out` unless `force`; with `resume`, `force` accepts a
    different thread count (the run is then recorded as inexact).

    Raises:
        QkvError: a bad `out`, a configuration that differs from the resumed run's.
        qkv.training.loop.NonFiniteLoss: the loss became NaN or infinite (nothing saved).
    """
    out = prepare_out_dir(out, resume=resume, force=force, kinds=KINDS)
    with torch.random.fork_rng(devices=[]):
        return _train(cfg, out, resume=resume, progress=progress, command=command, slim=slim,
                      force=force, callback=callback)


def _train(cfg, out: Path, *, resume, progress, command, slim, force, callback) -> TrainState:
    # 1) data and vocabularies (a resumed run keeps the vocabularies it started with)
    splits = load_splits(cfg.data_seed)
    exact = True
    if resume:
        meta = read_meta(out)
        _check_resume(meta.get("train", {}), cfg, out)
        exact = check_threads(meta, out, allow_inexact=force)
        ckpt = load_checkpoint(out, with_optimizer=True)
        vocab, start, history = ckpt.vocab, ckpt.step, list(meta.get("history", []))
        elapsed_before = float(meta.get("train_seconds", 0.0))
    else:
        vocab = Vocab.train([p.en for p in splits.train], [p.fr for p in splits.train])
        start, history, elapsed_before = 0, [], 0.0
    train_set, valid_set = encode_pairs(splits.train, vocab), encode_pairs(splits.valid, vocab)

    # 2) model and optimiser
    if resume:
        model = ckpt.model
    else:
        torch.manual_seed(cfg.seed)
        model = TranslationModel(cfg.model_config(vocab))
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.98), eps=1e-9,
                            weight_decay=cfg.weight_decay)
    if resume:
        load_optimizer_tensors(opt, ckpt.optimizer_tensors, meta["optimizer"]["param_groups"], str(out))
        if start >= cfg.steps:
            raise QkvError(f"--resume: {out} is already at step {start} of --steps {cfg.steps}; "
                           f"raise --steps to train further")

    # 3) the loop: batches, evaluation and checkpoints of this model
    t0 = time.perf_counter()

    def step_loss(step: int) -> tuple[torch.Tensor, int]:
        torch.manual_seed(cfg.seed * 1_000_003 + step + 1)  # dropout: a function of (seed, step)
        batch = get_batch(train_set, cfg.batch_size, cfg.seed, step)
        loss = loss_fn(model(batch.src, batch.tgt_in), batch.tgt_out, cfg.label_smoothing)
        return loss, batch.num_tokens

    def evaluate_at(state: TrainState) -> tuple[EvalResult, str]:
        ev = evaluate(model, valid_set, exact_size=cfg.eval_size)
        history.append({"step": state.step, "seconds": round(elapsed_before + time.perf_counter() - t0, 1),
                        "train_loss": round(state.loss, 4), **asdict(ev)})
        return ev, (f"valid loss {ev.loss:.4f}, token acc {ev.token_accuracy:.4f}, exact match "
                    f"{ev.exact_match:.4f} ({ev.sentences} sentences)")

    def save(done: int, last_eval: EvalResult | None, final: bool) -> None:
        meta = {"train": cfg.to_dict(), "command": command, "history": history,
                "train_seconds": round(elapsed_before + time.perf_counter() - t0, 1),
                "metrics": asdict(last_eval) if last_eval else None,
                "parameters": model.num_parameters(), "threads": torch.get_num_threads(),
                "exact": exact}
        save_checkpoint(out, model, vocab, meta, step=done,
                        optimizer=None if (final and slim) else opt)

    model.train()
    plan = loop.LoopPlan(start=start, steps=cfg.steps, clip=cfg.clip, eval_every=cfg.eval_every,
                         save_every=cfg.save_every)
    state = loop.run_loop(plan, params=model.parameters(), optimizer=opt,
                          lr=lambda step: lr_at(step, cfg), step_loss=step_loss,
                          evaluate=evaluate_at, save=save, progress=progress, where=str(out),
                          callback=callback)
    model.eval()
    return state
