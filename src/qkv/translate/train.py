"""Training the translation model: plain, importable functions around one loop.

* :class:`TrainConfig` — every knob, with commented defaults; ``from_dict`` rejects unknown keys.
* :func:`lr_at` — the learning rate of a step: linear warm-up, then cosine decay.
* :func:`get_batch` (in :mod:`qkv.translate.data`) — batch ``step`` as a pure function of
  (seed, step), so ``--resume`` replays exactly the batches an uninterrupted run would see.
* :func:`evaluate` — validation loss, token accuracy and greedy exact match.
* :func:`train` — AdamW, label smoothing, gradient clipping, a progress bar, periodic evaluation
  and atomic checkpoints.

Dropout is made a pure function of (seed, step) too: the global RNG is re-seeded from them at
every step (inside ``torch.random.fork_rng``, so the caller's RNG is left as it was). Resuming at
step k therefore gives the same parameters as never having stopped.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from qkv.errors import QkvError
from qkv.models.translation import TranslationConfig, TranslationModel
from qkv.translate.checkpoint import (
    load_checkpoint, load_optimizer_tensors, read_meta, save_checkpoint,
)
from qkv.translate.data import EncodedCorpus, encode_pairs, get_batch, iter_batches, load_splits
from qkv.translate.decode import greedy_decode
from qkv.translate.vocab import PAD_ID, Vocab


@dataclass(frozen=True)
class TrainConfig:
    """Everything a training run depends on. Defaults: the shipped model's run.

    Example:
        >>> TrainConfig.from_dict({"steps": 10, "d_model": 32}).steps
        10
        >>> TrainConfig.from_dict({"stpes": 10})
        Traceback (most recent call last):
        ...
        qkv.errors.QkvError: unknown training option 'stpes' (known: batch_size, ...)
    """

    # data and randomness
    seed: int = 0  # model init, batch order and dropout
    data_seed: int = 0  # the grammar's splits (make_splits(seed=data_seed))
    # model (see TranslationConfig)
    d_model: int = 128
    num_heads: int = 4
    encoder_layers: int = 3
    decoder_layers: int = 3
    ff_dim: int = 256
    # No dropout: the grammar is noise-free, held-out combinations are translated perfectly
    # without it (measured), and on CPU its random masks cost ~40% of a step.
    dropout: float = 0.0
    norm_first: bool = False
    # optimisation
    steps: int = 1200
    batch_size: int = 64  # sentences per step
    lr: float = 1e-3  # peak learning rate, reached after `warmup` steps
    warmup: int = 100
    min_lr_ratio: float = 0.05  # cosine decay ends at lr · min_lr_ratio on the last step
    weight_decay: float = 0.01
    label_smoothing: float = 0.1
    clip: float = 1.0  # max global gradient norm
    # bookkeeping
    eval_every: int = 200  # steps between validation passes (0: only at the end)
    save_every: int = 200  # steps between checkpoints (the last step is always saved)
    eval_size: int = 500  # validation sentences decoded for exact match during training

    # Options that may change when resuming: they do not affect the parameters' trajectory
    # up to the step where the first run stopped.
    RESUMABLE_CHANGES = frozenset({"steps", "eval_every", "save_every", "eval_size"})

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "d_model", "num_heads", "encoder_layers",
                     "decoder_layers", "ff_dim"):
            if getattr(self, name) <= 0:
                raise QkvError(f"--{name.replace('_', '-')} must be positive, got {getattr(self, name)}")
        for name in ("warmup", "eval_every", "save_every", "eval_size"):
            if getattr(self, name) < 0:
                raise QkvError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(self, name)}")
        if self.lr <= 0 or self.clip <= 0:
            raise QkvError(f"--lr ({self.lr}) and --clip ({self.clip}) must be positive")
        if not 0.0 <= self.label_smoothing < 1.0 or not 0.0 <= self.dropout < 1.0:
            raise QkvError(f"--label-smoothing ({self.label_smoothing}) and --dropout "
                           f"({self.dropout}) must be in [0, 1)")
        if self.d_model % self.num_heads:
            raise QkvError(f"--d-model ({self.d_model}) must be divisible by --num-heads ({self.num_heads})")

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        known = sorted(f.name for f in fields(cls))
        for key in d:
            if key not in known:
                raise QkvError(f"unknown training option {key!r} (known: {', '.join(known)})")
        return cls(**d)

    def to_dict(self) -> dict:
        return asdict(self)

    def model_config(self, vocab: Vocab) -> TranslationConfig:
        return TranslationConfig(
            src_vocab_size=vocab.src_size, tgt_vocab_size=vocab.tgt_size, d_model=self.d_model,
            num_heads=self.num_heads, encoder_layers=self.encoder_layers,
            decoder_layers=self.decoder_layers, ff_dim=self.ff_dim, dropout=self.dropout,
            norm_first=self.norm_first)


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate for (0-based) ``step``: linear warm-up to ``lr``, cosine down to ``lr·min_lr_ratio``.

    >>> cfg = TrainConfig(steps=1000, warmup=100, lr=1e-3)
    >>> lr_at(49, cfg), lr_at(99, cfg), round(lr_at(999, cfg), 6)
    (0.0005, 0.001, 5e-05)
    """
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    span = max(cfg.steps - 1 - cfg.warmup, 1)
    progress = min((step - cfg.warmup) / span, 1.0)
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + (cfg.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


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
    """Loss and token accuracy on all of ``corpus``; exact match on its first ``exact_size`` pairs."""
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


@dataclass
class TrainState:
    """What :func:`train` hands to its ``callback`` after every step (and returns at the end)."""

    step: int  # steps done
    loss: float  # this step's training loss
    tokens: int  # tokens processed in this session
    elapsed: float  # seconds of this session
    last_eval: EvalResult | None = None
    last_saved: int | None = None  # step of the newest checkpoint on disk


def _check_resume(saved: dict, cfg: TrainConfig, out: Path) -> None:
    old = TrainConfig.from_dict(saved)
    diffs = [f"{k}={getattr(old, k)!r} (now {getattr(cfg, k)!r})" for k in old.to_dict()
             if k not in TrainConfig.RESUMABLE_CHANGES and getattr(old, k) != getattr(cfg, k)]
    if diffs:
        raise QkvError(f"--resume: {out} was trained with a different configuration: {', '.join(diffs)}")


def train(cfg: TrainConfig, out: str | Path, *, resume: bool = False, progress: bool = True,
          command: str | None = None, slim: bool = False,
          callback: Callable[[TrainState], None] | None = None) -> TrainState:
    """Train (or, with ``resume``, continue training) a model into directory ``out``.

    ``callback(state)`` runs after every step; an exception it raises stops the run like a kill
    would, leaving the newest checkpoint in ``out`` intact. ``slim`` drops the optimizer state
    from the final checkpoint (for shipping; such a checkpoint cannot be resumed).
    """
    out = Path(out)
    with torch.random.fork_rng(devices=[]):
        return _train(cfg, out, resume=resume, progress=progress, command=command, slim=slim,
                      callback=callback)


def _train(cfg, out: Path, *, resume, progress, command, slim, callback) -> TrainState:
    from tqdm.auto import tqdm

    # 1) data and vocabularies (a resumed run keeps the vocabularies it started with)
    splits = load_splits(cfg.data_seed)
    if resume:
        if not (out / "config.json").is_file():
            raise QkvError(f"--resume: {out} holds no checkpoint to continue")
        meta = read_meta(out)
        _check_resume(meta.get("train", {}), cfg, out)
        ckpt = load_checkpoint(out, with_optimizer=True)
        vocab, start, history = ckpt.vocab, ckpt.step, list(meta.get("history", []))
        elapsed_before = float(meta.get("train_seconds", 0.0))
    else:
        if (out / "config.json").exists():
            raise QkvError(f"{out} already holds a checkpoint; pass --resume to continue it or "
                           f"choose another --out")
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

    def save(step: int, last_eval: EvalResult | None, final: bool) -> None:
        meta = {"train": cfg.to_dict(), "command": command, "history": history,
                "train_seconds": round(elapsed_before + time.perf_counter() - t0, 1),
                "metrics": asdict(last_eval) if last_eval else None,
                "parameters": model.num_parameters()}
        save_checkpoint(out, model, vocab, meta, step=step,
                        optimizer=None if (final and slim) else opt)

    # 3) the loop
    model.train()
    state = TrainState(step=start, loss=float("nan"), tokens=0, elapsed=0.0, last_saved=start or None)
    t0 = time.perf_counter()
    bar = tqdm(total=cfg.steps, initial=start, disable=not progress, unit="step", dynamic_ncols=True)
    try:
        for step in range(start, cfg.steps):
            torch.manual_seed(cfg.seed * 1_000_003 + step + 1)  # dropout: a function of (seed, step)
            batch = get_batch(train_set, cfg.batch_size, cfg.seed, step)
            for group in opt.param_groups:
                group["lr"] = lr_at(step, cfg)
            loss = loss_fn(model(batch.src, batch.tgt_in), batch.tgt_out, cfg.label_smoothing)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
            opt.step()

            done = step + 1
            state.step, state.loss = done, loss.item()
            state.tokens += batch.num_tokens
            state.elapsed = time.perf_counter() - t0
            bar.update(1)
            bar.set_postfix(loss=f"{state.loss:.3f}", tok_s=f"{state.tokens / state.elapsed:,.0f}",
                            refresh=False)
            last = done == cfg.steps
            if last or (cfg.eval_every and done % cfg.eval_every == 0):
                state.last_eval = evaluate(model, valid_set, exact_size=cfg.eval_size)
                history.append({"step": done, "seconds": round(elapsed_before + state.elapsed, 1),
                                "train_loss": round(state.loss, 4), **asdict(state.last_eval)})
                bar.write(file=sys.stderr, s=f"step {done}: valid loss {state.last_eval.loss:.4f}, token acc "
                          f"{state.last_eval.token_accuracy:.4f}, exact match "
                          f"{state.last_eval.exact_match:.4f} ({state.last_eval.sentences} sentences)")
            if last or (cfg.save_every and done % cfg.save_every == 0):
                save(done, state.last_eval, final=last)
                state.last_saved = done
            if callback is not None:
                callback(state)
    except KeyboardInterrupt:
        bar.write(file=sys.stderr, s=f"interrupted after step {state.step}; {out} holds the checkpoint of step "
                  f"{state.last_saved} — continue with --resume")
        raise
    finally:
        bar.close()
    model.eval()
    return state

