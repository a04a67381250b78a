"""Checkpoint directories of archs.py's encoder-decoders with a tokenizer, built offline.

The tokenizer is a word-level ``tokenizers`` model saved as transformers' ``PreTrainedTokenizerFast``
(``tokenizer.json``): its special tokens sit at the ids the model's config names (eos, pad, bos),
and its post-processor appends ``</s>`` as Marian, M2M100 and T5 do, or wraps ``<s> … </s>`` as
BART and mBART do. Real Marian and M2M100 tokenizers are sentencepiece models (not installed
here); the words of a text and of a target go through the same ``text_target`` path either way.
"""

from __future__ import annotations

import copy
import os

from archs import SEQ2SEQ, build

WORDS = ("the cat sat on mat dog ate a red apple le chat est assis sur tapis chien mange une "
         "pomme rouge").split()
WRAPS = {"bart", "mbart"}  # "<s> $A </s>"; the others "$A </s>"


def tokenizer_for(config, name: str):
    """A PreTrainedTokenizerFast whose special ids are ``config``'s."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = {config.eos_token_id: "</s>", config.pad_token_id: "<pad>"}
    bos = getattr(config, "bos_token_id", None)
    if name in WRAPS:
        specials[bos] = "<s>"
    vocab = {tok: i for i, tok in specials.items()}
    free = (i for i in range(config.vocab_size) if i not in specials)
    for tok in ["<unk>", *WORDS]:
        vocab[tok] = next(free)
    for i in free:  # every id the model can generate is a token
        vocab[f"w{i}"] = i
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    single = "<s> $A </s>" if name in WRAPS else "$A </s>"
    tok.post_processor = processors.TemplateProcessing(
        single=single, special_tokens=[(t, vocab[t]) for t in ("<s>", "</s>") if t in vocab])
    extra = dict(bos_token="<s>") if name in WRAPS else {}
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>", **extra)


def save(tmp_path, name: str):
    """(directory, the eager float32 model re-read from it) of SEQ2SEQ[name], with its tokenizer.

    Re-read, not the built one: sinusoidal position tables (Marian, M2M100) are not saved, and
    build() perturbed the built model's.
    """
    model = build(SEQ2SEQ, name)
    path = os.path.join(str(tmp_path), name)
    model.save_pretrained(path)
    tokenizer_for(model.config, name).save_pretrained(path)
    return path, type(model).from_pretrained(path, attn_implementation="eager").eval()


def eager_pair(model):
    """(eager float64 — the truth, eager float32 — the plain peer)."""
    return copy.deepcopy(model).double(), model
