"""The model view's ablation effects in a real browser (Debian's chromium via Playwright): the
toggle offers the probes the library measures on the model, and every effect shown is
:func:`qkv.explain.head_effects`' to the digits displayed."""

from __future__ import annotations

import re

from view_checks import DECODER, TEXT, assert_shown

from qkv.explain.causal.head_effects import head_effects, probes_for

READ_EFFECTS = """() => ({
  labels: [...document.querySelectorAll('#grid button.cell')].map((c) => [
    Number(c.dataset.layer), Number(c.dataset.head), c.getAttribute('aria-label'),
    (c.querySelector('.effect') || {}).textContent || null]),
  ranking: [...document.querySelectorAll('#effects-ranking li')].map((li) => li.textContent),
  hint: document.querySelector('#model-hint').textContent})"""


def open_page(watched, served, **query) -> None:
    from urllib.parse import urlencode

    watched.page.goto(served.url + "?" + urlencode(query))
    watched.page.wait_for_selector("#grid button.cell", timeout=60_000)


def wait_effects(page, probe: str, timeout: int = 120_000) -> None:  # every head ablated: seconds, more on a busy machine
    page.wait_for_function("(p) => document.querySelector('#model-hint').textContent"
                           ".includes(`ablation effect on ${p} —`)", arg=probe, timeout=timeout)


# Each Δ label's text against its cell: drawn inside it, not over its border (nor cut off).
OVERFLOWING = """() => [...document.querySelectorAll('#grid button.cell .effect')].flatMap((span) => {
  const cell = span.closest('button').getBoundingClientRect(), r = document.createRange();
  r.selectNodeContents(span);
  const text = r.getBoundingClientRect();
  return text.left < cell.left || text.right > cell.right || span.scrollWidth > span.clientWidth
    ? [[span.textContent, text.right - cell.right]] : [];
})"""


def assert_effects_shown(page, effects) -> None:
    """Every cell's Δ and aria-label, and the ranked list, show ``effects`` (a HeadEffects); each
    Δ fits its cell (at 1400 px, 12 heads a row)."""
    page.set_viewport_size({"width": 1400, "height": 900})
    assert not page.evaluate(OVERFLOWING), page.evaluate(OVERFLOWING)[:5]
    shown = page.evaluate(READ_EFFECTS)
    L, H = effects.effects.shape
    assert len(shown["labels"]) == L * H
    for layer, head, label, cell in shown["labels"]:
        value = float(effects.effects[layer, head])
        assert_shown(re.search(r"ablation effect (\S+)$", label)[1], value, f"L{layer} H{head} label")
        assert_shown(cell, value, f"L{layer} H{head} cell")
    ranked = effects.ranked()[:12]
    assert len(shown["ranking"]) == len(ranked)
    for text, (layer, head, value) in zip(shown["ranking"], ranked):
        m = re.fullmatch(r"L(\d+) H(\d+) Δ (\S+)", text)
        assert (int(m[1]), int(m[2])) == (layer, head), (text, layer, head)
        assert_shown(m[3], value, f"ranked L{layer} H{head}")
    assert "minus the clean run's " in shown["hint"]
    assert_shown(re.search(r"clean run's (\S+) \(", shown["hint"])[1], effects.clean, "clean")


def test_a_decoders_induction_and_previous_token_effects(watched, served):
    model = served.api.models.get(DECODER)
    page = watched.page
    open_page(watched, served, model=DECODER, text=TEXT)
    offered = page.eval_on_selector_all("#effects-probe option", "os => os.map(o => o.value)")
    assert offered == probes_for(model) and offered[:2] == ["induction", "previous-token"]
    assert not page.is_checked("#effects") and "ablation effect" not in page.locator("#model-hint").text_content()

    page.check("#effects")
    wait_effects(page, "induction")
    assert "effects=induction" in page.url
    assert_effects_shown(page, head_effects(model, "induction"))

    page.select_option("#effects-probe", "previous-token")
    wait_effects(page, "previous-token")
    assert "effects=previous-token" in page.url
    assert_effects_shown(page, head_effects(model, "previous-token"))

    # the URL reopens the page with the effects shown; unchecking hides them
    page.goto(page.url)
    wait_effects(page, "previous-token")
    assert page.is_checked("#effects")
    page.uncheck("#effects")
    page.wait_for_function("() => !document.querySelector('#grid .effect') && "
                           "!location.search.includes('effects=')")
    assert page.locator("#effects-ranking").is_hidden()


def test_minilms_coref_effects(watched, served, model):
    """An encoder offers coref only (the library says so); a decoder's probe is dropped when the
    model changes to one it does not apply to."""
    page = watched.page
    open_page(watched, served, model=DECODER, text=TEXT, effects="induction")
    wait_effects(page, "induction")
    page.select_option("#model", "minilm")
    page.wait_for_function("() => location.search.includes('model=minilm')")
    assert page.eval_on_selector_all("#effects-probe option", "os => os.map(o => o.value)") \
        == probes_for(model) == ["coref"]
    assert not page.is_checked("#effects") and "effects=" not in page.url
    page.check("#effects")
    wait_effects(page, "coref", timeout=180_000)  # 72 heads × 49 sentences: seconds
    assert_effects_shown(page, head_effects(model, "coref"))
