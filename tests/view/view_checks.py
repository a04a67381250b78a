"""Reading the numbers a viewer page shows and checking them against qkv.explain's.

"Equal to the digits displayed": a number shown with n decimals must be the library's value
rounded to n decimals, i.e. within half a unit of the last digit shown (plus float64 noise).
"""

from __future__ import annotations

import math

TEXT = "The dog found some pizza next to the baby and ate it"
FRENCH_TEXT = "the red apple is next to the black cats"

# Everything the step panel shows, read in one round trip.
READ_STEPS = """() => {
  const text = (id) => (document.getElementById(id) || {}).textContent || "";
  const rows = [...document.querySelectorAll('#steps-table tbody tr')].map((tr) => ({
    token: tr.querySelector('.tok').textContent, score: tr.querySelector('.score').textContent,
    scaled: tr.querySelector('.scaled').textContent, mask: tr.querySelector('.mask').textContent,
    w: tr.querySelector('.w').textContent}));
  return {rows, q: text('step-q'), x: text('step-x'), out: text('step-out'),
          model_out: text('step-model-out'), diff: text('step-diff-value'),
          title: document.querySelector('#steps-body p').textContent};
}"""


def number(shown: str) -> float:
    shown = shown.strip().replace("−", "-")
    return {"-∞": -math.inf, "∞": math.inf}.get(shown, None) if "∞" in shown else float(shown)


def last_digit(shown: str) -> int:
    """The power of ten of the last digit shown: "0.1234" → -4, "1.19e-7" → -9, "12" → 0."""
    mantissa, _, exponent = shown.strip().lower().partition("e")
    decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
    return int(exponent or 0) - decimals


def assert_shown(shown: str, value: float, what: str) -> None:
    got = number(shown)
    if math.isinf(value) or math.isinf(got):
        assert got == value, f"{what}: page shows {shown!r}, qkv.explain has {value!r}"
        return
    half = 0.5 * 10.0 ** last_digit(shown)
    assert abs(got - value) <= half * (1 + 1e-9) + 1e-12, \
        f"{what}: page shows {shown!r}, qkv.explain has {value!r} (allowed ±{half})"


def assert_vector(shown: str, values, what: str) -> None:
    parts = shown.split()
    values = [float(v) for v in values]
    assert len(parts) == len(values), f"{what}: {len(parts)} numbers shown, {len(values)} in qkv.explain"
    for k, (s, v) in enumerate(zip(parts, values)):
        assert_shown(s, v, f"{what}[{k}]")


def assert_steps(page, d: dict, keys: list[str]) -> None:
    """The step panel shows exactly the numbers of ``d`` (a HeadSteps/CrossHeadSteps to_dict())."""
    shown = page.evaluate(READ_STEPS)
    assert [r["token"] for r in shown["rows"]] == keys
    for j, r in enumerate(shown["rows"]):
        for field, key in (("score", "scores"), ("scaled", "scaled"), ("mask", "mask"), ("w", "weights")):
            v = d[key][j]
            assert_shown(r[field], -math.inf if v == "-inf" else v, f"{key}[{j}]")
    assert_vector(shown["q"], d["query"], "q")
    assert_vector(shown["x"], d["x"], "x")
    assert_vector(shown["out"], d["output"], "Σ w_j v_j")
    assert_vector(shown["model_out"], d["model_output"], "the model's head output")
    assert_shown(shown["diff"], d["max_abs_diff"], "max |difference|")  # toExponential(2): ±half a unit of its last digit


DECODER = "tiny-decoder"


def tiny_decoder(bert, *, positions: int = 64, name: str = DECODER):
    """A random 2-layer Llama (causal, RoPE, 4 heads) reading MiniLM's tokenizer: a decoder to
    view without a decoder checkpoint on disk. ``positions``: the most tokens it takes (the
    tokenizer's own limit is raised to match, so a long document can be read)."""
    import copy

    import torch

    from qkv.models.llama import LlamaConfig, LlamaModel

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=bert.tokenizer.vocab_size, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=positions)
    tokenizer = bert.tokenizer
    if positions != 64:
        tokenizer = copy.copy(tokenizer)
        tokenizer.max_length = positions
    return LlamaModel(config, tokenizer=tokenizer, name=name).eval()


def long_text(words: int, seed: int = 0) -> str:
    """A text of ``words`` common English words in random order (one MiniLM token each, mostly)."""
    import random

    vocabulary = ("the cat sat on the mat while a dog found some pizza next to the baby and ate it "
                  "after the storm passed over the quiet town near the river").split()
    rng = random.Random(seed)
    return " ".join(rng.choice(vocabulary) for _ in range(words)) + "."


def notebook_frame(page, cell_html: str):
    """Show ``cell_html`` (a notebook cell's output: a sandboxed iframe) as the page's content and
    return that iframe's frame — the one just attached (``page.frames[1]`` right after a second
    ``set_content`` may still be the detached frame of the first, and waiting on it fails with
    "Target page, context or browser has been closed")."""
    page.set_content(f"<!doctype html><title>notebook</title>{cell_html}")
    return page.wait_for_selector("iframe").content_frame()
