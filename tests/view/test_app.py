"""The served page in a real browser (Debian's chromium via Playwright): clicks, numbers, exports.

Every number read off the page is checked against :mod:`qkv.explain` to the digits shown; every
request must stay on 127.0.0.1 and the page must log no error (the ``watched`` fixture).
"""

from __future__ import annotations

import csv
import io
import json
import re
import struct
import xml.etree.ElementTree as ET
from urllib.parse import urlencode

from view_checks import FRENCH_TEXT, TEXT, assert_shown, assert_steps

from qkv.explain import attention_map, cross_attention, cross_attention_head, explain, explain_head
from qkv.explain.probes.induction import induction_probe
from qkv.translate.gold import grammar_gold


def open_page(watched, served, **query) -> None:
    watched.page.goto(served.url + "?" + urlencode(query))
    watched.page.wait_for_selector("#steps-table", timeout=60_000)


def wait_steps(page, title: str) -> None:
    page.wait_for_function("(t) => (document.querySelector('#steps-body p') || {}).textContent?.includes(t)",
                           arg=title, timeout=30_000)


def test_a_head_and_a_token_show_explains_numbers(watched, served, model):
    page = watched.page
    open_page(watched, served, text=TEXT)
    page.click('#grid button.cell[data-layer="3"][data-head="1"]')
    page.click('#tokens button[data-token="5"]')  # "pizza"
    wait_steps(page, "Layer 3, head 1, token 5")
    st = explain_head(model, TEXT, token="5", layer=3, head=1).to_dict()
    assert_steps(page, st, st["tokens"])

    # the model view: every head's cell says its rank and largest weight, as qkv explain ranks them
    ov = explain(model, TEXT, token="5")
    labels = page.eval_on_selector_all("#grid button.cell", "cs => cs.map(c => c.getAttribute('aria-label'))")
    assert len(labels) == len(ov.rows) == 72
    by_head = {tuple(map(int, re.match(r"layer (\d+) head (\d+)", s).groups())): s for s in labels}
    for rank, row in enumerate(ov.rows, 1):
        m = re.search(r"rank (\d+), largest weight (\S+) on (.+?), entropy (\S+) bits", by_head[row.layer, row.head])
        assert int(m[1]) == rank
        assert_shown(m[2], row.max_weight, f"L{row.layer} H{row.head} max weight")
        assert m[3] == ov.units.labels[row.argmax]
        assert_shown(m[4], row.entropy, f"L{row.layer} H{row.head} entropy")
        assert ("highlighted" in by_head[row.layer, row.head]) == ov.highlighted(row)

    # the heat map: exact values on hover
    amap = attention_map(model, TEXT, layer=3, head=1)
    page.locator("#heat").scroll_into_view_if_needed()
    box = page.locator("#heat").bounding_box()
    cell = box["width"] / len(amap.units)
    for i, j in ((12, 5), (5, 5), (0, 13)):
        page.mouse.move(box["x"] + (j + 0.5) * cell, box["y"] + (i + 0.5) * cell)
        tip = page.locator("#tip").text_content()
        assert tip.startswith(f"{amap.units.labels[i]} → {amap.units.labels[j]}: "), tip
        assert_shown(tip.split(": ")[1].split()[0], float(amap.weights[i, j]), f"map[{i}, {j}]")

    # the heat map by keyboard: focus it, the arrows move a cursor from the selected row
    page.focus("#heat")
    for _ in range(3):
        page.keyboard.press("ArrowRight")
    tip = page.locator("#tip").text_content()
    assert tip.startswith(f"{amap.units.labels[5]} → {amap.units.labels[2]}: "), tip
    assert_shown(tip.split(": ")[1], float(amap.weights[5, 2]), "map[5, 2] by keyboard")

    # the selection is in the URL, and the URL reopens it
    assert all(f"{k}={v}" in page.url for k, v in (("layer", 3), ("head", 1), ("token", 5)))
    page.goto(page.url)
    wait_steps(page, "Layer 3, head 1, token 5")
    assert_steps(page, st, st["tokens"])

    # keyboard: the tokens are buttons; the arrow keys move the selection
    page.focus('#tokens button[data-token="5"]')
    page.keyboard.press("ArrowRight")
    wait_steps(page, "Layer 3, head 1, token 6")


def test_exports_equal_the_library(watched, served, model, tmp_path):
    page = watched.page
    open_page(watched, served, text=TEXT, layer=2, head=7, token=12)
    wait_steps(page, "Layer 2, head 7, token 12")
    amap = attention_map(model, TEXT, layer=2, head=7)
    expected = amap.weights.tolist()
    files = {}
    for kind in ("png", "svg", "csv", "json"):
        with page.expect_download() as info:
            page.click(f'[data-export="{kind}"]')
        path = tmp_path / info.value.suggested_filename
        info.value.save_as(path)
        files[kind] = path.read_bytes()
        assert path.name == f"qkv-L2-H7.{kind}"

    png = files["png"]
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png[16:24])  # the IHDR chunk
    assert width >= 14 * 4 and height >= 14 * 4 and len(png) > 1000

    svg = ET.fromstring(files["svg"])
    rects = [r for r in svg.iter("{http://www.w3.org/2000/svg}rect") if r.get("fill-opacity")]
    assert len(rects) == 14 * 14
    for r, w in zip(rects, (w for row in expected for w in row)):
        assert_shown(r.get("fill-opacity"), w, "svg cell")

    rows = list(csv.reader(io.StringIO(files["csv"].decode())))
    assert rows[0][1:] == amap.units.labels and [r[0] for r in rows[1:]] == amap.units.labels
    got = [[float(v) for v in r[1:]] for r in rows[1:]]
    # float32 on the wire and the forward's weights are float32: String(number) round-trips, so exact
    assert got == expected

    # the model view: every head's row for the token, ranked; JSON is explain()'s to_dict()
    ov = explain(model, TEXT, token="12")
    for kind in ("csv", "json"):
        with page.expect_download() as info:
            page.click(f'[data-export-model="{kind}"]')
        files["model-" + kind] = open(info.value.path(), "rb").read()
    table = list(csv.reader(io.StringIO(files["model-csv"].decode())))
    assert table[0] == ["rank", "layer", "head", "max_weight", "argmax", *ov.units.labels]
    for rank, (line, row) in enumerate(zip(table[1:], ov.rows), 1):
        assert [int(v) for v in line[:3]] == [rank, row.layer, row.head] and line[4] == ov.units.labels[row.argmax]
        assert [float(v) for v in line[5:]] == row.weights.tolist()
    exported = json.loads(files["model-json"])
    assert {k: exported[k] for k in ov.to_dict()} == json.loads(json.dumps(ov.to_dict()))

    data = json.loads(files["json"])
    assert (data["layer"], data["head"], data["text"], data["columns"]) == (2, 7, TEXT, amap.units.labels)
    assert data["weights"] == expected


def test_translation_cross_attention(watched, served):
    page = watched.page
    open_page(watched, served, model="translate", text=FRENCH_TEXT)
    page.click('#grid button.cell[data-layer="2"][data-head="1"]')
    page.click('#tokens button[data-token="2"]')  # "rouge"
    wait_steps(page, "decoder layer 2, head 1, target token 2")
    cs = cross_attention_head("translate", FRENCH_TEXT, token="2", layer=2, head=1,
                              gold=grammar_gold(FRENCH_TEXT)).to_dict()
    assert_steps(page, cs, cs["source"])
    gold = page.eval_on_selector_all("#steps-table tbody tr.gold", "rs => rs.map(r => Number(r.dataset.j))")
    assert gold == cs["gold"] == [1]  # rouge ← red

    ca = cross_attention("translate", FRENCH_TEXT, gold=grammar_gold(FRENCH_TEXT))
    counts = ca.alignment()
    label = page.get_attribute('#grid button.cell[data-layer="1"][data-head="0"]', "aria-label")
    assert f"on gold for {int(counts[1, 0])} of {len(ca.gold)} target words" in label


def test_long_inputs_are_fetched_per_head_or_per_row(watched, served, model):
    page = watched.page
    text = " ".join(["the cat sat on the mat"] * 9)  # 56 tokens: over the whole-maps limit (48)
    open_page(watched, served, text=text)
    page.click('#grid button.cell[data-layer="1"][data-head="4"]')
    wait_steps(page, "Layer 1, head 4")
    endpoints = {u.rsplit("/", 1)[1] for u in watched.requests if "/api/" in u}
    assert "map" in endpoints and "maps" not in endpoints

    # over the map limit (64 here, 512 in qkv view): the head view draws the token's row alone
    text = " ".join(["the cat sat on the mat"] * 12)  # 74 tokens
    open_page(watched, served, text=text, token=40, layer=2, head=5)
    wait_steps(page, "Layer 2, head 5, token 40")
    ov = explain(model, text, token="40")
    row = next(r for r in ov.rows if (r.layer, r.head) == (2, 5))
    page.locator("#heat").scroll_into_view_if_needed()
    box = page.locator("#heat").bounding_box()
    cell = box["width"] / len(ov.units)
    for j in (0, 39, 40, 73):
        page.mouse.move(box["x"] + (j + 0.5) * cell, box["y"] + box["height"] / 2)
        tip = page.locator("#tip").text_content()
        assert tip.startswith(f"{ov.units.labels[40]} → {ov.units.labels[j]}: "), tip
        assert_shown(tip.split(": ")[1], float(row.weights[j]), f"row[{j}]")
    assert "a long text" in page.locator("#head-hint").text_content()


def test_the_method_switch_drives_the_model_view(watched, served, model):
    """Every method qkv.explain runs on the model is offered (grad on an encoder needs a second
    text the page does not ask for: not offered); a contribution method's ranking is the library's."""
    from qkv.view.api import METHODS

    page = watched.page
    open_page(watched, served, text=TEXT)
    offered = page.eval_on_selector_all("#method option", "os => os.map(o => o.value)")
    assert offered == [m for m in METHODS if m != "grad"] and offered[0] == "weight" and "norm" in offered
    page.select_option("#method", "norm")
    page.wait_for_function("() => location.search.includes('method=norm') && "
                           "document.querySelector('#model-hint').textContent.includes('method norm')")
    ov = explain(model, TEXT, token="12", method="norm")
    first = page.locator("#ranking li").first.text_content()
    r = ov.rows[0]
    assert first.startswith(f"L{r.layer} H{r.head} → {ov.units.labels[r.argmax]} ")
    assert_shown(first.split()[4], r.max_weight, "norm: the best head's share")


def test_words_as_the_cli_groups_them_in_dark_and_light(watched, served, model):
    """The words toggle: weights into a word summed, from a word averaged — qkv explain --words.
    The page follows the system's dark scheme; the ◐ button switches to light."""
    text = "The dog found some pizzeria leftovers and ate them"
    page = watched.page
    page.emulate_media(color_scheme="dark")
    open_page(watched, served, text=text, words=1)
    ov = explain(model, text, words=True)  # the last word, as the page opens
    shown = page.eval_on_selector_all("#tokens button", "bs => bs.map(b => b.textContent)")
    assert shown == ov.units.labels and "pizzeria" in shown
    labels = page.eval_on_selector_all("#grid button.cell", "cs => cs.map(c => c.getAttribute('aria-label'))")
    by_head = {tuple(map(int, re.match(r"layer (\d+) head (\d+)", s).groups())): s for s in labels}
    for rank, row in enumerate(ov.rows, 1):
        m = re.search(r"rank (\d+), largest weight (\S+) on (.+?), entropy", by_head[row.layer, row.head])
        assert int(m[1]) == rank and m[3] == ov.units.labels[row.argmax]
        assert_shown(m[2], row.max_weight, f"L{row.layer} H{row.head}")
    background = "() => getComputedStyle(document.body).backgroundColor"
    assert page.evaluate(background) == "rgb(15, 18, 22)"
    page.click("#theme")
    assert page.evaluate(background) == "rgb(255, 255, 255)"


def test_a_decoder_shows_its_causal_mask(watched, served):
    """Any model qkv loads: a (random) Llama decoder — keys after the token are masked, −∞."""
    model = served.api.models.get("tiny-decoder")
    page = watched.page
    open_page(watched, served, model="tiny-decoder", text=TEXT, layer=1, head=2, token=5)
    wait_steps(page, "Layer 1, head 2, token 5")
    st = explain_head(model, TEXT, token="5", layer=1, head=2).to_dict()
    assert st["mask"][6] == "-inf" and st["mask"][5] == 0.0
    assert_steps(page, st, st["tokens"])
    masks = page.eval_on_selector_all("#steps-table td.mask", "cs => cs.map(c => c.textContent)")
    assert masks[:6] == ["0.0000"] * 6 and set(masks[6:]) == {"−∞"}
    # a decoder's marked heads come from the induction probe (an encoder's from coref)
    page.wait_for_function("() => document.querySelector('#model-hint').textContent"
                           ".includes(\"the induction probe's 3 best heads\")")
    best = induction_probe(model, "induction").ranked()[:3]
    marked = page.eval_on_selector_all("#grid button.cell:has(.mark)",
                                       "cs => cs.map(c => [Number(c.dataset.layer), Number(c.dataset.head)])")
    assert sorted(marked) == sorted([layer, head] for layer, head, _ in best)

    # the form: another model, the same text
    page.select_option("#model", "minilm")
    wait_steps(page, "Layer 1, head 2, token 12")  # MiniLM's tokens; the last word again
    page.wait_for_function("() => document.querySelector('#model-hint').textContent"
                           ".includes(\"the coref probe's 3 best heads\")", timeout=60_000)
    assert "model=minilm" in page.url
