"""Exact match, BLEU (against sacrebleu's own sentence scores), and head alignment accuracy."""

from __future__ import annotations

import pytest
import torch

from qkv.models.translation import TranslationConfig, TranslationModel
from qkv.translate.data import load_splits
from qkv.translate.metrics import bleu, exact_match, gold_matrix, head_alignment
from qkv.translate.vocab import Vocab


def test_exact_match():
    assert exact_match(["a b", "c", "d"], ["a b", "c ", "d"]) == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="2 hypotheses for 1 references"):
        exact_match(["a", "b"], ["a"])


def test_bleu_is_sacrebleus():
    sacrebleu = pytest.importorskip("sacrebleu")
    hyps = ["le chat mange la pomme", "les chiens voient un arbre"]
    refs = ["le chat mange la pomme", "les chiens voient l'arbre"]
    assert bleu(hyps, refs) == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score)
    assert bleu(refs, refs) == pytest.approx(100.0)
    assert 0 < bleu(hyps, refs) < 100


def test_gold_matrix():
    pair = load_splits(0).test[0]
    gold = gold_matrix(pair, len(pair.en_tokens) + 1)
    assert gold.shape == (len(pair.fr_tokens), len(pair.en_tokens) + 1)
    assert gold.sum() == len(pair.links) and not gold[:, -1].any()  # [EOS] is never gold


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
    with torch.no_grad():
        for p in pairs:  # one sentence at a time: no padding at all
            src = torch.tensor([vocab.encode_en(p.en)])
            tgt = torch.tensor([vocab.encode_fr(p.fr)[:-1]])
            _, trace = model.trace(src, tgt)
            for layer in range(2):
                w = trace.decoder[layer].cross_attn.attention.weights[0]  # (h, t, s)
                for j, srcs in enumerate(p.alignment):
                    for head in range(2):
                        hits[layer, head] += int(w[head, j].argmax()) in srcs
    tokens = sum(len(p.fr_tokens) for p in pairs)
    assert scores.tokens == tokens
    torch.testing.assert_close(scores.accuracy, hits / tokens)
    layer, head, acc = scores.best()
    assert acc == float(scores.accuracy.max()) == float(scores.accuracy[layer, head])
