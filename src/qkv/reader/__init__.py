"""The reader: a small Mistral-style decoder (Llama with a sliding window and RoPE) trained on the
English prose of the Python documentation, so that a text of any length has a shipped model to
read it. Its text (`qkv.reader.corpus`), tokenizer and batches (`qkv.reader.data`) and
training (`qkv.reader.train`, `qkv train reader`); the model is
`qkv.models.llama`'s, the loop and checkpoint `qkv.lm.run`'s (shared with `qkv train
lm`). The trained checkpoint ships in `qkv/data/reader`: `qkv.load("reader")`.
"""

#: the name ``qkv.load`` knows the shipped reader by (``models/registry.py``: ``SHIPPED``) —
#: ``qkv view --file``'s default model, and the one ``qkv explain`` names for a text too long for
#: its model
NAME = "reader"


def max_positions() -> int:
    """The most tokens the shipped reader reads: its checkpoint's `max_position_embeddings`
    (read from `qkv/data/reader/config.json`, so naming it imports nothing).

    Examples:
        >>> max_positions() >= 65536
        True
    """
    import json
    from pathlib import Path

    config = Path(__file__).resolve().parents[1] / "data" / NAME / "config.json"
    return int(json.loads(config.read_text(encoding="utf-8"))["max_position_embeddings"])
