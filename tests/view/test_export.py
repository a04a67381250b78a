"""``qkv view TEXT --html FILE``: one file, opened from file:// with no server and no request at
all beyond the file itself, shows the same numbers as qkv.explain."""

from __future__ import annotations

import re

from view_checks import TEXT, assert_steps

from qkv.explain import explain_head
from qkv.view.export import export_html


def wait_steps(page, title: str) -> None:
    page.wait_for_function("(t) => (document.querySelector('#steps-body p') || {}).textContent?.includes(t)",
                           arg=title, timeout=30_000)


def test_the_exported_file_works_offline(watched, served, model, tmp_path):
    path = tmp_path / "view.html"
    size = export_html(path, "minilm", TEXT, api=served.api, probe=False)
    html = path.read_text(encoding="utf-8")
    assert size == len(html.encode())
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', html)[1]
    assert "connect-src 'none'" in csp and "default-src 'none'" in csp and "unsafe" not in csp
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html), "a reference to another host"

    page = watched.page
    page.goto(path.as_uri())
    wait_steps(page, "Layer 0, head 0, token 12")  # the last word, "it"
    # the form is off in a file, and says why beside it (it once disabled everything silently)
    for control in ("#model", "#text", "#run", "#method", "#effects", "#effects-probe"):
        assert page.is_disabled(control) and "exported file" in page.get_attribute(control, "title"), control
    assert page.locator("#form-hint").is_visible() and "run qkv view" in page.locator("#form-hint").text_content()
    assert "exported file" in page.locator("#effects-why").text_content()
    page.click('#grid button.cell[data-layer="3"][data-head="1"]')  # every head of "it" is inside
    wait_steps(page, "Layer 3, head 1, token 12")
    st = explain_head(model, TEXT, token="12", layer=3, head=1).to_dict()
    assert_steps(page, st, st["tokens"])
    page.click('#grid button.cell[data-layer="0"][data-head="0"]')
    page.click('#tokens button[data-token="5"]')  # every token of the opening head is inside
    wait_steps(page, "Layer 0, head 0, token 5")
    st = explain_head(model, TEXT, token="5", layer=0, head=0).to_dict()
    assert_steps(page, st, st["tokens"])
    page.click('#grid button.cell[data-layer="4"][data-head="2"]')  # not inside: said so, no number
    page.wait_for_selector("#steps-body .missing")
    assert watched.requests == [path.as_uri()], "the exported page made a request"


def test_every_answer_is_the_servers_at_two_forwards_a_token(model):
    """The exported answers are the API's own (the step panels of every head come from one
    forward, each equal to what the server answers that head's request), and the whole page
    costs two forwards per token, not one per head (it once ran L·H + 2U forwards: 102 s for one
    sentence on a loaded machine, issue 32)."""
    from qkv.view.api import Api, Models
    from qkv.view.export import collect

    text = "the cat sat on the mat"
    api = Api(Models(["minilm"], loader=lambda name: model))
    forwards = []
    hook = model.register_forward_hook(lambda *_: forwards.append(1))
    told = []
    try:
        answers, state = collect(api, "minilm", text, probe=False,
                                 progress=lambda *a: told.append(a))
    finally:
        hook.remove()
    units = len(model.tokenizer.encode(text).ids)
    assert len(forwards) <= 2 * units + 2, len(forwards)
    L, H = len(model.layers), model.layers[0].self_attn.num_heads
    steps = {(f["token"], f["layer"], f["head"]): a for e, f, a in answers if e == "steps"}
    assert len(steps) == L * H + units - 1  # every head of the chosen token, the chosen head of every token
    for token, layer, head in [(state["token"], 0, 0), (state["token"], 3, 1), (state["token"], L - 1, H - 1),
                               (1, 0, 0)]:
        body = {"model": "minilm", "text": text, "token": token, "layer": layer, "head": head,
                "words": False}
        assert steps[token, layer, head] == api.handle("steps", body)
    assert told[-1][1] == told[-1][2] and [d for _, d, _ in told] == list(range(1, len(told) + 1))


def test_a_translations_step_panels_are_the_servers():
    """Every cross-attention head's step panel for the chosen target token comes from one
    translation (cross_attention_heads), each what the server answers for that head."""
    from qkv.view.api import Api, Models
    from qkv.view.export import collect

    text = "the red apple is next to the black cats"
    api = Api(Models(["translate"]))
    answers, state = collect(api, "translate", text)
    steps = {(f["token"], f["layer"], f["head"]): a for e, f, a in answers if e == "cross_steps"}
    model = api.models.get("translate")
    L, H = model.config.decoder_layers, model.config.num_heads
    assert {(l, h) for t, l, h in steps if t == state["token"]} == {(l, h) for l in range(L) for h in range(H)}
    for layer, head in [(0, 0), (L - 1, H - 1)]:
        body = {"model": "translate", "text": text, "token": state["token"], "layer": layer, "head": head}
        assert steps[state["token"], layer, head] == api.handle("cross_steps", body)


def test_the_probe_answer_is_the_servers():
    """The page's probe (run by the export itself, to tell its progress) is the server's answer."""
    from qkv.view.api import Api, Models
    from qkv.view.export import collect

    api = Api(Models(["lm"]))
    told = []
    answers, _ = collect(api, "lm", "baka bela dima fona", progress=lambda *a: told.append(a))
    probe = [a for e, f, a in answers if e == "probe"]
    assert probe == [api.handle("probe", {"model": "lm"})] and probe[0]["probe"] == "induction"
    assert told[-1][0] == "page" and told[-1][1] == told[-1][2]
