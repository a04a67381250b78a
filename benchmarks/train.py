"""Training and decoding speed of qkv's translation model, against torch's own, in the same run.

Training: qkv's :class:`~qkv.translate.model.TranslationModel` against a model built on
``torch.nn.Transformer`` with the same sizes (post-norm, ReLU, same embeddings × √d, sinusoidal
positions, tied generator), the same batches (``get_batch`` of the grammar's training split), the
same loss (label-smoothed cross-entropy) and the same optimiser (AdamW, gradient clipping).
Steps are interleaved round by round (qkv then torch, the order flipped every round) so a noisy
neighbour slows both alike; the ratio is the median over rounds of the paired ratio
``torch_seconds / qkv_seconds`` (above 1: qkv trains faster).

Decoding: greedy decoding of test sentences with the decoder's KV cache against re-running the
decoder over the whole prefix at every step, same model, same outputs (checked).

    python benchmarks/train.py                  # default sizes (the shipped model's)
    python benchmarks/train.py --threads 1      # on a busy machine
    python benchmarks/train.py --rounds 10      # quicker
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
import warnings

import torch
from torch import nn

from qkv.translate.model import TranslationModel
from qkv.modules import SinusoidalPositionalEncoding
from qkv.translate.data import encode_pairs, get_batch, load_splits
from qkv.translate.decode import greedy_decode
from qkv.translate.train import TrainConfig, loss_fn
from qkv.translate.vocab import PAD_ID, Vocab


class TorchTranslation(nn.Module):
    """The same architecture on ``torch.nn.Transformer`` (masks: True = masked out, torch's way)."""

    def __init__(self, cfg):
        super().__init__()
        self.d = cfg.d_model
        self.src_embed = nn.Embedding(cfg.src_vocab_size, cfg.d_model)
        self.tgt_embed = nn.Embedding(cfg.tgt_vocab_size, cfg.d_model)
        self.positions = SinusoidalPositionalEncoding(cfg.d_model, cfg.max_len)
        self.transformer = nn.Transformer(
            d_model=cfg.d_model, nhead=cfg.num_heads, num_encoder_layers=cfg.encoder_layers,
            num_decoder_layers=cfg.decoder_layers, dim_feedforward=cfg.ff_dim, dropout=cfg.dropout,
            activation=cfg.activation, batch_first=True, norm_first=cfg.norm_first)
        if not cfg.norm_first:
            # Post-norm layers already end in a LayerNorm; nn.Transformer adds one per stack.
            self.transformer.encoder.norm = self.transformer.decoder.norm = None
        self.generator = nn.Linear(cfg.d_model, cfg.tgt_vocab_size, bias=False)
        self.generator.weight = self.tgt_embed.weight
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, src, tgt):
        s = self.dropout(self.positions(self.src_embed(src) * math.sqrt(self.d)))  # (b, s, E)
        t = self.dropout(self.positions(self.tgt_embed(tgt) * math.sqrt(self.d)))  # (b, t, E)
        causal = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1])  # (t, t) float
        pad = src == PAD_ID  # (b, s) True = masked out
        h = self.transformer(s, t, tgt_mask=causal, src_key_padding_mask=pad,
                             memory_key_padding_mask=pad, tgt_is_causal=True)
        return self.generator(h)


def optimiser(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.98), eps=1e-9,
                             weight_decay=cfg.weight_decay)


def train_step(model, opt, batch, cfg: TrainConfig) -> float:
    """One full training step; returns its wall time in seconds."""
    start = time.perf_counter()
    loss = loss_fn(model(batch.src, batch.tgt_in), batch.tgt_out, cfg.label_smoothing)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
    opt.step()
    return time.perf_counter() - start


def bench_training(cfg: TrainConfig, vocab: Vocab, corpus, rounds: int, steps_per_round: int):
    torch.manual_seed(0)
    mcfg = cfg.model_config(vocab)
    ours, theirs = TranslationModel(mcfg).train(), TorchTranslation(mcfg).train()
    n_ours = ours.num_parameters()
    n_theirs = sum(p.numel() for p in theirs.parameters())
    opts = {"qkv": optimiser(ours, cfg), "torch": optimiser(theirs, cfg)}
    models = {"qkv": ours, "torch": theirs}
    for name in models:  # warm-up: allocator, kernels
        for step in range(3):
            train_step(models[name], opts[name], get_batch(corpus, cfg.batch_size, 0, step), cfg)
    seconds = {"qkv": [], "torch": []}
    tokens, step = [], 0
    for r in range(rounds):
        batches = [get_batch(corpus, cfg.batch_size, 0, step + i) for i in range(steps_per_round)]
        step += steps_per_round
        tokens.append(sum(b.num_tokens for b in batches))
        order = ("qkv", "torch") if r % 2 == 0 else ("torch", "qkv")
        for name in order:
            seconds[name].append(sum(train_step(models[name], opts[name], b, cfg) for b in batches))
    ratio = statistics.median(t / q for q, t in zip(seconds["qkv"], seconds["torch"]))
    tok_s = {k: sum(tokens) / sum(v) for k, v in seconds.items()}
    return n_ours, n_theirs, tok_s, ratio


def bench_decoding(model: TranslationModel, vocab: Vocab, pairs, batch_size: int, repeats: int):
    ids = [vocab.en.encode(p.en, add_special_tokens=False).ids + [2] for p in pairs]
    from qkv.translate.data import pad

    batches = [pad(ids[i : i + batch_size]) for i in range(0, len(ids), batch_size)]
    out = {}
    outputs = {}
    for use_cache in (True, False):
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            gen = [greedy_decode(model, src, use_cache=use_cache) for src in batches]
            best = min(best, time.perf_counter() - start)
        produced = sum(int((g != PAD_ID).sum()) for g in gen)
        out[use_cache] = produced / best
        outputs[use_cache] = gen
    same = all(torch.equal(a, b) for a, b in zip(outputs[True], outputs[False]))
    return out, same


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--steps-per-round", type=int, default=3)
    ap.add_argument("--decode-sentences", type=int, default=256)
    ap.add_argument("--model", default="translate", help="checkpoint for the decoding benchmark")
    args = ap.parse_args()
    warnings.filterwarnings("ignore", message="enable_nested_tensor is True")
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = TrainConfig()
    splits = load_splits(cfg.data_seed)
    vocab = Vocab.train([p.en for p in splits.train], [p.fr for p in splits.train])
    corpus = encode_pairs(splits.train, vocab)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; model d_model={cfg.d_model}, "
          f"heads={cfg.num_heads}, layers={cfg.encoder_layers}+{cfg.decoder_layers}, "
          f"ff={cfg.ff_dim}, dropout={cfg.dropout}; batch {cfg.batch_size} sentences")

    n_ours, n_theirs, tok_s, ratio = bench_training(cfg, vocab, corpus, args.rounds,
                                                    args.steps_per_round)
    print(f"\ntraining ({args.rounds} rounds × {args.steps_per_round} steps each, interleaved)")
    print(f"  parameters: qkv {n_ours:,}, torch.nn.Transformer {n_theirs:,}")
    print(f"  qkv TranslationModel   {tok_s['qkv']:9,.0f} tokens/s")
    print(f"  torch.nn.Transformer   {tok_s['torch']:9,.0f} tokens/s")
    print(f"  qkv / torch speed: {ratio:.2f}× (median of paired rounds; > 1 = qkv faster)")

    from qkv.translate.checkpoint import load_checkpoint

    ckpt = load_checkpoint(args.model)
    pairs = splits.test[: args.decode_sentences]
    print(f"\ngreedy decoding of {len(pairs)} test sentences, model {ckpt.directory.name} "
          f"(step {ckpt.step}), best of 3")
    for bs in (1, 64):
        speeds, same = bench_decoding(ckpt.model, ckpt.vocab, pairs if bs > 1 else pairs[:64], bs, 3)
        print(f"  batch {bs:3d}: with KV cache {speeds[True]:8,.0f} tokens/s, without "
              f"{speeds[False]:8,.0f} tokens/s → {speeds[True] / speeds[False]:.2f}× "
              f"(same outputs: {same})")


if __name__ == "__main__":
    main()
