"""English→French translation on a toy grammar: the data, with gold word alignments
(`qkv.translate.grammar`), and what learns from it."""

# Where things are: grammar.py (the data), vocab.py (tokenizers), data.py (batches), train.py (the
# loop), decode.py (greedy, beam, KV cache), checkpoint.py (files), metrics.py and report.py
# (qkv evaluate). The model itself is qkv.translate.model (TranslationModel).
from qkv.translate.checkpoint import load_checkpoint, save_checkpoint
from qkv.translate.decode import beam_search, greedy_decode, translate
from qkv.translate.train import TrainConfig, lr_at, train
from qkv.translate.vocab import Vocab

__all__ = [
    "TrainConfig", "Vocab", "beam_search", "greedy_decode", "load_checkpoint", "lr_at",
    "save_checkpoint", "train", "translate",
]
