"""The tokenizer: same ids as Hugging Face's, offsets that point into the text, word ids that
group sub-words, and one clear rule for over-long text."""

from __future__ import annotations

import os
import shutil
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

from qkv.errors import QkvError
from qkv.models import Encoding, Tokenizer
from qkv.models.loading import minilm_dir

TEXTS = [
    "The dog found some pizza next to the baby and ate it.",
    "Tokenizers split unbelievably long words: antidisestablishmentarianism!",
    "Café déjà vu — naïve façade, 3.14159 and e-mail@example.com",
    "   leading spaces and\ttabs\nnewlines  ",
    "",
]
CORPUS = ["The quick brown fox jumps over the lazy dog.", "Attention is all you need.",
          "Café déjà vu — naïve façade."] * 3


@pytest.fixture(scope="module")
def bert_tok() -> Tokenizer:
    return Tokenizer.from_dir(minilm_dir(), name="all-MiniLM-L6-v2", max_length=512)


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory) -> str:
    """A GPT-2-style byte-level BPE saved as vocab.json + merges.txt (and tokenizer.json)."""
    from tokenizers import ByteLevelBPETokenizer

    path = tmp_path_factory.mktemp("bpe")
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(CORPUS, vocab_size=350, min_frequency=1, special_tokens=["<|endoftext|>"])
    tok.save_model(str(path))
    return str(path)


def test_bert_ids_equal_transformers(bert_tok):
    transformers = pytest.importorskip("transformers")
    ref = transformers.AutoTokenizer.from_pretrained(minilm_dir())
    for text in TEXTS:
        enc = bert_tok.encode(text)
        expected = ref(text)
        assert enc.ids == expected["input_ids"], text
        assert enc.tokens == ref.convert_ids_to_tokens(expected["input_ids"])


def test_vocab_txt_alone_gives_the_same_tokens(bert_tok, tmp_path):
    for f in ("vocab.txt", "tokenizer_config.json"):
        shutil.copy(os.path.join(minilm_dir(), f), tmp_path / f)
    from_vocab = Tokenizer.from_dir(tmp_path)
    for text in TEXTS:
        a, b = from_vocab.encode(text), bert_tok.encode(text)
        assert (a.ids, a.offsets, a.word_ids, a.special) == (b.ids, b.offsets, b.word_ids, b.special)
    assert from_vocab.max_length == 512  # from tokenizer_config.json's model_max_length


def test_offsets_and_word_ids(bert_tok):
    text = TEXTS[1]
    enc = bert_tok.encode(text)
    assert isinstance(enc, Encoding) and len(enc) == len(enc.tokens) == len(enc.word_ids)
    assert enc.tokens[0] == "[CLS]" and enc.tokens[-1] == "[SEP]"
    assert enc.special[0] and enc.special[-1] and not any(enc.special[1:-1])
    assert enc.offsets[0] == enc.offsets[-1] == (0, 0)
    assert enc.word_ids[0] is None and enc.word_ids[-1] is None
    for tok, (a, b), special in zip(enc.tokens, enc.offsets, enc.special):
        if not special:  # the span is the token's text (lower-cased, without "##")
            assert text[a:b].lower() == tok.removeprefix("##")
    # sub-words of one word share its index; grouping them gives back the words
    words: dict[int, list[int]] = {}
    for i, w in enumerate(enc.word_ids):
        if w is not None:
            words.setdefault(w, []).append(i)
    spans = [text[enc.offsets[ix[0]][0]: enc.offsets[ix[-1]][1]] for ix in words.values()]
    assert "Tokenizers" in spans and "antidisestablishmentarianism" in spans
    assert len(words[spans.index("Tokenizers")]) > 1  # split into pieces
    assert list(words) == sorted(words) == list(range(len(words)))


def test_offsets_are_character_offsets_with_non_ascii(bert_tok):
    text = TEXTS[2]
    enc = bert_tok.encode(text)
    pieces = [text[a:b] for (a, b), s in zip(enc.offsets, enc.special) if not s]
    assert "façade" in pieces or "faç" in "".join(pieces)
    assert all(0 <= a <= b <= len(text) for a, b in enc.offsets)


def test_byte_level_bpe_equals_transformers(bpe_dir):
    transformers = pytest.importorskip("transformers")
    ref = transformers.GPT2TokenizerFast.from_pretrained(bpe_dir)  # reads vocab.json + merges.txt
    tok = Tokenizer.from_dir(bpe_dir, max_length=100)
    for text in TEXTS:
        enc = tok.encode(text)
        assert enc.ids == ref(text)["input_ids"], text
        assert not any(enc.special)  # GPT-2 adds nothing around the text
        assert tok.decode(enc.ids) == text  # byte-level: lossless
        spans = [text[a:b] for a, b in enc.offsets]
        # trimmed spans: a word's token excludes the space it carries ("Ġfox" → "fox")
        assert all(s == "" or s.isspace() or not s[0].isspace() for s in spans)
        covered = [i for a, b in enc.offsets for i in range(a, b)]
        assert len(covered) == len(set(covered))  # no character in two tokens
        assert {i for i, c in enumerate(text) if not c.isspace()} <= set(covered)


def test_bpe_tokenizer_json_equals_vocab_files(bpe_dir, tmp_path):
    transformers = pytest.importorskip("transformers")
    ref = transformers.GPT2TokenizerFast.from_pretrained(bpe_dir)  # reads vocab.json + merges.txt
    ref.save_pretrained(str(tmp_path))  # writes tokenizer.json
    assert os.path.isfile(tmp_path / "tokenizer.json")
    a, b = Tokenizer.from_dir(tmp_path), Tokenizer.from_dir(bpe_dir)
    for text in TEXTS:
        assert a.encode(text).ids == b.encode(text).ids


def test_word_ids_group_bpe_pieces(bpe_dir):
    tok = Tokenizer.from_dir(bpe_dir)
    text = "The unbelievably quick fox"
    enc = tok.encode(text)
    by_word: dict[int, str] = {}
    for w, (a, b) in zip(enc.word_ids, enc.offsets):
        by_word[w] = by_word.get(w, "") + text[a:b]
    assert list(by_word.values()) == ["The", "unbelievably", "quick", "fox"]


def test_too_long_text_raises_or_truncates_with_a_warning(bert_tok):
    text = "word " * 600  # 602 tokens with [CLS] and [SEP]
    with pytest.raises(QkvError) as err:
        bert_tok.encode(text)
    assert str(err.value).startswith("text is 602 tokens; all-MiniLM-L6-v2 takes at most 512")
    assert "\n" not in str(err.value)
    with pytest.warns(UserWarning, match="602 tokens.*512"):
        enc = bert_tok.encode(text, truncate=True)
    assert len(enc) == 512 and enc.tokens[0] == "[CLS]" and enc.tokens[-1] == "[SEP]"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # fits: no warning
        assert len(bert_tok.encode("word " * 10, truncate=True)) == 12
    with pytest.raises(QkvError, match="text is 12 tokens; all-MiniLM-L6-v2 takes at most 8"):
        bert_tok.encode("word " * 10, max_length=8)


def test_encode_batch_pads_on_the_right(bert_tok):
    batch = bert_tok.encode_batch(TEXTS[:3] + ["hi"])
    lengths = [len(e) for e in batch.encodings]
    assert batch.input_ids.shape == batch.attention_mask.shape == (4, max(lengths))
    assert batch.input_ids.dtype == torch.long
    assert batch.attention_mask.sum(1).tolist() == lengths
    for i, e in enumerate(batch.encodings):
        assert batch.input_ids[i, : len(e)].tolist() == e.ids == bert_tok.encode((TEXTS[:3] + ["hi"])[i]).ids
        assert torch.all(batch.input_ids[i, len(e):] == bert_tok.pad_id)
    assert bert_tok.pad_id == 0  # [PAD]


def test_decode_round_trip(bert_tok):
    enc = bert_tok.encode("Attention is all you need.")
    assert bert_tok.decode(enc.ids) == "attention is all you need."
    assert bert_tok.decode(torch.tensor(enc.ids), skip_special_tokens=False).startswith("[CLS]")


def test_missing_tokenizer_files(tmp_path):
    with pytest.raises(QkvError, match=f"no tokenizer in {tmp_path}: expected tokenizer.json"):
        Tokenizer.from_dir(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(QkvError, match="tokenizer.json (could not be read|is not valid JSON)"):
        Tokenizer.from_dir(tmp_path)
    with pytest.raises(QkvError, match="does not exist"):
        Tokenizer.from_dir(tmp_path / "nope")
    # a manifest's list: a file it does not name is absent, whatever lies in the directory
    with pytest.raises(QkvError, match="no tokenizer in"):
        Tokenizer.from_dir(tmp_path, files={"model.safetensors": "0" * 64})
    (tmp_path / "tokenizer.json").unlink()
    os.mkfifo(tmp_path / "tokenizer.json")  # never read: it would block the reader forever
    with pytest.raises(QkvError, match="not a regular file"):
        Tokenizer.from_dir(tmp_path)


def test_rejects_non_strings(bert_tok):
    with pytest.raises(QkvError, match="text must be a string, got int"):
        bert_tok.encode(3)
    with pytest.raises(QkvError, match="list of strings"):
        bert_tok.encode_batch("not a list")


# -- tokenizer.json of today's models: byte-level BPE, SentencePiece-style BPE with byte fallback --
MULTILINGUAL = [
    "The quick brown fox jumps over the lazy dog.",
    "Le cœur a ses raisons que la raison ne connaît point.",
    "Größere Straßen führen über die Brücke.",
    "Съешь же ещё этих мягких французских булок.",
    "Η γρήγορη καφέ αλεπού πηδά.",
    "我爱自然语言处理。",
    "日本語のテキストも大丈夫です。",
    "مرحبا بالعالم",
    "नमस्ते दुनिया",
    "Emoji 🙂👍🏽 and symbols ∑ ≠ ∞",
    "  two  spaces,\ttabs\nand newlines ",
    "e-mail@example.com costs $3.14159",
]
TRAIN = ["The quick brown fox jumps over the lazy dog.", "The dog found some pizza next to the baby and ate it.",
         "Le cœur a ses raisons que la raison ne connaît point.", "Attention is all you need."] * 3


def sentencepiece_bpe(style: str):
    """A SentencePiece-style BPE (``▁`` for spaces, unknown characters as ``<0xNN>`` bytes) as
    ``tokenizers`` writes Llama's: a normalizer that prepends ``▁`` and replaces spaces
    (Llama 2), or a Metaspace pre-tokeniser (Mistral); ``<s>`` before the text."""
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

    tok = RustTokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    # trained word by word, as SentencePiece does: no merge crosses a "▁" or joins a letter
    # to punctuation (SentencePiece splits by Unicode script)
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first"), pre_tokenizers.Punctuation()])
    specials = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
    tok.train_from_iterator(TRAIN, trainers.BpeTrainer(vocab_size=420, min_frequency=1,
                                                       special_tokens=specials))
    if style == "normalizer":  # then the whole text is one pre-token: the tokenizer gives no words
        tok.pre_tokenizer = None
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    return tok


@pytest.fixture(scope="module", params=["byte-level", "sp-normalizer", "sp-metaspace"])
def hf_saved(request, tmp_path_factory):
    """(style, directory, transformers' tokenizer): a tokenizer.json written by transformers'
    ``save_pretrained`` — GPT2TokenizerFast's for byte-level BPE (offsets keep the "Ġ" space)."""
    transformers = pytest.importorskip("transformers")
    from tokenizers import ByteLevelBPETokenizer

    path = tmp_path_factory.mktemp(request.param)
    if request.param == "byte-level":
        bpe = ByteLevelBPETokenizer()
        bpe.train_from_iterator(TRAIN, vocab_size=400, min_frequency=1, special_tokens=["<|endoftext|>"])
        bpe.save_model(str(path))  # vocab.json + merges.txt, read by GPT2TokenizerFast
        hf = transformers.GPT2TokenizerFast.from_pretrained(str(path))
        os.remove(path / "vocab.json"), os.remove(path / "merges.txt")  # tokenizer.json only
    else:
        hf = transformers.PreTrainedTokenizerFast(
            tokenizer_object=sentencepiece_bpe(request.param.removeprefix("sp-")),
            bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    hf.save_pretrained(str(path))
    assert os.path.isfile(path / "tokenizer.json")
    return request.param, str(path), transformers.AutoTokenizer.from_pretrained(str(path))


def test_tokenizer_json_equals_transformers_on_many_scripts(hf_saved):
    """Ids equal transformers'; offsets equal transformers' minus the leading space a Ġ/▁
    token carries (transformers keeps it for GPT2TokenizerFast and SentencePiece vocabularies);
    a token that is only spaces keeps its span or is empty at its end (a marker before a word)."""
    style, path, ref = hf_saved
    tok = Tokenizer.from_dir(path)
    byte_tokens = 0
    for text in MULTILINGUAL:
        enc = tok.encode(text)
        expected = ref(text, return_offsets_mapping=True)
        assert enc.ids == expected["input_ids"] and len(enc) > len(text) // 8, (style, text)
        assert enc.tokens == ref.convert_ids_to_tokens(expected["input_ids"])
        byte_tokens += sum(t.startswith("<0x") for t in enc.tokens)
        for token, (a, b), (ra, rb), special in zip(enc.tokens, enc.offsets, expected["offset_mapping"], enc.special):
            if special:
                assert (a, b) == (0, 0)
                continue
            span = text[ra:rb]
            if span.strip():
                assert (a, b) == (rb - len(span.lstrip()), rb), (style, text, token)
            else:
                assert (a, b) in ((ra, rb), (rb, rb)), (style, text, token)
        assert tok.decode(enc.ids) == ref.decode(expected["input_ids"], skip_special_tokens=True)
    if style.startswith("sp"):
        assert byte_tokens > 20  # Cyrillic, CJK, emoji … are not in the vocabulary: byte fallback


@pytest.mark.parametrize("text, words", [
    ("The dog found some pizza next to the baby and ate it.",
     ["The", "dog", "found", "some", "pizza", "next", "to", "the", "baby", "and", "ate", "it", "."]),
    ("Größere Straßen, 我爱 🙂", ["Größere", "Straßen", ",", "我爱", "🙂"]),
])
def test_words_are_the_same_for_every_marker_style(hf_saved, bert_tok, text, words):
    """Word ids group a word's pieces, whatever marks a word's start (##, Ġ, ▁); a word's span
    is its text, without the space before it."""
    style, path, _ = hf_saved
    for tok in (Tokenizer.from_dir(path), bert_tok):
        enc = tok.encode(text)
        spans: dict[int, tuple[int, int]] = {}
        for w, (a, b) in zip(enc.word_ids, enc.offsets):
            if w is not None:
                spans[w] = (spans.get(w, (a, b))[0], b)
        got = [text[a:b] for a, b in spans.values()]
        if tok is bert_tok and "Größere" in text:
            continue  # BERT's normaliser splits CJK characters into words of their own
        assert got == words, (style, got)
        assert list(spans) == list(range(len(spans)))


def test_gpt2_tokenizer_saved_by_transformers_works_with_heads_words_and_probe(tmp_path, capsys):
    """Issue 9 item 5: a tokenizer.json from GPT2TokenizerFast (offsets with the Ġ space) gives
    words, so qkv heads, --words and --probe coref work."""
    transformers = pytest.importorskip("transformers")
    from tokenizers import ByteLevelBPETokenizer

    from qkv.cli import main

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(TRAIN, vocab_size=400, min_frequency=1, special_tokens=["<|endoftext|>"])
    bpe.save_model(str(tmp_path))
    hf_tok = transformers.GPT2TokenizerFast.from_pretrained(str(tmp_path))
    os.remove(tmp_path / "vocab.json"), os.remove(tmp_path / "merges.txt")  # tokenizer.json only
    hf_tok.save_pretrained(str(tmp_path))
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=16, vocab_size=400, n_positions=128)
    transformers.GPT2LMHeadModel(config).save_pretrained(str(tmp_path))
    text = "The dog found some pizza next to the baby and ate it"
    assert main(["heads", text, "--model", str(tmp_path), "--from", "it", "--to", "dog"]) == 0
    assert "weight from 'it' (word 11) to 'dog' (word 1)" in capsys.readouterr().out
    assert main(["explain", text, "--model", str(tmp_path), "--words", "--token", "ate"]) == 0
    assert "words: 0:The 1:dog 2:found 3:some 4:pizza" in capsys.readouterr().out
    assert main(["heads", "--probe", "coref", "--model", str(tmp_path)]) == 0
    assert "chance" in capsys.readouterr().out


def test_display_token_decodes_every_marker():
    """Issue 41: one function turns a token into what a reader sees — byte-level BPE's bytes
    decoded (Ġ a space, Ċ a newline, â Ģ Ļ the bytes of ’), SentencePiece's ▁ and byte tokens,
    the word-start space dropped, whitespace made visible; other vocabularies' tokens unchanged."""
    from qkv.models.tokenizer import BYTE_ALPHABET, display_token

    assert len(BYTE_ALPHABET) == 256 and sorted(BYTE_ALPHABET.values()) == list(range(256))
    cases = {"Ġdog": "dog", "Ċ": "↵", "ĊĊ": "↵↵", "ĉ": "⇥", "Ġ": "␣", "ĠĠĠ": "␣␣␣", ".Ċ": ".↵",
             "âĢĻ": "’", "âĢ": "\\xe2\\x80", "Ġcaf": "caf", "Ã©": "é", "▁le": "le", "▁": "␣",
             "<0x0A>": "↵", "##ing": "##ing", "café": "café", "[CLS]": "[CLS]", "<bos>": "<bos>",
             "<|endoftext|>": "<|endoftext|>", "": ""}
    assert {t: display_token(t) for t in cases} == cases
