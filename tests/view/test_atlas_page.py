"""The head atlas's page — ``qkv atlas --html`` (the result embedded) and ``qkv view``'s ``/atlas``
(a saved ``qkv atlas --json`` opened, checked by the server's ``Atlas.from_dict``): every head a
point by the two metrics chosen, a click listing that head's contexts, all from the result's
``to_dict()``, nothing computed (a real browser); a saved file that is not an atlas is a one-line
4xx, shown on the page."""

from __future__ import annotations

import copy
import json

import httpx
import pytest

import qkv
from qkv.explain.probes.atlas import Atlas, atlas
from qkv.view.answers import saved_labelled
from qkv.view.atlas_page import atlas_page
from qkv.view.server import MAX_SAVED_BYTES

READY = "() => document.body.dataset.state === 'ready'"


@pytest.fixture(scope="module")
def saved():
    """An atlas of the lm over a short corpus (a '</script>' in it), as its to_dict()."""
    a = atlas(qkv.load("lm"), "baka bela dima fona gisa doma feta </script> " * 8, retrieval_samples=2)
    return json.loads(json.dumps(a.to_dict()))


def check_points_and_a_click(page, d: dict) -> None:
    """The points sit where the chosen metrics put them; a click lists the head's contexts."""
    assert page.locator("circle.head").count() == len(d["heads"]) == 4
    xs = [float(c.get_attribute("cx")) for c in page.locator("circle.head").all()]
    best = max(range(4), key=lambda i: d["heads"][i]["previous-token"])
    assert xs[best] == max(xs)  # x: previous-token, the default
    page.select_option("#x", "entropy")
    xs = [float(c.get_attribute("cx")) for c in page.locator("circle.head").all()]
    assert xs.index(max(xs)) == max(range(4), key=lambda i: d["heads"][i]["entropy"])
    assert page.locator("#x-label").text_content().startswith("entropy (")
    page.select_option("#y", "sink")
    ys = [float(c.get_attribute("cy")) for c in page.locator("circle.head").all()]  # up is larger
    assert ys.index(min(ys)) == max(range(4), key=lambda i: d["heads"][i]["sink"])

    page.locator("circle.head").nth(best).click()
    head = d["heads"][best]
    assert page.locator("#info h2").text_content() == f"L{head['layer']} H{head['head']}"
    items = page.locator("#contexts li")
    assert items.count() == len(head["contexts"]) == 3
    for k, c in enumerate(head["contexts"]):
        li = items.nth(k)
        assert li.get_attribute("data-query") == str(c["query"]) and li.get_attribute("data-key") == str(c["key"])
        shown = li.text_content()
        assert shown.startswith(f"…{c['text']} → {c['key_text']} weight {c['weight']:.4f}, {c['distance']} back")
    assert page.locator(f'circle.head[data-layer="{head["layer"]}"][data-head="{head["head"]}"]').get_attribute("r") == "8"


def test_the_html_file(watched, saved, tmp_path):
    path = tmp_path / "atlas.html"
    path.write_text(atlas_page(saved), encoding="utf-8")
    page = watched.page
    page.goto(path.as_uri())
    page.wait_for_function(READY)
    # the atlas, its contexts' keys labelled for display (qkv.models.tokenizer.display_text)
    assert json.loads(page.locator("#qkv-data").text_content()) == saved_labelled(copy.deepcopy(saved))
    assert page.locator("#open-label").is_hidden()  # no server to send another file to
    check_points_and_a_click(page, saved)


def test_a_saved_atlas_in_the_viewer(watched, served, saved, tmp_path):
    path = tmp_path / "atlas.json"
    path.write_text(json.dumps(saved), encoding="utf-8")
    page = watched.page
    page.goto(served.url + "atlas")
    page.wait_for_function(READY)
    page.set_input_files("#file", str(path))
    page.wait_for_function(READY)
    assert any(r.endswith("/api/atlas") for r in watched.requests)
    check_points_and_a_click(page, saved)

    # a file that is not an atlas: the server's one line in the status, the page in "error"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**saved, "tokens": -5}), encoding="utf-8")
    page.set_input_files("#file", str(bad))
    page.wait_for_function("() => document.body.dataset.state === 'error'")
    assert page.locator("#status").text_content() == "body: atlas: tokens must be a whole number ≥ 1, got -5"
    refused = [e for e in watched.errors if "status of 422" in e]  # the browser logs the refusal itself
    assert len(refused) == 1 and refused == watched.errors, watched.errors
    watched.errors.clear()


def crowded() -> dict:
    """An atlas of 4 layers × 4 heads whose layer 0 sits at one point (issue 41: their labels
    overlapped at the origin) and whose other heads are spread; one context's key a newline."""
    heads = []
    for layer in range(4):
        for head in range(4):
            v = 0.0 if layer == 0 else 0.1 * layer + 0.02 * head
            heads.append({"layer": layer, "head": head, "induction": v, "previous-token": v / 2, "retrieval": v,
                          "sink": 1 - v, "distance": 40 * v, "entropy": 3 * v,
                          "contexts": [{"query": 9, "key": 8, "weight": 0.5, "distance": 1, "text": "a b", "key_text": "\n"}]})
    return {"kind": "atlas", "model": "m", "tokens": 100, "window": 50, "windows": 2, "first": 1,
            "metrics": ["induction", "previous-token", "retrieval", "sink", "distance", "entropy"],
            "retrieval_chance": 0.01, "heads": heads}


def test_labels_do_not_overlap_and_the_axes_have_ticks(watched, tmp_path):
    path = tmp_path / "atlas.html"
    path.write_text(atlas_page(crowded()), encoding="utf-8")
    page = watched.page
    page.goto(path.as_uri())
    page.wait_for_function(READY)
    for x, y in (("previous-token", "induction"), ("entropy", "sink"), ("distance", "retrieval")):
        page.select_option("#x", x)
        page.select_option("#y", y)
        boxes = [b for b in (t.bounding_box() for t in page.locator("#plot text.head-label").all()) if b]
        assert len(boxes) >= 12, len(boxes)  # most heads named; the crowded rest on hover (<title>)
        for i, a in enumerate(boxes):
            for b in boxes[i + 1:]:
                overlap = (min(a["x"] + a["width"], b["x"] + b["width"]) - max(a["x"], b["x"]),
                           min(a["y"] + a["height"], b["y"] + b["height"]) - max(a["y"], b["y"]))
                assert min(overlap) <= 0.5, (a, b)
        assert page.locator("circle.head title").count() == 16  # every head named on hover
        assert page.locator("#plot text.x-tick").count() >= 3 and page.locator("#plot text.y-tick").count() >= 3
    assert page.locator("#x-label").text_content() == "distance (mean distance looked back, tokens)"
    assert page.locator("#y-label").text_content() == "retrieval (share of a needle copied)"
    assert [t.text_content() for t in page.locator("#plot text.x-tick").all()][:2] == ["0", "5"]  # 0 … 14.4 in steps of 5
    # a context's key that is a newline shows as ↵ (display_text), not as an empty <strong>
    assert page.locator("#contexts li strong").first.text_content() == "↵"


def test_the_empty_viewer_page_says_what_to_do(watched, served):
    page = watched.page
    page.goto(served.url + "atlas")
    page.wait_for_function(READY)
    assert page.locator("#empty").is_visible()
    assert "qkv atlas --model reader --file CORPUS.txt --json > atlas.json" in page.locator("#empty").text_content()
    for hidden in ("#x-label-wrap", "#y-label-wrap", "#plot-section", "#info"):
        assert page.locator(hidden).is_hidden(), hidden
    assert page.locator("#open-label").is_visible()


def _post(served, name: str, content: bytes, kind: str = "application/json") -> httpx.Response:
    return httpx.post(served.url + "api/" + name, content=content, headers={"Content-Type": kind})


def test_the_server_answers_the_atlas_it_was_sent(served, saved):
    r = _post(served, "atlas", json.dumps(saved).encode())
    assert r.status_code == 200 and r.json() == saved_labelled(copy.deepcopy(saved))
    assert Atlas.from_dict(r.json()).to_dict() == saved


def drop(d: dict, key: str) -> dict:
    return {k: v for k, v in d.items() if k != key}


BAD = [  # (change to the saved atlas, status, message)
    (lambda d: b"{not json", 400, "the body is not valid JSON"),
    (lambda d: b"[1, 2]", 400, "the body must be a JSON object"),
    (lambda d: {**d, "kind": "needle-map"}, 422, "this is not a saved atlas: its kind is 'needle-map'"),
    (lambda d: drop(d, "model"), 422, "atlas: model is missing"),
    (lambda d: {**d, "window": True}, 422, "atlas: window must be a whole number ≥ 1, got True"),
    (lambda d: {**d, "metrics": ["sink"]}, 422, "atlas: metrics must be induction, previous-token"),
    (lambda d: {**d, "heads": d["heads"][:3]}, 422, "atlas: heads must list every head of 2 layers × 2 heads; "
                                                    "layer 1 head 1 is missing"),
    (lambda d: {**d, "heads": [d["heads"][0]] * 4}, 422, "atlas heads[1]: layer 0 head 0 is listed twice"),
    (lambda d: {**d, "heads": [{**d["heads"][0], "sink": "NaN"}, *d["heads"][1:]]}, 422,
     "atlas layer 0 head 0: sink must be a finite number, got 'NaN'"),
    (lambda d: {**d, "heads": [{**d["heads"][0], "contexts": [{**d["heads"][0]["contexts"][0], "distance": 99}]},
                               *d["heads"][1:]]}, 422, "atlas layer 0 head 0 contexts[0]: distance must be query − key"),
    (lambda d: {**d, "retrieval_chance": 2}, 422, "atlas: retrieval_chance must be a finite number in 0 … 1, got 2"),
]


@pytest.mark.parametrize("change, status, message", BAD)
def test_a_bad_saved_atlas_is_one_line_4xx(served, saved, change, status, message):
    body = change(saved)
    r = _post(served, "atlas", body if isinstance(body, bytes) else json.dumps(body).encode())
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["field"] == "body" and error["message"].startswith(message), error
    assert "\n" not in error["message"] and "Traceback" not in error["message"]


def test_the_saved_limits(served, saved):
    assert _post(served, "atlas", json.dumps(saved).encode(), kind="text/plain").status_code == 415
    r = _post(served, "atlas", b" " * (MAX_SAVED_BYTES + 1))  # refused from its Content-Length
    assert r.status_code == 413 and str(MAX_SAVED_BYTES) in r.json()["error"]["message"]
    # the same-origin rule of every API request holds here too
    r = httpx.post(served.url + "api/atlas", content=json.dumps(saved).encode(),
                   headers={"Content-Type": "application/json", "Origin": "http://evil.example"})
    assert r.status_code == 403
    assert httpx.get(served.url + "atlas").status_code == 200
