"""`qkv train reader`: a small Mistral-style decoder (Llama with a sliding window and RoPE) learns
English from the Python documentation.

* `ReaderTrainConfig` — every knob, with commented defaults (the shipped reader's run).
* `prepare` — corpus → byte-level BPE tokenizer → token ids (`qkv.reader.corpus`,
  `qkv.reader.data`).
* `evaluate` — loss on held-out windows, and every head's induction and previous-token score.
* `heldout_report` — the held-out pages read whole (each one forward, the window makes it
  O(N)) against a unigram model of the training text, in nats per token.
* `train` — the decoder loop shared with `qkv train lm` (`qkv.lm.run.train_decoder`).

Why a window: every layer attends to at most `window` keys, so a forward costs O(N·window) and
the model reads a text of any length the way it read its training windows (RoPE is relative:
past the window a token sees exactly what it saw in training). Information still travels
further through the layers (up to `layers × (window − 1)` tokens back).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from qkv.errors import QkvError
from qkv.lm.run import DecoderRun, init_weights, print_run_summary, read_training as read_run, train_decoder
from qkv.models.llama import LlamaConfig, LlamaModel
from qkv.reader.corpus import DEFAULT_DIR, read_corpus
from qkv.reader.data import (
    BOS_ID, MIN_VOCAB, BatchConfig, ReaderBatch, TokenStream, get_batch, heldout_windows, train_tokenizer,
    unigram_loss,
)
from qkv.training.config import Schedule, option
from qkv.training.loop import TrainState

FORMAT_VERSION = 1
MODEL_TYPES = ("mistral",)
PROBE_LENGTH = 25  # the probes' repeated half: well inside the window


@dataclass(frozen=True)
class ReaderTrainConfig(Schedule):
    """Everything a reader training run depends on. Defaults: the shipped reader's run.

    Examples:
        >>> ReaderTrainConfig.from_dict({"steps": 10}).window
        128
    """

    seed: int = option(0, "model initialisation and the training batches", low=0, high=2**63 - 1)
    corpus: str = option(DEFAULT_DIR, "directory of the Python documentation's HTML (apt-get "
                         "install python3.11-doc); its tutorial/ pages are held out")
    vocab_size: int = option(4096, "byte-level BPE tokens learned from the training pages, <bos> "
                             "included", low=MIN_VOCAB, high=65536)
    # model: a Mistral (Llama + sliding window): RMSNorm, SwiGLU, RoPE. Heads of 32 dimensions
    # (what let `qkv train lm`'s induction heads form, see qkv.lm.train).
    d_model: int = option(128, "width E of every token vector", low=1, high=1024)
    num_heads: int = option(4, "attention heads per layer", low=1, high=64)
    layers: int = option(4, "decoder layers", low=1, high=24)
    ff_dim: int = option(384, "SwiGLU width", low=1, high=4096)
    window: int = option(128, "sliding window: a token sees itself and the window − 1 tokens "
                         "before it", low=1, high=1 << 20)
    # Untied: measured on `qkv train lm`'s own data and model (800 steps), tying the output to the
    # embedding left the copies' loss at 2.46 nats with no induction head, untied it fell to 1.44
    # with one forming — a tied table is both what a head reads and what the output must name.
    tie_embeddings: bool = option(False, "logits read the embedding table (no output matrix)")
    # RoPE's angles grow with the position and float32 keeps fewer of their digits the larger
    # they are: at 131,072 the fastest pair's angle is still exact to 0.008 rad.
    max_positions: int = option(131072, "the most tokens a text may have", low=1, high=1 << 20)
    # data (qkv.reader.data.BatchConfig); seq_len > window, so training meets the window's edge
    seq_len: int = option(256, "tokens per English training window (after <bos>)", low=1, high=4096)
    # Induction heads form on copying sequences (qkv.training.copies) — and only on short ones
    # within this budget: measured (4 layers, untied, copies of 4-16 tokens from 256 ids, 2,048
    # tokens a step), sequences of 64 gave a previous-token head (layer 1, 0.93) by step 300 and
    # induction heads (layer 3, 0.48 and 0.62 on those ids) by step 700 in one run (another, with
    # other batches, had neither by step 600); the same copies in windows of 256 had not even
    # learned to copy a recent token by step 300 (5.3 nats on the copies, uniform 5.5). At initialisation a head attends evenly to what it sees, so the copied
    # token's share of its output — the first signal — is 1/length.
    copy_len: int = option(64, "tokens per copying sequence (after <bos>): random tokens in which "
                           "earlier spans are written again", low=2, high=4096)
    copy_prob: float = option(0.6, "the share of training windows given to copying sequences "
                              "(the rest are English)", low=0.0, high=1.0)
    copy_steps: int = option(1600, "the first this many steps, copies draw their tokens from "
                             "--copy-vocab's few ids; later ones from the whole vocabulary",
                             low=0, high=10**7)
    copy_vocab: int = option(257, "early copies' tokens are ids 1 … this − 1 (the 256 bytes; 0: "
                             "the whole vocabulary)", low=0, high=65536)
    min_span: int = option(4, "shortest copied span", low=1, high=4096)
    max_span: int = option(16, "longest copied span", low=1, high=4096)
    # optimisation and bookkeeping (Schedule's, some with other defaults)
    steps: int = 2200
    batch_size: int = 8
    lr: float = 3e-3
    warmup: int = 30
    eval_size: int = option(32, "held-out windows per evaluation", low=1, high=10**5)
    probe_size: int = option(20, "repeated random sequences for the induction / previous-token "
                             "scores", low=1, high=1000)

    RESUMABLE_CHANGES = Schedule.RESUMABLE_CHANGES | {"eval_size", "probe_size"}

    def __post_init__(self) -> None:
        super().__post_init__()  # every option() field against its bounds
        if self.d_model % self.num_heads or (self.d_model // self.num_heads) % 2:
            raise QkvError(f"--d-model ({self.d_model}) must be --num-heads ({self.num_heads}) × an "
                           f"even head size (RoPE rotates pairs)")
        if self.min_span > self.max_span or 2 * self.max_span > self.copy_len:  # ≥ 1 copy
            raise QkvError(f"need --min-span ({self.min_span}) <= --max-span ({self.max_span}) <= "
                           f"--copy-len / 2 ({self.copy_len // 2})")
        if self.copy_vocab == 1:  # ids 1 … 0: none to draw
            raise QkvError("--copy-vocab must be 0 (the whole vocabulary) or at least 2 (ids 1 … "
                           "copy-vocab − 1), got 1")
        if self.copy_len > min(self.seq_len, self.window):  # every copy within sight
            raise QkvError(f"--copy-len ({self.copy_len}) must be at most --seq-len ({self.seq_len}) "
                           f"and --window ({self.window})")
        if self.max_positions <= self.seq_len:
            raise QkvError(f"--max-positions ({self.max_positions}) must exceed --seq-len ({self.seq_len})")

    @property
    def batches(self) -> BatchConfig:
        return BatchConfig(seq_len=self.seq_len, copy_prob=self.copy_prob, min_span=self.min_span,
                           max_span=self.max_span, copy_len=self.copy_len,
                           copy_vocab=self.copy_vocab or None, copy_steps=self.copy_steps)

    def model_config(self, vocab_size: int) -> LlamaConfig:
        return LlamaConfig(vocab_size=vocab_size, hidden_size=self.d_model,
                           intermediate_size=self.ff_dim, num_hidden_layers=self.layers,
                           num_attention_heads=self.num_heads,
                           max_position_embeddings=self.max_positions, rms_norm_eps=1e-6,
                           sliding_window=self.window, tie_word_embeddings=self.tie_embeddings,
                           bos_token_id=BOS_ID)


@dataclass(frozen=True)
class Prepared:
    """A run's text: the tokenizer (`tokenizers.Tokenizer`), the ids and where they came from."""

    tokenizer: object
    stream: TokenStream
    source: dict


def prepare(cfg: ReaderTrainConfig) -> Prepared:
    """Read the corpus, learn the tokenizer from its training pages and encode every page."""
    corpus = read_corpus(cfg.corpus)
    tok = train_tokenizer(corpus.train, vocab_size=cfg.vocab_size)
    stream = TokenStream.of(tok, corpus.train, corpus.heldout)
    train_chars, held_chars = corpus.chars
    source = {**corpus.source, "train_chars": train_chars, "heldout_chars": held_chars,
              "train_tokens": len(stream.train), "heldout_tokens": sum(map(len, stream.heldout))}
    return Prepared(tok, stream, source)


def loss_fn(model: LlamaModel, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean loss, per-position loss (b, t−1)) of predicting `ids[:, 1:]` from what precedes."""
    logits = model(ids[:, :-1]).logits  # (b, t−1, V)
    per = F.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")  # (b, t−1)
    return per.mean(), per


def batch_loss(model: LlamaModel, batch: ReaderBatch) -> torch.Tensor:
    """Mean next-token loss over every token of the batch: its English windows and its copying
    sequences (two shapes, one forward each)."""
    total, count = 0.0, 0
    for ids in (batch.ids, batch.copies):
        if len(ids):
            _, per = loss_fn(model, ids)
            total, count = total + per.sum(), count + per.numel()
    return total / count


@dataclass(frozen=True)
class ReaderEval:
    """Validation numbers after a step.

    Attributes:
        loss: mean next-token loss (nats) on held-out windows (pages the model never trains on).
        induction: (layers × heads) lists of probe scores (qkv.explain.induction).
        previous_token: see `induction`.
    """

    loss: float
    induction: list[list[float]]
    previous_token: list[list[float]]

    @staticmethod
    def best(scores: list[list[float]]) -> tuple[int, int, float]:
        return max(((layer, head, s) for layer, row in enumerate(scores) for head, s in enumerate(row)),
                   key=lambda c: (c[2], -c[0], -c[1]))


@torch.no_grad()
def evaluate(model: LlamaModel, cfg: ReaderTrainConfig, windows: torch.Tensor) -> ReaderEval:
    """Loss on the held-out `windows` (b, 1 + seq_len) and every head's probe scores."""
    from qkv.explain.probes.induction import induction_probe

    was_training = model.training
    model.eval()
    loss, _ = loss_fn(model, windows)
    scores = {probe: induction_probe(model, probe, sequences=cfg.probe_size, length=PROBE_LENGTH,
                                     seed=cfg.seed).scores.tolist()
              for probe in ("induction", "previous-token")}
    model.train(was_training)
    return ReaderEval(float(loss), scores["induction"], scores["previous-token"])


@torch.no_grad()
def heldout_report(model: LlamaModel, stream: TokenStream) -> dict:
    """Nats per token on the held-out pages, each read whole after `<bos>` (one forward a
    page), and the unigram baseline on the same tokens."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for page in stream.heldout:
        ids = torch.cat([torch.tensor([BOS_ID]), page])[None]  # (1, 1 + n)
        _, per = loss_fn(model, ids)
        total, count = total + float(per.double().sum()), count + per.numel()
    model.train(was_training)
    return {"loss": total / count, "unigram_loss": unigram_loss(stream), "tokens": count,
            "pages": len(stream.heldout)}


def new_model(cfg: ReaderTrainConfig, tokenizer) -> LlamaModel:
    """The run's model, initialised from `cfg.seed` (`qkv.lm.run.init_weights`)."""
    from qkv.models.tokenizer import Tokenizer

    config = cfg.model_config(tokenizer.get_vocab_size())
    tok = Tokenizer(tokenizer, name="reader", max_length=config.max_length)
    return init_weights(LlamaModel(config, tokenizer=tok, name="reader"), cfg.seed)


def read_training(out: str | Path) -> dict:
    """The `qkv_training` section of a reader run's config.json, its fields type-checked."""
    return read_run(out, command="reader", format_version=FORMAT_VERSION, model_types=MODEL_TYPES)


def train(cfg: ReaderTrainConfig, out: str | Path, *, resume: bool = False, progress: bool = True,
          command: str | None = None, slim: bool = False, force: bool = False,
          callback: Callable[[TrainState], None] | None = None,
          prepared: Prepared | None = None) -> TrainState:
    """Train (or, with `resume`, continue) a reader into directory `out`.

    `prepared`: the corpus already read and tokenised (tests reuse one); None reads
    `cfg.corpus`. The contract is `qkv.lm.run.train_decoder`'s.
    """
    prepared = prepared or prepare(cfg)
    stream = prepared.stream
    windows = heldout_windows(stream, seq_len=cfg.seq_len, count=cfg.eval_size)

    def step_loss(model: LlamaModel, step: int) -> tuple[torch.Tensor, int]:
        batch: ReaderBatch = get_batch(stream, cfg.batches, batch_size=cfg.batch_size,
                                       seed=cfg.seed, step=step)
        return batch_loss(model, batch), batch.num_tokens

    def evaluate_at(model: LlamaModel) -> tuple[ReaderEval, dict, str]:
        ev = evaluate(model, cfg, windows)
        layer, head, score = ReaderEval.best(ev.induction)
        pl, ph, prev = ReaderEval.best(ev.previous_token)
        return ev, asdict(ev), (f"held-out loss {ev.loss:.4f}; best induction head L{layer} H{head} "
                                f"{score:.3f}, best previous-token head L{pl} H{ph} {prev:.3f}")

    def record(model: LlamaModel, history: list, final: bool) -> dict:
        extra = {"corpus": prepared.source}
        if final:
            extra["heldout"] = heldout_report(model, stream)
        return extra

    run = DecoderRun(command="reader", format_version=FORMAT_VERSION, model_types=MODEL_TYPES,
                     config_class=ReaderTrainConfig,
                     tokenizer_json=prepared.tokenizer.to_str(pretty=True).encode("utf-8"),
                     new_model=lambda c: new_model(c, prepared.tokenizer), step_loss=step_loss,
                     evaluate=evaluate_at, record=record)
    state, _ = train_decoder(run, cfg, out, resume=resume, progress=progress, command=command,
                             slim=slim, force=force, callback=callback)
    return state


def print_summary(state: TrainState, out: Path, seconds: float, file=None) -> None:
    ev, details = state.last_eval, []
    if isinstance(ev, ReaderEval):
        layer, head, score = ReaderEval.best(ev.induction)
        details.append(f"held-out loss {ev.loss:.4f}; best induction head L{layer} H{head} ({score:.3f})")
    record = read_training(out)
    if "heldout" in record:
        h = record["heldout"]
        details.append(f"held-out pages read whole: {h['loss']:.4f} nats/token (unigram "
                       f"{h['unigram_loss']:.4f})")
    print_run_summary(state, out, seconds, details, file)
