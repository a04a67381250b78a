"""`--compare` on ~500 tokens ran minutes without a word (issue 23): on a long text an estimate
comes first, on stderr, timed from the model itself; a short text gets none."""

import io

import qkv
from qkv.cli.methods import NOTE_FROM_TOKENS, _estimate_compare


def test_a_long_compare_says_what_it_will_cost_first():
    model = qkv.load("minilm")
    quiet = io.StringIO()
    assert _estimate_compare(model, "the cat sat on the mat", file=quiet) is None
    assert quiet.getvalue() == ""
    text = " ".join(["the cat sat on the mat"] * 25)  # 150 words → 152 tokens
    t = len(model.tokenizer.encode(text).ids)
    assert t >= NOTE_FROM_TOKENS
    note = io.StringIO()
    seconds = _estimate_compare(model, text, file=note)
    assert seconds > 0
    line = note.getvalue()
    assert line.count("\n") == 1 and line.startswith(f"qkv: note: --compare on {t} tokens")
    assert f"{t + 1} copies" in line
