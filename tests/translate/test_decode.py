"""Greedy and beam search: the KV cache changes nothing, K=1 is greedy, a wide beam is exact."""

from __future__ import annotations

import itertools

import pytest
import torch

from qkv.errors import QkvError
from qkv.translate.model import TranslationConfig, TranslationModel
from qkv.translate.checkpoint import load_checkpoint
from qkv.translate.data import load_splits, pad
from qkv.translate.decode import beam_search, greedy_decode, translate
from qkv.translate.vocab import BOS_ID, EOS_ID, PAD_ID, UNK_ID


def random_model(tgt_vocab: int = 30, seed: int = 0) -> TranslationModel:
    torch.manual_seed(seed)
    cfg = TranslationConfig(src_vocab_size=20, tgt_vocab_size=tgt_vocab, d_model=32, num_heads=4,
                            encoder_layers=2, decoder_layers=2, ff_dim=48)
    return TranslationModel(cfg).eval()


def sources(b: int = 5, s: int = 8, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    rows = [torch.randint(4, 20, (int(n),), generator=g).tolist() + [EOS_ID]
            for n in torch.randint(2, s, (b,), generator=g)]
    return pad(rows)  # (b, s) with some padding


@torch.no_grad()
def margins(model, src: torch.Tensor, ids: torch.Tensor) -> tuple[float, float]:
    """Along decoded ``ids`` (b, n): (smallest gap between the two best tokens, largest difference
    between the cached and the uncached logits), over every position up to each row's [EOS].

    Decoding with and without the cache picks the same token wherever the gap exceeds twice the
    difference; a smaller gap would be a near tie that either path may break its own way.
    """
    tgt = torch.cat([torch.full_like(ids[:, :1], BOS_ID), ids[:, :-1]], dim=1)  # (b, n)
    full = model(src, tgt)  # (b, n, V): the whole prefix at once
    state = model.start(src, ids.shape[1])
    cached = torch.cat([model.step(tgt[:, i : i + 1], state) for i in range(ids.shape[1])], dim=1)
    real = (ids == EOS_ID).cumsum(1) - (ids == EOS_ID).long() == 0  # (b, n): up to [EOS]
    error = float((cached - full)[real].abs().max())
    full[..., [PAD_ID, BOS_ID, UNK_ID]] = float("-inf")  # never generated
    top2 = full.topk(2, dim=-1).values  # (b, n, 2)
    return float((top2[..., 0] - top2[..., 1])[real].min()), error


def assert_no_near_tie(model, src, ids) -> None:
    gap, error = margins(model, src, ids)
    assert gap > 2 * error, f"near tie: logit gap {gap:.2g} vs cache error {error:.2g}; change the seed"


@pytest.fixture(scope="module")
def shipped():
    return load_checkpoint("translate")


@pytest.fixture(scope="module")
def test_sources(shipped):
    pairs = load_splits(0).test[:200]
    return pairs, pad([shipped.vocab.encode_en(p.en) for p in pairs])


def test_kv_cache_decoding_equals_decoding_without_cache():
    model, src = random_model(), sources()
    with_cache = greedy_decode(model, src, max_new=12)
    without = greedy_decode(model, src, max_new=12, use_cache=False)
    assert with_cache.shape[0] == 5 and with_cache.shape[1] > 1
    assert_no_near_tie(model, src, without)  # else equality would not be a fair demand
    assert torch.equal(with_cache, without)


def test_kv_cache_decoding_equals_decoding_without_cache_on_the_shipped_model(shipped, test_sources):
    _, src = test_sources
    without = greedy_decode(shipped.model, src, use_cache=False)
    assert_no_near_tie(shipped.model, src, without)
    assert torch.equal(greedy_decode(shipped.model, src), without)


def test_beam_of_one_is_greedy():
    model, src = random_model(), sources()
    greedy = greedy_decode(model, src, max_new=12)
    assert_no_near_tie(model, src, greedy)
    assert torch.equal(beam_search(model, src, 1, max_new=12), greedy)


def test_beam_of_one_is_greedy_on_the_shipped_model(shipped, test_sources):
    _, src = test_sources
    assert torch.equal(beam_search(shipped.model, src, 1), greedy_decode(shipped.model, src))


def _sequence_log_prob(model, src, seq) -> float:
    """Teacher-forced log-probability of ``seq`` with the decoder's never-emitted tokens masked."""
    tgt = torch.tensor([[BOS_ID] + seq[:-1]])
    logits = model(src, tgt)[0].clone()  # (t, V)
    logits[:, [PAD_ID, BOS_ID, UNK_ID]] = float("-inf")
    logp = torch.log_softmax(logits, -1)
    return float(logp[torch.arange(len(seq)), torch.tensor(seq)].sum())


def test_a_beam_wider_than_every_prefix_finds_the_best_translation():
    # 6 target ids: 4 special + 2 words, so each step chooses among [EOS], 4, 5.
    model, src = random_model(tgt_vocab=6, seed=3), sources(b=1, seed=4)
    max_new = 3
    candidates = []
    for n in range(1, max_new + 1):
        for words in itertools.product((4, 5), repeat=n - 1):
            candidates.append(list(words) + [EOS_ID])  # finished hypotheses
    candidates += [list(w) for w in itertools.product((4, 5), repeat=max_new)]  # cut at max_new
    with torch.no_grad():
        scores = [_sequence_log_prob(model, src, c) for c in candidates]
    order = sorted(range(len(candidates)), key=scores.__getitem__, reverse=True)
    best = candidates[order[0]]
    # Beam search sums the cached steps' log-probabilities, this oracle a full pass's: each of the
    # ≤ 3 terms may differ by about twice the logits' difference (the logit and its log-sum-exp).
    _, error = margins(model, src, torch.tensor([best]))
    assert scores[order[0]] - scores[order[1]] > 2 * max_new * 2 * error, "near tie: change the seed"
    found = beam_search(model, src, beam_size=27, max_new=max_new)[0].tolist()
    assert [t for t in found if t != PAD_ID] == best


def test_the_shipped_model_translates_with_beams(shipped, test_sources):
    pairs, _ = test_sources
    texts = [p.en for p in pairs[:60]]
    assert translate(shipped.model, shipped.vocab, texts, beam=4) == [p.fr for p in pairs[:60]]


def test_unknown_words_fail_before_decoding(shipped):
    with pytest.raises(QkvError, match="unknown English word 'zebra'"):
        translate(shipped.model, shipped.vocab, ["the cat eats", "the zebra eats"])
    with pytest.raises(ValueError, match="beam_size must be >= 1"):
        beam_search(shipped.model, torch.tensor([[5, EOS_ID]]), 0)
