"""``qkv atlas --html``: the page draws every head as a point by the two metrics chosen, and a
click lists that head's contexts — from the embedded to_dict(), nothing computed (a real browser)."""

from __future__ import annotations

import json

import qkv
from qkv.explain.probes.atlas import atlas
from qkv.view.atlas_page import atlas_page


def test_points_axes_and_a_click(watched, tmp_path):
    a = atlas(qkv.load("lm"), "baka bela dima fona gisa doma feta </script> " * 8, retrieval_samples=2)
    d = a.to_dict()
    path = tmp_path / "atlas.html"
    path.write_text(atlas_page(d), encoding="utf-8")
    page = watched.page
    page.goto(path.as_uri())
    assert page.locator("circle.head").count() == 4
    assert json.loads(page.locator("#atlas").text_content()) == json.loads(json.dumps(d))
    # the points sit where the chosen metrics put them: the previous-token head furthest right
    xs = [float(c.get_attribute("cx")) for c in page.locator("circle.head").all()]
    best = max(range(4), key=lambda i: d["heads"][i]["previous-token"])
    assert xs[best] == max(xs)
    page.select_option("#x", "entropy")
    xs = [float(c.get_attribute("cx")) for c in page.locator("circle.head").all()]
    assert xs.index(max(xs)) == max(range(4), key=lambda i: d["heads"][i]["entropy"])
    page.locator("circle.head").nth(best).click()
    head = d["heads"][best]
    assert page.locator("#info h2").text_content() == f"L{head['layer']} H{head['head']}"
    assert page.locator("#info li").count() == len(head["contexts"]) == 3
