"""Exact match, BLEU and head alignment accuracy, each against an answer known independently:
by construction (hand-made strings and scores), by another library (sacrebleu on the same
strings), or by a plain recount (one sentence at a time, no padding)."""

from __future__ import annotations

import math

import pytest
import torch

from qkv.translate.model import TranslationConfig, TranslationModel
from qkv.translate.data import encode_pairs, iter_batches, load_splits
from qkv.translate.grammar import make_pair
from qkv.translate.metrics import AlignmentScores, bleu, exact_match, gold_matrix, head_alignment
from qkv.translate.vocab import Vocab

# BLEU oracles below are float64 formulas for numbers sacrebleu reaches another way (the exp of a
# mean of logs): each side is within a few roundings (~1e-15 relative) of the true value, so
# rel=1e-12 has 1000× headroom and still fails on any wrong n-gram count (≥ 1e-3 relative here).
BLEU_REL = 1e-12


def test_exact_match_counts_character_for_character_equality():
    hyps = ["le chat", "le chat ", "Le chat", "l'arbre", "l’arbre", "la pomme"]
    refs = ["le chat", "le chat", "le chat", "l'arbre", "l'arbre", "une pomme"]
    # equal by construction: 0 and 3; the others differ by a space, a capital, the apostrophe, a word.
    assert exact_match(hyps, refs) == 2 / 6  # int / int is correctly rounded: the same float
    assert exact_match(refs, refs) == 1.0
    assert math.isnan(exact_match([], []))
    with pytest.raises(ValueError, match="2 hypotheses for 1 references"):
        exact_match(["a", "b"], ["a"])


def test_bleu_of_hand_counted_ngrams():
    # 6 words, the last one wrong: n-gram matches 5/6, 4/5, 3/4, 2/3 and equal lengths (no brevity
    # penalty), so BLEU = 100 · (5/6 · 4/5 · 3/4 · 2/3)^(1/4) = 100 · (1/3)^(1/4).
    assert bleu(["a b c d e f"], ["a b c d e x"]) == pytest.approx(100 / 3 ** 0.25, rel=BLEU_REL)
    # Every n-gram right but 4 words for 6: brevity penalty exp(1 − 6/4).
    assert bleu(["a b c d"], ["a b c d e f"]) == pytest.approx(100 * math.exp(-0.5), rel=BLEU_REL)
    # Corpus BLEU adds the counts of all sentences before dividing: (5+4)/(6+4), (4+3)/(5+3), …
    corpus = (9 / 10 * 7 / 8 * 5 / 6 * 3 / 4) ** 0.25
    assert bleu(["a b c d e f", "g h i j"], ["a b c d e x", "g h i j"]) == pytest.approx(
        100 * corpus, rel=BLEU_REL)
    assert bleu(["le chat mange la pomme"], ["le chat mange la pomme"]) == pytest.approx(100, rel=BLEU_REL)
    assert math.isnan(bleu([], []))


def test_bleu_is_sacrebleus_corpus_score_on_the_same_strings():
    sacrebleu = pytest.importorskip("sacrebleu")
    hyps = ["le chat mange la pomme", "les chiens voient un arbre", "l'oiseau est rouge"]
    refs = ["le chat mange la pomme", "les chiens voient l'arbre", "l'oiseau est vert"]
    assert bleu(hyps, refs) == sacrebleu.corpus_bleu(hyps, [refs]).score  # one call, one float


def test_gold_matrix_marks_the_grammars_alignment():
    # English: 0 the 1 red 2 apple 3 is 4 next 5 to 6 the 7 black 8 cats (+ 9 [EOS])
    # French:  la pomme rouge est à côté des chats noirs — "des" is "to" + "the" fused.
    pair = make_pair("the red apple is next to the black cats")
    expected = torch.zeros(9, 10, dtype=torch.bool)
    for fr, en in [(0, 0), (1, 2), (2, 1), (3, 3), (4, 4), (5, 4), (6, 5), (6, 6), (7, 8), (8, 7)]:
        expected[fr, en] = True
    assert torch.equal(gold_matrix(pair, 10), expected)


def test_best_head_of_hand_made_scores():
    scores = AlignmentScores(torch.tensor([[0.25, 0.50, 0.10],
                                           [0.75, 0.05, 0.60]]), tokens=4)
    assert scores.best() == (1, 0, 0.75)
    tie = AlignmentScores(torch.tensor([[0.5, 0.25], [0.5, 0.5]]), tokens=4)
    assert tie.best() == (0, 0, 0.5)  # ties go to the lowest layer, then the lowest head


def test_head_alignment_counts_argmax_hits_by_hand():
    splits = load_splits(0)
    pairs = splits.valid[:40]
    vocab = Vocab.train([p.en for p in splits.train], [p.fr for p in splits.train])
    torch.manual_seed(0)
    model = TranslationModel(TranslationConfig(vocab.src_size, vocab.tgt_size, d_model=16,
                                               num_heads=2, encoder_layers=1, decoder_layers=2,
                                               ff_dim=32)).eval()
    scores = head_alignment(model, vocab, pairs, batch_size=16)  # batched, padded
    hits = torch.zeros(2, 2)
    smallest_gap, batch_error = float("inf"), 0.0
    with torch.no_grad():
        padded = []  # each pair's weights as the batched pass sees them: (L, h, t', s') each
        for batch in iter_batches(encode_pairs(pairs, vocab), 16):
            _, trace = model.trace(batch.src, batch.tgt_in)
            padded += torch.stack([d.cross_attn.attention.weights for d in trace.decoder], 1).unbind(0)
        for p, wide in zip(pairs, padded):  # one sentence at a time: no padding at all
            src = torch.tensor([vocab.encode_en(p.en)])
            tgt = torch.tensor([vocab.encode_fr(p.fr)[:-1]])
            _, trace = model.trace(src, tgt)
            w = torch.stack([d.cross_attn.attention.weights[0] for d in trace.decoder])  # (L, h, t, s)
            batch_error = max(batch_error, float((wide[:, :, : w.shape[2], : w.shape[3]] - w).abs().max()))
            top2 = w.topk(2, dim=-1).values  # (L, h, t, 2)
            smallest_gap = min(smallest_gap, float((top2[..., 0] - top2[..., 1]).min()))
            for j, srcs in enumerate(p.alignment):
                hits[:, :] += torch.isin(w[:, :, j].argmax(-1), torch.tensor(srcs))  # (L, h)
    # The recount is an oracle only if padding cannot flip an argmax: each weight moves by at most
    # batch_error between the two passes, so a gap above twice that keeps the same key on top.
    assert batch_error == 0 or smallest_gap > 2 * batch_error, (
        f"near tie: top-2 gap {smallest_gap:.2g} vs batching error {batch_error:.2g}; choose another seed")
    tokens = sum(len(p.fr_tokens) for p in pairs)
    assert scores.tokens == tokens
    assert torch.equal(scores.accuracy, hits / tokens)  # whole counts (exact in float32), one division
